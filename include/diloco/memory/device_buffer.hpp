// SPDX-License-Identifier: Apache-2.0
#pragma once

// Owning device memory and pinned host memory. Plain host code over the CUDA
// runtime (target diloco::cuda); nvcc is not needed.

#include <cstddef>
#include <cuda_runtime_api.h>
#include <utility>

#include "diloco/core/memory_space.hpp"
#include "diloco/core/cuda_error.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// Device buffers come from cudaMalloc (256-byte aligned, so 16-byte vector
/// accesses work at every offset that is a multiple of 4 floats) and are
/// zero-filled before the constructor returns.
template <class T>
class buffer<T, device_space> {
 public:
  buffer() = default;
  /// n zero-filled elements in device memory (no allocation when n is 0); throws cuda_error when
  /// cudaMalloc fails.
  explicit buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    void* p = nullptr;
    detail::cuda_check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc", " (", n * sizeof(T), " bytes for a buffer of ",
                       n, " elements)");
    data_ = static_cast<T*>(p);
    // Complete the fill before returning: the buffer may be used next on a
    // stream that does not wait for the legacy default stream.
    try {
      detail::cuda_check(cudaMemset(p, 0, n * sizeof(T)), "cudaMemset");
      detail::cuda_check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize", " (after zero-filling a buffer)");
    } catch (...) {
      release();
      throw;
    }
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ///@{
  /// Moves take the memory; the source is left empty.
  buffer(buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ///@}
  ~buffer() { release(); }

  ///@{
  /// The elements (a device pointer; null when empty), their count, and a view of them all.
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  tensor_view<T, device_space> view() { return {data_, size_}; }
  tensor_view<const T, device_space> view() const { return {data_, size_}; }
  ///@}

 private:
  /// cudaFree synchronizes the device, so no kernel still uses the memory.
  /// Its status is ignored: a destructor cannot throw, and a failing device
  /// has already reported through the calls that used the buffer.
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The device specialization of buffer.
template <class T>
using device_buffer = buffer<T, device_space>;

/// Page-locked host memory (cudaMallocHost), zero-filled: the staging area
/// for device data that travels through a host communicator. Copies between
/// it and the device run at full PCIe/NVLink speed and are truly
/// asynchronous.
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  /// n zero-filled elements of pinned host memory (no allocation when n is 0); throws cuda_error
  /// when cudaMallocHost fails.
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    void* p = nullptr;
    detail::cuda_check(cudaMallocHost(&p, n * sizeof(T)), "cudaMallocHost", " (", n * sizeof(T),
                       " bytes of pinned host memory)");
    data_ = static_cast<T*>(p);
    for (std::size_t i = 0; i < n; ++i) data_[i] = T{};
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ///@{
  /// Moves take the memory; the source is left empty.
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ///@}
  ~pinned_buffer() { release(); }

  ///@{
  /// The elements (null when empty), their count, and element i.
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  ///@}

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace diloco
