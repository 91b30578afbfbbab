// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "diloco/core/error.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/periodic.hpp"

namespace diloco::sync {

/// Streaming DiLoCo (Douillard et al. 2025, arXiv
/// 2501.18512), as torchft's streaming DiLoCo runs it with sync_every = H/P,
/// fragment_sync_delay = tau and fragment_update_alpha = alpha. The model is
/// split into P fragments of whole tensors that are reduced at staggered
/// steps (fragment_plan), each reduction overlapping tau inner steps, and the
/// replica's fragment becomes alpha·local + (1 − alpha)·global. Each fragment
/// keeps its own outer step count. P = 1, tau = 0, alpha = 0 is
/// sync::blocking, bit for bit.
struct streaming {
  /// The schedule's numbers (agreed across ranks).
  struct options {
    std::size_t fragments = 1;  ///< P
    std::size_t delay = 0;      ///< tau: inner steps the exchange overlaps
    float alpha = 0.0f;         ///< weight of the local value in the merge
    fragment_assignment assignment = fragment_assignment::contiguous;  ///< how tensors are split into the P fragments
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("fragments", o.fragments);
      f("delay", o.delay);
      f("alpha", o.alpha);
      f("assignment", o.assignment);
    }
  };
  static constexpr const char* name = "streaming";  ///< the schedule's name in messages, checkpoint headers and reports
  static constexpr bool overlaps = true;  ///< a reduction stays in flight for `delay` inner steps
  static constexpr schedule_kind kind = schedule_kind::periodic;  ///< fragments reduced at fixed steps of each round

  /// Throws config_error unless alpha is in [0, 1], 1 <= P <= min(H, tensor count) and
  /// 0 <= tau <= floor(H/P) - 1.
  static void validate(const options& o, std::size_t H, std::size_t tensors) {
    if (!(o.alpha >= 0.0f && o.alpha <= 1.0f))
      detail::raise<config_error>("sync::streaming: alpha must be in [0, 1], got ", o.alpha);
    if (o.assignment != fragment_assignment::contiguous && o.assignment != fragment_assignment::strided)
      detail::raise<config_error>("sync::streaming: assignment must be contiguous or strided, got ",
                                  static_cast<int>(o.assignment));
    const std::size_t pmax = H < tensors ? H : tensors;
    if (o.fragments < 1 || o.fragments > pmax)
      detail::raise<config_error>("sync::streaming: fragments (P) must be in [1, min(H, tensor count)] = [1, ", pmax,
                                  "] (H = ", H, ", ", tensors, " tensors), got ", o.fragments);
    if (o.delay > H / o.fragments - 1)
      detail::raise<config_error>("sync::streaming: delay (tau) must be in [0, floor(H/P) - 1] = [0, ",
                                  H / o.fragments - 1, "] (H = ", H, ", P = ", o.fragments, "), got ", o.delay);
  }
  /// The P fragments and the steps at which each is begun and applied (fragment_plan::make).
  static fragment_plan plan(const options& o, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, o.fragments, o.delay, o.assignment, sizes, "sync::streaming");
  }

  /// One worker's schedule: the periodic runtime with alpha's merge (sync/periodic.hpp).
  template <class Space, class Outer>
  using runtime = periodic_runtime<options>;
};

}  // namespace diloco::sync
