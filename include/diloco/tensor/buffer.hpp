// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

#include "diloco/core/memory_space.hpp"
#include "diloco/tensor/tensor_traits.hpp"

namespace diloco {

/// An owning, zero-initialized, fixed-size array in a memory space: the
/// library's own state (global parameters, momentum, communication buffers).
/// Sized once at construction; the steady state allocates nothing.
template <class T, class Space>
class buffer;

/// Host buffers are 64-byte aligned so the fused passes vectorize with
/// aligned loads.
template <class T>
class buffer<T, host_space> {
 public:
  static constexpr std::size_t alignment = 64;  ///< bytes; every host buffer starts at a multiple of it

  buffer() = default;
  /// n zero-initialized elements (no allocation when n is 0).
  explicit buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    data_.reset(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{alignment})));
    std::memset(static_cast<void*>(data_.get()), 0, n * sizeof(T));
  }

  ///@{
  /// The elements (null when empty), their count, element i, and a view of them all.
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_.get()[i]; }
  const T& operator[](std::size_t i) const { return data_.get()[i]; }
  tensor_view<T, host_space> view() { return {data_.get(), size_}; }
  tensor_view<const T, host_space> view() const { return {data_.get(), size_}; }
  ///@}

 private:
  struct deleter {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{alignment}); }
  };
  std::unique_ptr<T, deleter> data_;
  std::size_t size_ = 0;
};

/// The host specialization of buffer.
template <class T>
using host_buffer = buffer<T, host_space>;

}  // namespace diloco
