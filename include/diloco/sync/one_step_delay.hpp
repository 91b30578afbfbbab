#pragma once

// sync::one_step_delay (DiLoCoX, arXiv 2506.21263; torchft's semi-async
// DiLoCo): round r's reduction begins at the end of round r and is applied
// at the end of round r+1, so a whole inner phase hides the exchange. At the
// end of round r+1, with s the point round r+1 started from:
//   Δ^(r+1) = s − θ_local;  wait for mean Δ̄^(r);  θ_g ← Outer(θ_g, Δ̄^(r));
//   θ_local ← θ_g − Δ^(r+1) (re-base: keep this round's own progress);
//   s ← θ_local;  begin reducing Δ^(r+1).
// Round 1 only begins. θ_g and the outer state are identical on every rank.

#include <cstddef>
#include <span>

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"

namespace diloco::sync {

struct one_step_delay {
  struct options {};
  static constexpr const char* name = "one_step_delay";
  static constexpr bool overlaps = true;
  static constexpr schedule_kind kind = schedule_kind::delayed;

  static void validate(const options&, std::size_t, std::size_t) {}
  static fragment_plan plan(const options&, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, 1, 0, fragment_assignment::contiguous, sizes, name);
  }
};

}  // namespace diloco::sync
