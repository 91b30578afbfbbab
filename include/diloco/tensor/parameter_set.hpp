#pragma once

#include <cstddef>
#include <ranges>
#include <utility>
#include <vector>

#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/tensor/tensor_traits.hpp"

namespace diloco {

// A model's parameters: many tensors of different sizes, addressed as one
// flat index space. Tensor k occupies [offset(k), offset(k) + size(k)) of
// every flat buffer the library keeps per parameter (global copy, optimizer
// state, communication buffer), so one offset table serves them all.
template <class T, class Space>
class parameter_set {
 public:
  using view_type = tensor_view<T, Space>;

  parameter_set() = default;

  template <class R>
  explicit parameter_set(R&& tensors) {
    for (auto&& t : tensors) add(t);
  }

  std::size_t count() const { return views_.size(); }
  std::size_t total() const { return offsets_.back(); }
  std::size_t offset(std::size_t k) const { return offsets_[k]; }
  const view_type& operator[](std::size_t k) const { return views_[k]; }
  auto begin() const { return views_.begin(); }
  auto end() const { return views_.end(); }

  // Replaces the views, keeping capacity: per-step gradient lists reuse it
  // without allocating.
  template <class R>
  void assign(R&& tensors) {
    views_.clear();
    offsets_.assign(1, 0);
    for (auto&& t : tensors) add(t);
  }

  // Checks that `other` has the same tensor count and sizes; `what` names
  // the other list in the message.
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
    views_.emplace_back(p, n);
    offsets_.push_back(offsets_.back() + n);
  }

  std::vector<view_type> views_;
  std::vector<std::size_t> offsets_ = {0};
};

}  // namespace diloco
