// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"
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

/// The naive delayed outer step, the baseline of the eager-updates paper
/// (Kale, Douillard, Donchev 2025, arXiv 2502.12996, "1-outer-step
/// overlapping" without the eager correction): round r's reduction begins at
/// the end of round r and is applied at the end of round r+1, and every
/// replica then restarts from θ_g, which holds the mean only up to the
/// previous round: each worker's own last phase is not in its replica until
/// the round after. At the end of round r+1, with s the point round r+1
/// started from (θ_g before this application):
///   wait for mean Δ̄^(r);  θ_g ← Outer(θ_g, Δ̄^(r));
///   Δ^(r+1) = s − θ_local;  begin reducing Δ^(r+1);
///   θ_local ← θ_g;  s ← θ_g.
/// Round 1 only begins. finish() applies the round in flight and the
/// replica becomes θ_g. Compared with one_step_delay (which re-bases the
/// replica on θ_g and keeps its own phase) it loses a phase of progress per
/// round; docs/algorithms.md section 4 sets the three delayed schedules side
/// by side.
struct delayed : whole_model_schedule<schedule_kind::delayed, true> {
  /// The schedule's name in messages, checkpoint headers and reports.
  static constexpr const char* name = "delayed";

  /// The merge of an application at a phase end: the replica keeps its
  /// values until this phase's pseudo-gradient has been taken from them
  /// (after_begin then restarts it from θ_g).
  struct keep : kernels::merge::base {
    static constexpr bool is_overwrite = false;  ///< true only for overwrite
    /// The same merge for a pass over the elements from `off` on (nothing to move).
    DILOCO_HD keep shifted(std::size_t) const { return *this; }
    /// The replica's value, unchanged.
    DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t, float, float l) const { return l; }
  };

  /// One worker's schedule (sync/runtime.hpp): `start`, θ_g as this phase
  /// began.
  template <class Space, class Outer>
  struct runtime : phase_start_runtime<Space> {
    using phase_start_runtime<Space>::start;  // s: θ_g when the phase started
    using phase_start_runtime<Space>::reset;

    /// No options to keep.
    explicit runtime(const options&) {}
    /// Applies the previous phase's round and begins this one's at a phase end.
    template <class E>
    bool after_step(E& e) {
      return delayed_after_step(e, *this);
    }
    /// Nothing to apply: the phase's reduction begins from s as it is.
    template <class E>
    void idle_phase_end(E&) {}
    /// The pseudo-gradient is s − θ_local.
    template <class E>
    const float* reference(E&) const {
      return start.data();
    }
    /// Its inputs taken: the replica and s restart from θ_g.
    template <class E>
    void after_begin(E& e, std::size_t) {
      e.replica_from_global();
      reset(e);
    }
    /// At a phase end the replica waits for after_begin (keep); drained
    /// (finish()) it becomes θ_g.
    template <class E, class Run>
    void apply(E&, std::size_t, bool draining, Run&& run) {
      if (draining)
        run(kernels::merge::overwrite{});
      else
        run(keep{});
    }
    /// Drained: the next phase starts at θ_g.
    template <class E>
    void after_apply(E& e, bool draining) {
      if (draining) reset(e);
    }
  };
};

}  // namespace diloco::sync
