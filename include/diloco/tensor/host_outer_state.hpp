// SPDX-License-Identifier: Apache-2.0
#pragma once

// Outer state in host memory (issue 41 item 4; docs/internals.md, "Outer
// state in host memory"): the replica lives on the GPU, and theta_global,
// the outer optimizer's state and any error-feedback residual live in
// pinned host memory, as INTELLECT-1 keeps them. The algorithm runs a host
// engine over a host mirror S of the replica; the mirror follows the device
// tensors T the way a low-precision replica's does (tensor/low_precision.hpp):
//
//   read   (the first pass of a call that touches the replica: a round)
//          fp32: S <- T, copied device to host;
//          bf16/fp16: T copied to pinned host staging, then the element
//          rule of tensor/low_precision.hpp (S keeps the last write's
//          rounding error where T did not move) by its host loops;
//   write  (after the engine wrote S: a merge, a reset, a restore)
//          fp32: T <- S, copied host to device;
//          bf16/fp16: T <- RNE(S) into the staging, then copied over.
//
// So the device holds nothing per parameter beyond the model and the user's
// optimizer; a round moves the replica over PCIe once each way (4 bytes a
// parameter, 2 for bf16). Only wrapper mode (inner::external) takes it: the
// library's own inner optimizers step the engine's memory. The copies are
// whole-replica and blocking for now (not yet chunked and overlapped with the
// host passes).
//
// Usage: `diloco::algorithm<inner::external, ...> t(diloco::outer_state_on_host(device_tensors), comm, opts);`
// where device_tensors is a range of device tensors (or one), in an nvcc
// translation unit that includes <diloco/cuda.hpp>.

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/core/memory_space.hpp"
#include "diloco/exec/executor_for.hpp"
#include "diloco/tensor/low_precision.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// A device replica whose outer state the algorithm keeps in host memory:
/// wrap the tensors (a range of device tensors, or one) in it when
/// constructing the algorithm.
template <class R>
struct outer_state_on_host {
  R tensors;  ///< the device tensors (a reference when an lvalue was wrapped)
};
/// Wraps an lvalue by reference, an rvalue (a view, a span) by value.
template <class R>
outer_state_on_host(R&&) -> outer_state_on_host<R>;

namespace detail {

/// The host mirror of a device replica of element type T (float, bfloat16
/// or float16), its copies on `stream`. (Space is always device_space: a
/// parameter, so the executor is looked up only where the class is used, in
/// nvcc translation units.)
template <class T, class Space = device_space>
class host_outer_mirror final : public replica_mirror {
  using executor = typename executor_for<Space>::type;
  template <class U>
  using pinned = typename executor::template staging_buffer<U>;
  static constexpr bool low = is_low_precision_v<T>;
  // bf16/fp16: the staging's host passes run tensor/low_precision.hpp's
  // loops over its pieces.
  static constexpr std::size_t piece = mirror_host_pieces<T>::piece;

 public:
  /// S = float(T), copied from the device.
  host_outer_mirror(std::vector<tensor_view<T, Space>> replica, void* stream)
      : replica_(std::move(replica)), exec_(make_executor<executor>(stream)) {
    std::size_t total = 0;
    for (const auto& t : replica_) total += t.size();
    mirror_ = pinned<float>(total);
    if constexpr (low) staging_ = pinned<T>(total);
    std::size_t at = 0;
    for (const auto& t : replica_) {
      views_.emplace_back(mirror_.data() + at, t.size());
      offsets_.push_back(at);
      at += t.size();
    }
    for (std::size_t k = 0; k < replica_.size(); ++k) {
      if constexpr (low) {
        T* stage = staging_.data() + offsets_[k];
        exec_.to_host(stage, replica_[k].data(), replica_[k].size());
        const widen_replica<T> widen{stage, views_[k].data()};
        for (std::size_t i = 0; i < replica_[k].size(); ++i) widen(i);
      } else {
        exec_.to_host(views_[k].data(), replica_[k].data(), replica_[k].size());
      }
    }
  }

  /// The host mirror's tensors, for the host engine.
  const std::vector<tensor_view<float, host_space>>& views() const { return views_; }

  void pull() override {
    for (std::size_t k = 0; k < replica_.size(); ++k) {
      const std::size_t n = replica_[k].size();
      if constexpr (low) {
        T* stage = staging_.data() + offsets_[k];
        exec_.to_host(stage, replica_[k].data(), n);
        for (std::size_t b = 0; b < n; b += piece) mirror_host_loops<T>::read_any(stage, views_[k].data(), b, std::min(n, b + piece));
      } else {
        exec_.to_host(views_[k].data(), replica_[k].data(), n);
      }
    }
  }

  void push() override {
    for (std::size_t k = 0; k < replica_.size(); ++k) {
      const std::size_t n = replica_[k].size();
      if constexpr (low) {
        T* stage = staging_.data() + offsets_[k];
        std::size_t infinite = 0;
        for (std::size_t b = 0; b < n; b += piece)
          infinite += mirror_host_loops<T>::write_any(views_[k].data(), stage, b, std::min(n, b + piece));
        exec_.from_host(replica_[k].data(), stage, n);
        // As low_precision_mirror_on: the replica is written, then an
        // overflow raises.
        if (infinite > 0)
          low_precision_ops<T>::raise_if_overflowed(k, views_[k].data(), n);
      } else {
        exec_.from_host(replica_[k].data(), views_[k].data(), n);
      }
    }
  }

 private:
  std::vector<tensor_view<T, Space>> replica_;
  executor exec_;
  pinned<float> mirror_;
  pinned<T> staging_;  // bf16/fp16 only: the replica's codes on the host
  std::vector<tensor_view<float, host_space>> views_;
  std::vector<std::size_t> offsets_;
};

}  // namespace detail
}  // namespace diloco
