// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <ranges>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// Where a tensor may start in the library's flat buffers, in bytes. On the
/// device every tensor starts on a 64-byte boundary, so the fused kernels can
/// use 16-byte vector accesses at every tensor; on the host tensors are
/// packed (unaligned vector loads cost the CPU nothing).
template <class Space>
inline constexpr std::size_t flat_alignment_bytes = std::is_same_v<Space, device_space> ? 64 : 1;

/// A model's parameters: many tensors of different sizes, addressed as one
/// flat index space. Tensor k occupies [offset(k), offset(k) + size(k)) of
/// every flat buffer the library keeps per parameter (global copy, optimizer
/// state, communication buffer), so one offset table serves them all.
///
/// In device space offsets (and the total) are rounded up to a multiple of
/// `alignment()` elements. The gaps are padding: zero in every buffer (they
/// are zero-filled and no pass writes outside a tensor's range), so they add
/// 0 - 0 to the pseudo-gradient and nothing to any norm. `elements()` counts
/// the parameters, `total()` the flat length including padding.
template <class T, class Space>
class parameter_set {
 public:
  using view_type = tensor_view<T, Space>;  ///< how a tensor of the set is viewed

  parameter_set() = default;

  /// Offsets are multiples of this many elements.
  static constexpr std::size_t alignment() {
    return flat_alignment_bytes<Space> > sizeof(T) ? flat_alignment_bytes<Space> / sizeof(T) : 1;
  }

  /// Views every tensor of a range of tensors, in order (the tensors must outlive the set).
  template <class R>
  explicit parameter_set(R&& tensors) {
    for (auto&& t : tensors) add(t);
  }

  /// Number of tensors.
  std::size_t count() const { return views_.size(); }
  /// Length of a flat buffer over the set: the elements plus any padding.
  std::size_t total() const { return total_; }
  /// Number of parameters (the tensors' sizes added up).
  std::size_t elements() const { return elements_; }
  /// Where tensor k starts in a flat buffer over the set (a multiple of alignment()).
  std::size_t offset(std::size_t k) const { return offsets_[k]; }
  /// Tensor k's shape (tensor_traits' rows and cols; a vector is n x 1).
  const tensor_shape& shape(std::size_t k) const { return shapes_[k]; }
  ///@{
  /// Tensor k's view, and the views in order.
  const view_type& operator[](std::size_t k) const { return views_[k]; }
  auto begin() const { return views_.begin(); }
  auto end() const { return views_.end(); }
  ///@}

  /// Replaces the views, keeping capacity: per-step gradient lists reuse it
  /// without allocating.
  template <class R>
  void assign(R&& tensors) {
    views_.clear();
    offsets_.clear();
    shapes_.clear();
    total_ = elements_ = 0;
    for (auto&& t : tensors) add(t);
  }

  /// Checks that `other` has the same tensor count and sizes; `what` names
  /// the other list in the message.
  template <class U, class S>
  void require_same_shape(const parameter_set<U, S>& other, const char* what) const {
    if (other.count() != count())
      detail::raise<config_error>(what, ": got ", other.count(), " tensors, expected ", count(),
                                  " (one per parameter tensor)");
    for (std::size_t k = 0; k < count(); ++k)
      if (other[k].size() != views_[k].size())
        detail::raise<config_error>(what, ": tensor ", k, " has ", other[k].size(), " elements, parameter tensor ", k,
                                    " has ", views_[k].size());
  }

 private:
  template <class Tensor>
  void add(Tensor& t) {
    auto* p = tensor_data(t);
    const std::size_t n = tensor_size(t);
    if (p == nullptr && n != 0) detail::raise<config_error>("tensor ", views_.size(), " has ", n, " elements but a null data pointer");
    const tensor_shape s = tensor_shape_of(t);
    if (s.rows * s.cols != n)
      detail::raise<config_error>("tensor ", views_.size(), " says it is ", s.rows, " x ", s.cols, " but has ", n,
                                  " elements (tensor_traits rows * cols must equal size)");
    shapes_.push_back(s);
    views_.emplace_back(p, n);
    offsets_.push_back(total_);
    elements_ += n;
    total_ = round_up(total_ + n);
  }

  static constexpr std::size_t round_up(std::size_t n) { return (n + alignment() - 1) / alignment() * alignment(); }

  std::vector<view_type> views_;
  std::vector<std::size_t> offsets_;
  std::vector<tensor_shape> shapes_;
  std::size_t total_ = 0;
  std::size_t elements_ = 0;
};

}  // namespace diloco
