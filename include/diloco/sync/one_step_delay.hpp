// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/core/state.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/phase_end.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/runtime.hpp"
#include "diloco/sync/whole_model.hpp"
#include "diloco/memory/buffer.hpp"

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

  /// One worker's schedule (sync/runtime.hpp): `start`, where its phase
  /// started (re-based with the replica at each application).
  template <class Space, class Outer>
  struct runtime : phase_start_runtime<Space> {
    using phase_start_runtime<Space>::start;

    /// No options to keep.
    explicit runtime(const options&) {}
    /// Applies the previous phase's round and begins this one's at a phase end.
    template <class E>
    bool after_step(E& e) {
      return delayed_after_step(e, *this);
    }
    /// Nothing to apply: the phase starts from the replica as it is.
    template <class E>
    void idle_phase_end(E& e) {
      e.copy_replica_to(start.data());
    }
    /// θ_local ← θ_g − (s − θ_local), s ← θ_local.
    template <class E, class Run>
    void apply(E& e, std::size_t p, bool, Run&& run) {
      run(kernels::merge::rebase{{}, start.data() + e.fragment_base(p)});
    }
    /// After a recovery at a phase end the phase starts here (its reduction
    /// includes the progress of the aborted one).
    template <class E>
    void after_phase_recovery(E& e) {
      e.copy_replica_to(start.data());
    }
  };
};

}  // namespace diloco::sync
