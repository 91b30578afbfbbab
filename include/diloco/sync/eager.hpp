#pragma once

// sync::eager: eager updates (Kale, Douillard, Donchev 2025, arXiv
// 2502.12996). θ_g and the outer state follow sync::one_step_delay and stay
// identical on every rank. The replica is not re-based: at the end of round
// r+1 it becomes one outer step from θ_g (before this round's update, with
// the outer state before it, on a scratch copy) along the eager gradient
//   Δ̄^(r) − Δ_m^(r)/M + Δ_m^(r+1)/M,
// the worker's own stale term replaced by its fresh one (sync::eager merge,
// sync/merge.hpp). docs/algorithms.md compares this with the paper.

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/whole_model.hpp"

namespace diloco::sync {

struct eager : whole_model_schedule<schedule_kind::delayed, true> {
  static constexpr const char* name = "eager";
};

}  // namespace diloco::sync
