// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/kernels/merge.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/runtime.hpp"
#include "diloco/sync/whole_model.hpp"

namespace diloco::sync {

/// DiLoCo's round (Douillard et al. 2023, Algorithm 1). After
/// every H inner steps the whole model's pseudo-gradient is reduced, the
/// outer step applied and every replica overwritten with theta_global, all
/// before the next inner step. The default schedule.
struct blocking : whole_model_schedule<schedule_kind::periodic, false> {
  static constexpr const char* name = "blocking";  ///< the schedule's name in messages, checkpoint headers and reports

  /// One worker's schedule (sync/runtime.hpp): no state; the round runs
  /// after every H-th inner step.
  template <class Space, class Outer>
  struct runtime : runtime_base {
    /// No options to keep.
    explicit runtime(const options&) {}
    /// The whole model's round once H inner steps were taken; whether it was applied.
    template <class E>
    bool after_step(E& e) {
      if (e.steps_in_round() < e.inner_steps()) return false;
      const auto rounds = e.rounds();
      e.run_outer_round();
      return e.rounds() != rounds;
    }
    /// Every replica becomes theta_global.
    template <class E, class Run>
    void apply(E&, std::size_t, bool, Run&& run) {
      run(kernels::merge::overwrite{});
    }
  };
};

}  // namespace diloco::sync
