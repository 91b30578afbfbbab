// SPDX-License-Identifier: Apache-2.0
#pragma once

// Page-locked host buffers through which comm::mpi moves device memory when
// the MPI library cannot take device pointers. Grow-only and reused: after
// the first rounds no collective allocates. Several slots exist because
// several non-blocking operations may be in flight at once.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "diloco/core/error.hpp"

namespace diloco::comm::detail_mpi {

// Every CUDA call is checked; the message names the call, the diloco
// operation and the rank.
inline void check_cuda(cudaError_t code, const char* cuda_call, const char* operation, int rank) {
  if (code == cudaSuccess) return;
  diloco::detail::raise<comm_error>("mpi ", operation, " on rank ", rank, ": ", cuda_call, " failed: ",
                                    cudaGetErrorName(code), ": ", cudaGetErrorString(code));
}

class pinned_staging {
 public:
  pinned_staging() = default;
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    // At process exit the CUDA runtime may already be gone; nothing useful
    // can be done with an error here.
    for (auto& s : slots_)
      if (s.data) cudaFreeHost(s.data);
  }

  // A free slot of at least `bytes`, marked busy until release().
  int acquire(std::size_t bytes, const char* operation, int rank) {
    bytes = bytes < min_bytes ? min_bytes : bytes;
    int reuse = -1;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].busy) continue;
      if (slots_[i].capacity >= bytes) return take(static_cast<int>(i));
      if (reuse < 0) reuse = static_cast<int>(i);
    }
    if (reuse < 0) {
      slots_.push_back({});
      reuse = static_cast<int>(slots_.size() - 1);
    }
    auto& s = slots_[static_cast<std::size_t>(reuse)];
    if (s.data) {
      check_cuda(cudaFreeHost(s.data), "cudaFreeHost", operation, rank);
      s.data = nullptr;
      s.capacity = 0;
    }
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, bytes), "cudaMallocHost", operation, rank);
    s.data = static_cast<std::byte*>(p);
    s.capacity = bytes;
    return take(reuse);
  }

  std::byte* data(int slot) const { return slots_[static_cast<std::size_t>(slot)].data; }
  void release(int slot) { slots_[static_cast<std::size_t>(slot)].busy = false; }

 private:
  static constexpr std::size_t min_bytes = 256;
  struct entry {
    std::byte* data = nullptr;
    std::size_t capacity = 0;
    bool busy = false;
  };
  int take(int i) {
    slots_[static_cast<std::size_t>(i)].busy = true;
    return i;
  }
  std::vector<entry> slots_;
};

}  // namespace diloco::comm::detail_mpi
