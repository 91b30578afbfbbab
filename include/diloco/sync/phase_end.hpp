// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the delayed schedules (one_step_delay, eager, delayed) share: their
// decisions after an inner step. At the end of each inner phase the
// reduction begun at the previous phase end is applied (the schedule's
// merge), then this phase's begins. A phase end with nothing in flight (the
// first, after finish() or a refused round) calls the runtime's
// idle_phase_end. Elastic: a failure while applying aborts the round and the
// group re-forms; the phase then starts again from here
// (after_phase_recovery) and its reduction begins once the group agrees.

#include <cstddef>

#include "diloco/core/state.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/sync/runtime.hpp"
#include "diloco/memory/buffer.hpp"

namespace diloco::sync {

/// The state one_step_delay and delayed keep: s, where the phase started
/// ("schedule.start"), taken from the replica at the start and following
/// theta_global when the replica restarts from it; and their decisions
/// after a step (delayed_after_step, below).
template <class Space>
struct phase_start_runtime : runtime_base {
  buffer<float, Space> start;  ///< s ("schedule.start")

  /// s starts at theta_global.
  template <class E>
  void init(E& e) {
    start = buffer<float, Space>(e.flat_size());
    e.copy_replica_to(start.data());
  }
  /// "schedule.start".
  template <class E>
  void visit_state(E&, state_visitor& v) {
    v.buffer("schedule.start", start.data(), start.size(), E::device);
  }
  /// s follows the replica to theta_global.
  template <class E>
  void reset(E& e) {
    e.exec().for_each(e.flat_size(), kernels::copy{e.global(), start.data()});
  }
};

/// A delayed schedule's runtime R after an inner step of engine E; whether a
/// reduction was applied.
template <class E, class R>
bool delayed_after_step(E& e, R& r) {
  e.poll_in_flight();
  if (e.position() % e.inner_steps() != 0) return false;
  bool applied = false;
  if (e.fragment_in_flight(0)) {
    if (!e.survive_at_phase_end([&] { e.complete(0); })) {
      r.after_phase_recovery(e);
      e.begin_elastic();
      return false;
    }
    applied = true;
  } else {
    r.idle_phase_end(e);
  }
  if (e.elastic()) {
    // Nothing in flight: leaves and joins happen here. After a recovery
    // the phase restarts from here.
    const auto recoveries = e.recoveries();
    e.membership_after_round();
    if (e.recoveries() != recoveries) r.after_phase_recovery(e);
    e.begin_elastic();
  } else {
    e.begin(0);
  }
  return applied;
}

}  // namespace diloco::sync
