// SPDX-License-Identifier: Apache-2.0
#pragma once

// CUDA runtime status codes as diloco errors. Plain host code: it needs the
// CUDA runtime (target diloco::cuda) but not nvcc, so host-compiled parts of
// the library (device buffers, communicators staging device memory) use it
// too.

#include <cuda_runtime_api.h>

#include "diloco/core/error.hpp"

namespace diloco {

/// A CUDA runtime call failed. `call` names it (the message does too); `code`
/// is the runtime's status.
class cuda_error : public error {
 public:
  /// The failure of `call` with status `code`; `message` says what diloco was doing.
  cuda_error(const std::string& message, const char* call, cudaError_t code)
      : error(message), call_(call), code_(code) {}
  /// The runtime call that failed.
  const char* call() const noexcept { return call_; }
  /// Its status.
  cudaError_t code() const noexcept { return code_; }

 private:
  const char* call_;
  cudaError_t code_;
};

namespace detail {

// Throws cuda_error for any status but cudaSuccess. `call` is the failing
// runtime call (or kernel) by name; `context` says what it was doing.
template <class... Context>
void cuda_check(cudaError_t status, const char* call, const Context&... context) {
  if (status == cudaSuccess) return;
  // A failed call leaves its status as the thread's last error; clear it so
  // the next launch check does not report this failure again.
  (void)cudaGetLastError();
  throw cuda_error(concat("diloco: ", call, " failed: ", cudaGetErrorString(status), " (", cudaGetErrorName(status),
                          ")", context...),
                   call, status);
}

}  // namespace detail

/// The number of CUDA devices this process can use; 0 when there is no
/// device, no driver, or the runtime cannot start (any error means no GPU).
inline int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace diloco
