// SPDX-License-Identifier: Apache-2.0
#pragma once

// Before each collective the ranks of comm::mpi compare what they are about
// to do: which collective, the buffer size, the root or reduction, and
// whether every rank's arguments were valid. MPI itself would hang, corrupt
// memory or abort on such mismatches; one tiny all-reduce lets every rank
// throw the same verdict instead, before any data moves.

#include <mpi.h>

#include <cstdint>
#include <limits>
#include <string>

#include "diloco/comm/detail/mpi_call.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm::detail_mpi {

enum class collective : std::int64_t { all_reduce = 1, broadcast_fp32, broadcast_bytes, all_to_all, all_gather, barrier };

inline const char* name(collective c) {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::broadcast_fp32: return "broadcast (fp32)";
    case collective::broadcast_bytes: return "broadcast (bytes)";
    case collective::all_to_all: return "all_to_all";
    case collective::all_gather: return "all_gather";
    case collective::barrier: return "barrier";
  }
  return "an unknown collective";
}

// MPI never pairs a blocking collective with a non-blocking one (they would
// wait for each other forever), so the two forms count as different calls.
// With a timeout every call is issued non-blocking, so a rank with a timeout
// and one without would not pair up either: that counts as different too.
inline std::int64_t code(collective c, bool nonblocking, bool timed) {
  return 4 * static_cast<std::int64_t>(c) + 2 * static_cast<std::int64_t>(timed) + nonblocking;
}
// The timeout is named only when the two codes differ in it.
inline std::string name_of_code(std::int64_t code, bool name_timeout) {
  return diloco::detail::concat(code % 2 ? "non-blocking " : "", name(static_cast<collective>(code / 4)),
                                !name_timeout ? "" : (code / 2) % 2 ? " with a timeout" : " without a timeout");
}

// What one rank is about to call. `count` is in elements (bytes for byte
// operations; the per-rank send size for exchanges); `arg` is the root of a
// broadcast or the reduce_op of an all-reduce, 0 otherwise.
struct call {
  collective op;
  bool nonblocking;
  std::uint64_t count;
  std::int64_t arg;
  bool timed = false;  // the rank has a timeout (set by comm::mpi)
};

// Collective over `comm`: every rank passes its call and `local_problem`, a
// description of what is wrong with its own arguments (empty when they are
// fine; without the "diloco: " prefix). Throws on every rank if the calls differ or any rank's arguments are
// invalid: config_error on a rank whose own arguments are invalid,
// comm_error on the others. No rank has started the operation then, so the
// communicator stays usable.
//
// The check itself is an MPI_Iallreduce, whatever the timeout, so that ranks
// with and without one still pair up here; it is completed by `complete(n,
// requests, mpi_call, operation)`, which waits (against the timeout, if any)
// and throws if the wait fails or is late.
template <class Complete>
void agree(MPI_Comm comm, int rank, const call& mine, const std::string& local_problem, Complete&& complete) {
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  const std::int64_t op = code(mine.op, mine.nonblocking, mine.timed);
  const auto count = static_cast<std::int64_t>(mine.count);
  // The minimum of v and of -v gives min and max in one MPI_MIN reduction.
  std::int64_t v[7] = {op, count, mine.arg, -op, -count, -mine.arg, local_problem.empty() ? none : rank};
  const char* what = name(mine.op);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, v, 7, MPI_INT64_T, MPI_MIN, comm, &request), "MPI_Iallreduce (argument check)",
        what, rank);
  complete(1, &request, "MPI_Iallreduce (argument check)", what);
  const std::int64_t min_op = v[0], max_op = -v[3], min_count = v[1], max_count = -v[4], min_arg = v[2],
                     max_arg = -v[5], first_invalid = v[6];

  if (!local_problem.empty()) diloco::detail::raise<config_error>(local_problem);
  if (first_invalid != none)
    diloco::detail::raise<comm_error>("mpi ", what, " on rank ", rank, ": rank ", first_invalid,
                                      " passed invalid arguments (it reports a config_error); no rank ran the "
                                      "operation");
  if (min_op != max_op) {
    const bool timeouts_differ = (min_op / 2) % 2 != (max_op / 2) % 2;
    diloco::detail::raise<comm_error>("mpi ", what, " on rank ", rank, ": ranks called different collectives (",
                                      name_of_code(min_op, timeouts_differ), " and ",
                                      name_of_code(max_op, timeouts_differ),
                                      "); every rank must call the same collective in the same order",
                                      timeouts_differ ? " and set comm::mpi's timeout on every rank or on none" : "");
  }
  if (min_count != max_count)
    diloco::detail::raise<comm_error>("mpi ", what, " on rank ", rank,
                                      ": buffer sizes differ across ranks (smallest ", min_count, ", largest ",
                                      max_count, ", this rank ", count, " ",
                                      mine.op == collective::all_reduce || mine.op == collective::broadcast_fp32
                                          ? "elements"
                                          : "bytes",
                                      "); every rank must pass the same size; no rank ran the operation");
  if (min_arg != max_arg) {
    if (mine.op == collective::all_reduce)
      diloco::detail::raise<comm_error>("mpi ", what, " on rank ", rank,
                                        ": ranks disagree on the reduction (both sum and mean were asked for, this "
                                        "rank asked for ",
                                        to_string(static_cast<reduce_op>(mine.arg)), "); no rank ran the operation");
    diloco::detail::raise<comm_error>("mpi ", what, " on rank ", rank, ": ranks disagree on the root (smallest ",
                                      min_arg, ", largest ", max_arg, ", this rank ", mine.arg,
                                      "); no rank ran the operation");
  }
}

}  // namespace diloco::comm::detail_mpi
