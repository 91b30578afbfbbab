// SPDX-License-Identifier: Apache-2.0
#pragma once

// The runtime of a periodic schedule (fragments begun and applied at fixed
// steps of each round, sync/plan.hpp), and which runtime a schedule runs
// with: its own `runtime<Space, Outer>` when it has one, else, for a
// periodic schedule, periodic_runtime (so a new periodic schedule is its
// options, validate and plan alone; docs/custom-policies.md has one).

#include <cstddef>
#include <type_traits>

#include "diloco/kernels/merge.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/runtime.hpp"

namespace diloco::sync {

/// A periodic schedule at run time: after each inner step, the fragments
/// whose reductions begin now begin, then those due are applied; the
/// replica's fragment takes θ_global, or alpha·local + (1 − alpha)·global
/// when the schedule's options have a float `alpha` (Streaming DiLoCo's
/// merge).
template <class Options>
struct periodic_runtime : runtime_base {
  float alpha = 0.0f;  ///< the merge's weight of the local value

  /// Takes alpha from the options when they have one.
  explicit periodic_runtime(const Options& o) {
    if constexpr (requires { static_cast<float>(o.alpha); }) alpha = static_cast<float>(o.alpha);
  }
  /// After an inner step: begins first (with tau = 0 a fragment begins and
  /// is applied after the same step; fragments never overlap otherwise, by
  /// validation), then applications. Elastic: the check before fragment 0
  /// begins (nothing is in flight then) and at each cycle's end once
  /// nothing is; a failure aborts what is in flight.
  template <class E>
  bool after_step(E& e) {
    e.poll_in_flight();
    const auto& plan = e.plan();
    const auto t = e.position();
    bool applied = false;
    const bool finished = e.survive_in_round([&] {
      for (std::size_t p = 0; p < e.fragment_count(); ++p)
        if (plan.begins_after(p, t)) {
          // A check that re-formed the group with members at different
          // points (some failed a step or a collective later than others)
          // leaves nothing in flight anywhere: fragment 0 sits this cycle
          // out on every member (its progress goes into the next one).
          if (p == 0 && e.elastic() && !e.in_flight() && !e.membership_before_round()) continue;
          e.begin(p);
        }
      for (std::size_t p = 0; p < e.fragment_count(); ++p)
        if (plan.applies_after(p, t) && e.fragment_in_flight(p)) {
          e.complete(p);
          applied = true;
        }
    });
    if (!finished) return applied;
    if (e.elastic() && t % e.inner_steps() == 0 && !e.in_flight()) e.membership_after_round();
    return applied;
  }
  /// The fragment becomes alpha·local + (1 − alpha)·global (overwrite at 0).
  template <class E, class Run>
  void apply(E&, std::size_t, bool, Run&& run) {
    if (alpha == 0.0f)
      run(kernels::merge::overwrite{});
    else
      run(kernels::merge::mix{{}, alpha});
  }
};

namespace detail_runtime {
template <class S, class Space, class Outer>
struct runtime_of {
  static_assert(S::kind == schedule_kind::periodic,
                "a delayed schedule (kind == schedule_kind::delayed) must define its own runtime<Space, Outer> "
                "(sync/runtime.hpp): what it applies at a phase end and how the replica follows");
  using type = periodic_runtime<typename S::options>;
};
template <class S, class Space, class Outer>
  requires requires { typename S::template runtime<Space, Outer>; }
struct runtime_of<S, Space, Outer> {
  using type = typename S::template runtime<Space, Outer>;
};
}  // namespace detail_runtime

/// The runtime schedule S runs with over memory space Space and outer optimizer Outer.
template <class S, class Space, class Outer>
using runtime_t = typename detail_runtime::runtime_of<S, Space, Outer>::type;

}  // namespace diloco::sync
