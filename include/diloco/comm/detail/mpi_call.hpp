// SPDX-License-Identifier: Apache-2.0
#pragma once

// Turning MPI return codes into exceptions, and splitting counts that do not
// fit MPI's `int` into calls that do.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "diloco/core/error.hpp"

namespace diloco::comm::detail_mpi {

// MPI's own description of an error code ("MPI_ERR_TRUNCATE: message
// truncated"), or the bare number if MPI cannot describe it.
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS || length <= 0)
    return diloco::detail::concat("MPI error code ", code);
  return std::string(text, static_cast<std::size_t>(length));
}

// The communicator's duplicate has MPI_ERRORS_RETURN, so failures come back
// as codes; this names the diloco operation, the MPI call and the rank (if
// known yet: rank < 0 while constructing).
inline void check(int code, const char* mpi_call, const char* operation, int rank) {
  if (code == MPI_SUCCESS) return;
  const std::string where = rank >= 0 ? diloco::detail::concat(" on rank ", rank) : std::string();
  diloco::detail::raise<comm_error>("mpi ", operation, where, ": ", mpi_call, " failed: ", mpi_error_text(code));
}

// Calls post(offset, count) for consecutive pieces of [0, n) of at most
// `max_count` elements. An empty range is still one call with count 0, so
// every rank issues the same number of MPI calls whatever it holds.
template <class Post>
void for_each_piece(std::size_t n, std::size_t max_count, Post&& post) {
  std::size_t offset = 0;
  do {
    const std::size_t count = std::min(max_count, n - offset);
    post(offset, static_cast<int>(count));
    offset += count;
  } while (offset < n);
}

// A committed datatype freed when it goes out of scope. MPI lets a datatype
// be freed while a non-blocking operation that uses it is still running.
class scoped_datatype {
 public:
  scoped_datatype() = default;
  scoped_datatype(const scoped_datatype&) = delete;
  scoped_datatype& operator=(const scoped_datatype&) = delete;
  ~scoped_datatype() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }

  // `count` bytes laid out with a stride of `stride` bytes between
  // consecutive elements of this type: one slice of each rank's block in an
  // exchange whose blocks are too large for one call.
  void make_strided_bytes(int count, std::size_t stride, const char* operation, int rank) {
    MPI_Datatype piece = MPI_DATATYPE_NULL;
    check(MPI_Type_contiguous(count, MPI_BYTE, &piece), "MPI_Type_contiguous", operation, rank);
    const int rc = MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(stride), &type_);
    MPI_Type_free(&piece);
    check(rc, "MPI_Type_create_resized", operation, rank);
    check(MPI_Type_commit(&type_), "MPI_Type_commit", operation, rank);
  }

  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

}  // namespace diloco::comm::detail_mpi
