// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/whole_model.hpp"

namespace diloco::sync {

/// Eager updates (Kale, Douillard, Donchev 2025, arXiv
/// 2502.12996). θ_g and the outer state follow sync::one_step_delay and stay
/// identical on every rank. The replica is not re-based: at the end of every
/// phase the worker takes its own outer step (its own outer state and step
/// count, part of the replica state) from where the phase started, along
///   Δ̄^(r) − Δ_m^(r)/M + Δ_m^(r+1)/M,
/// the worker's own stale term replaced by its fresh one (kernels::merge::
/// eager). Summed over rounds the corrections telescope, so each worker's
/// progress enters its replica exactly once. finish() and a refused round
/// re-join the replica and its outer state to the shared ones.
/// docs/algorithms.md section 4 compares this with the paper.
struct eager : whole_model_schedule<schedule_kind::delayed, true> {
  static constexpr const char* name = "eager";  ///< the schedule's name in messages, checkpoint headers and reports
};

}  // namespace diloco::sync
