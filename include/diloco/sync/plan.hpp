// SPDX-License-Identifier: Apache-2.0
#pragma once

// The fragments of a model and the steps at which each one's reduction
// begins and is applied: what every schedule hands the engine.
//
// Inner steps count from 1 and decisions are taken after step t. With H
// inner steps per round, P fragments and s_p = floor((p+1)·H/P), fragment p
// is applied after every step t ≡ s_p (mod H), first at t = s_p, and its
// reduction begins `delay` (τ) steps earlier, after step t − τ.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "diloco/core/error.hpp"

namespace diloco::sync {

/// How tensors are split into fragments.
///   contiguous: model order, cut where the running size first reaches
///               (p+1)/P of the total (each fragment keeps at least one tensor);
///   strided:    tensor i in fragment i mod P (the Streaming DiLoCo paper's
///               assignment of layers).
enum class fragment_assignment { contiguous, strided };

/// "contiguous" or "strided", for option listings.
inline const char* to_string(fragment_assignment a) {
  return a == fragment_assignment::contiguous ? "contiguous" : "strided";
}

/// The fragments of a model and the steps at which each one's reduction begins and is applied:
/// what every schedule hands the engine. Fragment p is applied after every step t ≡ s_p
/// (mod H), first at t = s_p, and its reduction begins τ steps earlier.
struct fragment_plan {
  std::size_t inner_steps = 1;                 ///< H
  std::size_t delay = 0;                       ///< τ
  std::vector<std::size_t> apply_step;         ///< s_p in [1, H]
  std::vector<std::vector<std::size_t>> tensors;  ///< model indices of each fragment, ascending

  /// P, the number of fragments.
  std::size_t fragments() const { return apply_step.size(); }

  /// Fragment p's reduction is applied after step t (t >= 1).
  bool applies_after(std::size_t p, std::uint64_t t) const {
    return t >= apply_step[p] && (t - apply_step[p]) % inner_steps == 0;
  }
  /// Fragment p's reduction begins after step t (t >= 1).
  bool begins_after(std::size_t p, std::uint64_t t) const {
    const std::uint64_t first = apply_step[p] - delay;  // >= 1 by validation
    return t >= first && (t - first) % inner_steps == 0;
  }

  /// The plan for P fragments over tensors of the given sizes. Validates
  /// 1 <= P <= min(H, tensor count) and 0 <= τ <= floor(H/P) - 1, the range
  /// in which at most one reduction is in flight at any time.
  static fragment_plan make(std::size_t H, std::size_t P, std::size_t delay, fragment_assignment assign,
                            std::span<const std::size_t> sizes, const char* who) {
    const std::size_t n = sizes.size();
    const std::size_t pmax = H < n ? H : n;
    if (P < 1 || P > pmax)
      detail::raise<config_error>(who, ": fragments (P) must be in [1, min(H, tensor count)] = [1, ", pmax,
                                  "] (H = ", H, ", ", n, " tensors), got ", P);
    if (delay > H / P - 1)
      detail::raise<config_error>(who, ": delay (tau) must be in [0, floor(H/P) - 1] = [0, ", H / P - 1, "] (H = ", H,
                                  ", P = ", P, "), got ", delay);
    fragment_plan plan;
    plan.inner_steps = H;
    plan.delay = delay;
    plan.tensors.assign(P, {});
    for (std::size_t p = 0; p < P; ++p) plan.apply_step.push_back((p + 1) * H / P);
    if (assign == fragment_assignment::strided) {
      for (std::size_t i = 0; i < n; ++i) plan.tensors[i % P].push_back(i);
      return plan;
    }
    std::uint64_t total = 0;
    for (std::size_t s : sizes) total += s;
    std::size_t next = 0;
    std::uint64_t running = 0;
    for (std::size_t p = 0; p < P; ++p) {
      // At least one tensor here, and at least one left for each later fragment.
      const std::size_t last_allowed = n - (P - 1 - p);  // exclusive end bound
      do {
        running += sizes[next];
        plan.tensors[p].push_back(next);
        ++next;
      } while (next < last_allowed && running * P < (p + 1) * total);
      if (p + 1 == P)
        while (next < n) plan.tensors[p].push_back(next++);
    }
    return plan;
  }
};

}  // namespace diloco::sync
