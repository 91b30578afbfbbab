// SPDX-License-Identifier: Apache-2.0
#pragma once

// nccl::from_mpi: an NCCL communicator over the processes of an MPI
// communicator. Rank 0 makes the ncclUniqueId and MPI_Bcasts it (with a
// validated record, so its failure reaches every rank as a comm_error).
// Needs the diloco::nccl and diloco::mpi targets.

#include "diloco/core/require_cxx20.hpp"

#include <mpi.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "diloco/comm/detail/nccl_unique_id.hpp"
#include "diloco/comm/nccl.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm {

namespace detail_nccl {

inline void check_mpi(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  diloco::detail::raise<comm_error>("nccl rank ", rank, ": ", call, " failed: ",
                                    length > 0 ? std::string_view(text, static_cast<std::size_t>(length))
                                               : std::string_view("unknown MPI error"));
}

// Rank 0 of `comm` calls make_id() and broadcasts its record; every rank
// returns the id, or throws comm_error carrying rank 0's failure.
template <class MakeId>
ncclUniqueId broadcast_unique_id(MPI_Comm comm, MakeId&& make_id) {
  int rank = -1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", rank);
  std::vector<char> buffer(record_capacity, '\0');
  if (rank == 0) {
    const std::vector<char> record = make_record(make_id);
    std::copy(record.begin(), record.end(), buffer.begin());
  }
  check_mpi(MPI_Bcast(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, 0, comm), "MPI_Bcast", rank);
  return decode_unique_id(buffer, "MPI_Bcast from rank 0");
}

template <>
inline constexpr bool mpi_header_included<MPI_Comm> = true;

template <>
struct mpi_bootstrap<MPI_Comm> {
  static nccl create(MPI_Comm comm, nccl_options opts) {
    int rank = -1, size = 0;
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", rank);
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size", rank);
    // Options are validated on every rank before the broadcast: the same
    // program passes the same options everywhere, so all ranks throw alike.
    nccl::validate(rank, size, opts);
    const ncclUniqueId id = broadcast_unique_id(comm, [] { return nccl::make_unique_id(); });
    return nccl(id, rank, size, std::move(opts));
  }
};

}  // namespace detail_nccl

/// This process's rank among the processes of `comm` on the same node: the
/// usual CUDA device for it (options.device = node_local_rank(comm) % devices).
inline int node_local_rank(MPI_Comm comm) {
  int rank = -1;
  detail_nccl::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", rank);
  MPI_Comm node = MPI_COMM_NULL;
  detail_nccl::check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
                         "MPI_Comm_split_type", rank);
  int local = -1;
  const int rc = MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  detail_nccl::check_mpi(rc, "MPI_Comm_rank", rank);
  return local;
}

}  // namespace diloco::comm
