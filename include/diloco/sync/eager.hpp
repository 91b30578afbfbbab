#pragma once

// sync::eager: eager updates (Kale, Douillard, Donchev 2025, arXiv
// 2502.12996). θ_g and the outer state follow sync::one_step_delay and stay
// identical on every rank. The replica is not re-based: at the end of round
// r+1 it becomes one outer step from θ_g (before this round's update, with
// the outer state before it, on a scratch copy) along the eager gradient
//   Δ̄^(r) − Δ_m^(r)/M + Δ_m^(r+1)/M,
// the worker's own stale term replaced by its fresh one (sync::eager merge,
// sync/merge.hpp). docs/algorithms.md compares this with the paper.

#include <cstddef>
#include <span>

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"

namespace diloco::sync {

struct eager {
  struct options {};
  static constexpr const char* name = "eager";
  static constexpr bool overlaps = true;
  static constexpr schedule_kind kind = schedule_kind::delayed;

  static void validate(const options&, std::size_t, std::size_t) {}
  static fragment_plan plan(const options&, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, 1, 0, fragment_assignment::contiguous, sizes, name);
  }
};

}  // namespace diloco::sync
