// SPDX-License-Identifier: Apache-2.0
#pragma once

// A schedule at run time. Each schedule S names a runtime,
// `S::runtime<Space, Outer>`, that the engine holds for one worker: it owns
// the schedule's state (anchors, its own slots) and makes the schedule's
// decisions through the hooks below. The engine keeps the layout (theta_global,
// the outer state, the fragments and their reducers), begins, polls and
// completes reductions, and asks the runtime for the rest; it never tells
// schedules apart by name.
//
// Hooks (E is the engine; every hook has a default in runtime_base):
//   on_group(e)          the group's size is known or changed (eager: its lr)
//   init(e)              theta_global was just taken from the replica
//   after_step(e)        after each inner step: begin, apply, poll; returns
//                        whether a reduction was applied
//   reference(e)         where the pseudo-gradient is taken from (default
//                        theta_global)
//   after_begin(e, p)    fragment p's reduction has begun (its inputs are read)
//   apply(e, p, draining, run)
//                        the merge fragment p's outer step reaches the replica
//                        with: calls run(merge) once (kernels/merge.hpp);
//                        `draining` when finish() applies it
//   after_apply(e, draining)  the fragment's outer step count has moved on
//   visit_state(e, v)    the schedule's state under "schedule."
//   reset(e)             the replica restarted from theta_global (a refused
//                        round, a re-formed group): the state follows it
//   after_abort(e)       reductions in flight were dropped (elastic)
//   after_phase_recovery(e)  a delayed schedule's phase end was recovered
//
// What a runtime may call on the engine (engine.hpp, "What a schedule
// drives"): the clock (position, inner_steps, steps_in_round, rounds), the
// plan and fragments (plan, fragment_count, fragment_in_flight, in_flight,
// fragment_base), the flat state (flat_size, global, outer_slots,
// outer_state, outer_steps, workers, exec, copy_replica_to,
// replica_from_global), the reductions (begin, complete, poll_in_flight,
// run_outer_round) and membership (elastic, recoveries,
// membership_before_round, membership_after_round, survive_in_round and
// survive_at_phase_end: a body of reductions whose failure re-forms an
// elastic group, begin_elastic), outer_options and warn.

#include <cstdint>

#include "diloco/core/state.hpp"

namespace diloco::sync {

/// The hooks every schedule's runtime has, doing nothing; a runtime derives
/// from it and hides the ones its schedule needs.
struct runtime_base {
  /// The group's size is known or changed.
  template <class E>
  void on_group(E&) {}
  /// theta_global was just taken from the replica: the schedule's buffers follow.
  template <class E>
  void init(E&) {}
  /// Where fragment reductions take the pseudo-gradient from: theta_global.
  template <class E>
  const float* reference(E& e) const {
    return e.global();
  }
  /// Fragment p's reduction has begun.
  template <class E>
  void after_begin(E&, std::size_t) {}
  /// A fragment's outer step count has moved on after its apply.
  template <class E>
  void after_apply(E&, bool) {}
  /// No state of its own.
  template <class E>
  void visit_state(E&, state_visitor&) {}
  /// The replica restarted from theta_global.
  template <class E>
  void reset(E&) {}
  /// Reductions in flight were dropped.
  template <class E>
  void after_abort(E&) {}
  /// A phase end was recovered after a failed collective.
  template <class E>
  void after_phase_recovery(E&) {}
};

}  // namespace diloco::sync
