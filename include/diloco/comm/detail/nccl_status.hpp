// SPDX-License-Identifier: Apache-2.0
#pragma once

// CUDA and NCCL status codes turned into diloco exceptions, and a guard that
// makes the communicator's device current for the calls that depend on it.

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "diloco/core/error.hpp"

// ncclCommInitRankConfig with a non-blocking config (what lets a stuck
// initialization time out), ncclCommFinalize and ncclGetLastError arrived in
// NCCL 2.13/2.14; ncclAvg (the mean all-reduce) in 2.10.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0),
              "diloco::comm::nccl needs NCCL 2.14 or newer (non-blocking communicators, ncclCommFinalize, ncclAvg)");

namespace diloco::comm::detail_nccl {

inline std::string cuda_error_text(cudaError_t e) {
  return diloco::detail::concat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// A failed CUDA runtime call. The error is cleared from the runtime's
// last-error slot so it does not resurface in an unrelated later check.
[[noreturn]] inline void raise_cuda(cudaError_t e, const char* call, int rank) {
  (void)cudaGetLastError();
  diloco::detail::raise<error>("nccl rank ", rank, ": ", call, " failed: ", cuda_error_text(e));
}

inline void check_cuda(cudaError_t e, const char* call, int rank) {
  if (e != cudaSuccess) raise_cuda(e, call, rank);
}

// NCCL's own text for the code plus its last error message, which usually
// says which peer or transport failed.
inline std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string out = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') out += diloco::detail::concat(": ", last);
  return out;
}

// Makes `device` current for the lifetime of the guard and restores the
// caller's device afterwards: events, streams and communicator creation all
// act on the current device, and the caller's choice must survive our calls.
class device_guard {
 public:
  device_guard(int device, int rank) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", rank);
    if (previous_ != device) {
      check_cuda(cudaSetDevice(device), "cudaSetDevice", rank);
      switched_ = true;
    }
  }
  // For destructors: never throws; a failure leaves the current device as is.
  struct no_throw_t {};
  device_guard(int device, no_throw_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (previous_ != device) switched_ = cudaSetDevice(device) == cudaSuccess;
    (void)cudaGetLastError();
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace diloco::comm::detail_nccl
