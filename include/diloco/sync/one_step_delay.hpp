// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/whole_model.hpp"

namespace diloco::sync {

/// One-step delay (DiLoCoX, arXiv 2506.21263; torchft's semi-async
/// DiLoCo): round r's reduction begins at the end of round r and is applied
/// at the end of round r+1, so a whole inner phase hides the exchange. At the
/// end of round r+1, with s the point round r+1 started from:
///   Δ^(r+1) = s − θ_local;  wait for mean Δ̄^(r);  θ_g ← Outer(θ_g, Δ̄^(r));
///   θ_local ← θ_g − Δ^(r+1) (re-base: keep this round's own progress);
///   s ← θ_local;  begin reducing Δ^(r+1).
/// Round 1 only begins. θ_g and the outer state are identical on every rank.
struct one_step_delay : whole_model_schedule<schedule_kind::delayed, true> {
  /// The schedule's name in messages, checkpoint headers and reports.
  static constexpr const char* name = "one_step_delay";
};

}  // namespace diloco::sync
