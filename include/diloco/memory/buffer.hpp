// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "diloco/core/memory_space.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// An owning, zero-initialized, fixed-size array in a memory space: the
/// library's own state (global parameters, momentum, communication buffers).
/// Sized once at construction; the steady state allocates nothing.
template <class T, class Space>
class buffer;

/// Host buffers are 64-byte aligned so the fused passes vectorize with
/// aligned loads. Buffers of huge_page bytes or more are placed on whole
/// 2 MiB pages and advised as transparent huge pages (Linux,
/// MADV_HUGEPAGE) before they are first touched: on 4 KiB pages the time
/// of a pass over them depended on the process (where its pages happened
/// to land: 1.5 to 2x between two runs of the same program, see
/// docs/performance.md, "Page size and the outer round"); on huge pages it
/// is lower and steady. Placement only: the elements and the arithmetic
/// on them are the same.
template <class T>
class buffer<T, host_space> {
 public:
  static constexpr std::size_t alignment = 64;  ///< bytes; every host buffer starts at a multiple of it
  static constexpr std::size_t huge_page = std::size_t{2} << 20;  ///< bytes; larger buffers start at a multiple of it

  buffer() = default;
  /// n zero-initialized elements (no allocation when n is 0).
  explicit buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    // Whole huge pages, so the advice covers every byte and no small page is shared with other data.
    const bool huge = bytes >= huge_page;
    const std::size_t align = huge ? huge_page : alignment;
    const std::size_t reserved = huge ? (bytes + huge_page - 1) / huge_page * huge_page : bytes;
    data_ = std::unique_ptr<T, deleter>(static_cast<T*>(::operator new[](reserved, std::align_val_t{align})),
                                        deleter{align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Advice only: a kernel without transparent huge pages refuses it, and the buffer works on small pages.
    if (huge) (void)::madvise(static_cast<void*>(data_.get()), reserved, MADV_HUGEPAGE);
#endif
    std::memset(static_cast<void*>(data_.get()), 0, bytes);  // the first touch: after the advice
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
    std::size_t align = alignment;  // the alignment it was allocated with
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{align}); }
  };
  std::unique_ptr<T, deleter> data_;
  std::size_t size_ = 0;
};

/// The host specialization of buffer.
template <class T>
using host_buffer = buffer<T, host_space>;

}  // namespace diloco
