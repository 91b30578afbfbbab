// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "diloco/core/error.hpp"
#include "diloco/core/state.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/kernels/tensor_passes.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/phase_end.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/runtime.hpp"
#include "diloco/sync/whole_model.hpp"
#include "diloco/memory/buffer.hpp"

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
///
/// Its outer learning rate. Each worker's fresh share weighs 1/M in its own
/// step, so as M grows eager slides from blocking DiLoCo towards the naive
/// delayed step, whose stable outer lr is far lower: on f(θ) = θ²/2 with
/// outer Nesterov 0.9 the largest stable lr is 1.36 at M = 1, 0.77 at M = 2,
/// 0.42 at M = 4 and 0.32 at M = 8 (eager_lr_bound; docs/algorithms.md
/// section 4 derives it). So an outer lr left unset defaults to
/// min(the outer optimizer's default lr, eager_lr_safety × eager_lr_bound(M))
/// for the group's current M, and follows M when an elastic group re-forms.
/// Unset means: options::outer_lr is 0 and the outer optimizer's lr is still
/// its default (0.7 for outer::nesterov, 1 for outer::sgd; a float cannot
/// say whether it was written, so an lr written equal to the default counts
/// as unset: set options::outer_lr to run at exactly that value). An lr that
/// is set is honoured; above the bound it is reported through the event hook
/// (event_kind::warning) once per group size. Outer optimizers that are not
/// SGD-like (no momentum/dampening/nesterov options) have no bound: their lr
/// is used as given.
struct eager : whole_model_schedule<schedule_kind::delayed, true> {
  static constexpr const char* name = "eager";  ///< the schedule's name in messages, checkpoint headers and reports

  /// The schedule's numbers (agreed across ranks).
  struct options {
    /// The outer lr this schedule runs with (θ_g's step and each worker's),
    /// in place of the outer optimizer's lr; 0: not set (see sync::eager).
    float outer_lr = 0.0f;
    /// w, the weight of the worker's fresh pseudo-gradient in its own step,
    /// which takes its stale share out at the same weight: the step is along
    /// Δ̄^(r) − w·Δ_m^(r) + w·Δ_m^(r+1). 0: 1/M, the paper's (the fresh share
    /// in place of the stale one in the mean), following M in an elastic
    /// group. At w = 1 the worker's step is blocking DiLoCo's along its own
    /// progress plus the others' stale mean; its stable lr is blocking's
    /// (eager_lr_bound). Whatever w, each worker's progress enters its
    /// replica with weight 1/M in all (w at once, 1/M − w a round later),
    /// and θ_g is the same function of the pseudo-gradients; the replicas
    /// drift apart more as w grows (docs/algorithms.md section 4).
    float fresh_weight = 0.0f;
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("outer_lr", o.outer_lr);
      f("fresh_weight", o.fresh_weight);
    }
  };

  /// Throws config_error unless outer_lr is finite and >= 0 and
  /// fresh_weight is in [0, 1].
  static void validate(const options& o, std::size_t, std::size_t) {
    if (!(o.outer_lr >= 0.0f) || !std::isfinite(o.outer_lr))
      ::diloco::detail::raise<config_error>("sync::eager: outer_lr must be finite and >= 0 (0: the stable default for the "
                                  "group's size), got ",
                                  o.outer_lr);
    if (!(o.fresh_weight >= 0.0f && o.fresh_weight <= 1.0f))
      ::diloco::detail::raise<config_error>("sync::eager: fresh_weight must be in [0, 1] (0: 1/M, the paper's), got ",
                                            o.fresh_weight);
  }
  /// The weight w of the fresh pseudo-gradient at M workers: fresh_weight, or 1/M where it is 0.
  static float fresh_weight_for(const options& o, std::size_t workers) {
    return o.fresh_weight > 0.0f ? o.fresh_weight : 1.0f / static_cast<float>(workers < 1 ? 1 : workers);
  }
  /// One fragment holding every tensor, applied after every H-th step.
  static fragment_plan plan(const options&, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, 1, 0, fragment_assignment::contiguous, sizes, "a whole-model schedule");
  }

  /// One worker's schedule (sync/runtime.hpp, defined below).
  template <class Space, class Outer>
  struct runtime;
};

/// The outer step as eager_lr_bound reads it: SGD's momentum, dampening and
/// Nesterov flag (weight decay is left out: DiLoCo's outer step has none).
struct outer_momentum {
  double momentum = 0.0;   ///< μ
  double dampening = 0.0;  ///< τ (0 under Nesterov)
  bool nesterov = false;   ///< Nesterov's look-ahead
};

/// The default outer lr is this fraction of eager_lr_bound. On the quadratic
/// with Nesterov 0.9 the round's spectral radius is flat below the bound
/// (0.90 to 0.98 from 0.3 to 0.8 of it, set by the momentum), so 0.8 keeps
/// slow directions (k < 1) fast while staying 20 % inside the bound
/// (docs/algorithms.md section 4; scripts/eager_stability.py).
inline constexpr double eager_lr_safety = 0.8;

namespace detail_eager {

/// Whether every root of z³ + c2·z² + c1·z + c0 lies strictly inside the
/// unit circle (Jury's conditions for a real cubic).
inline bool schur_stable_cubic(double c2, double c1, double c0) {
  const double at_one = 1.0 + c2 + c1 + c0;
  const double at_minus_one = -1.0 + c2 - c1 + c0;
  return at_one > 0.0 && at_minus_one < 0.0 && std::abs(c0) < 1.0 && std::abs(c1 - c0 * c2) < 1.0 - c0 * c0;
}

/// Whether eager's round on θ²/2 is stable at a = η·k with w = 1/M: the
/// round's characteristic polynomial (docs/algorithms.md section 4)
///   z(z − 1)(z − μ) + a·(w·z + 1 − w)·(n1·z + n0),
/// n1 = 1 + μ, n0 = −μ under Nesterov; n1 = 1 − τ, n0 = 0 for heavy ball.
inline bool eager_round_stable(double a, double w, const outer_momentum& o) {
  const double mu = o.momentum;
  const double n1 = o.nesterov ? 1.0 + mu : 1.0 - o.dampening;
  const double n0 = o.nesterov ? -mu : 0.0;
  return schur_stable_cubic(-(1.0 + mu) + a * w * n1, mu + a * (w * n0 + (1.0 - w) * n1), a * (1.0 - w) * n0);
}

}  // namespace detail_eager

/// The largest outer lr η for which eager's round on f(θ) = θ²/2 is stable
/// when each inner phase reaches the optimum (k = 1 − (1 − γ)^H = 1, the
/// worst case of a contracting inner phase: the bound on η is this / k), with
/// M workers: the first η > 0 at which a root of the round's characteristic
/// polynomial leaves the unit circle (a scan in steps of 1/1024, then
/// bisection). 1.357 at M = 1 (2(1 + μ)/(1 + 2μ), blocking DiLoCo), 0.770
/// at M = 2, 0.416 at M = 4, 0.320 at M = 8 for Nesterov 0.9; infinity when
/// no lr up to 64 is unstable.
///
/// The fresh weight w enters the round's polynomial alone: `fresh_weight` >
/// 0 gives the bound at that w (sync::eager::options::fresh_weight; w = 1 is
/// blocking DiLoCo's bound whatever M); 0 gives w = 1/M.
inline double eager_lr_bound(std::size_t workers, const outer_momentum& o, double fresh_weight = 0.0) {
  const double w = fresh_weight > 0.0 ? fresh_weight : 1.0 / static_cast<double>(workers < 1 ? 1 : workers);
  constexpr double step = 1.0 / 1024.0, top = 64.0;
  double lo = 0.0;
  for (double a = step; a <= top; a += step) {
    if (detail_eager::eager_round_stable(a, w, o)) {
      lo = a;
      continue;
    }
    double hi = a;
    for (int i = 0; i < 60; ++i) {
      const double mid = 0.5 * (lo + hi);
      (detail_eager::eager_round_stable(mid, w, o) ? lo : hi) = mid;
    }
    return lo;
  }
  return std::numeric_limits<double>::infinity();
}

/// The outer step of an outer optimizer's options, when it is SGD-like
/// (outer::nesterov through as_sgd, outer::sgd and inner::sgd through their
/// fields); nullopt for any other (no bound is known).
template <class Outer>
std::optional<outer_momentum> outer_momentum_of(const typename Outer::options& o) {
  if constexpr (requires { Outer::as_sgd(o); }) {
    const auto v = Outer::as_sgd(o);
    return outer_momentum{v.momentum, v.dampening, v.nesterov};
  } else if constexpr (requires {
                         o.momentum;
                         o.dampening;
                         o.nesterov;
                       }) {
    return outer_momentum{o.momentum, o.dampening, o.nesterov};
  } else {
    return std::nullopt;
  }
}

/// The outer lr sync::eager runs with at M workers, and why.
struct eager_outer_lr {
  float lr = 0.0f;       ///< the lr both outer steps take
  double bound = 0.0;    ///< eager_lr_bound(M) (infinity where none is known)
  bool automatic = false;  ///< true: the default for M; false: the lr set by the user
};

/// The outer lr of sync::eager at M workers (see sync::eager): options::outer_lr
/// when set, else the outer optimizer's lr when it is not its default, else
/// min(default, eager_lr_safety × eager_lr_bound(M, the fresh weight)).
template <class Outer>
eager_outer_lr resolve_eager_outer_lr(const eager::options& so, const typename Outer::options& oo,
                                      std::size_t workers) {
  const std::optional<outer_momentum> shape = outer_momentum_of<Outer>(oo);
  const double bound =
      shape ? eager_lr_bound(workers, *shape, so.fresh_weight) : std::numeric_limits<double>::infinity();
  const float preset = typename Outer::options{}.lr;
  if (so.outer_lr > 0.0f) return {so.outer_lr, bound, false};
  if (oo.lr != preset || !shape) return {oo.lr, bound, false};
  const double safe = eager_lr_safety * bound;
  return {safe < static_cast<double>(preset) ? static_cast<float>(safe) : preset, bound, true};
}

/// One worker's eager schedule: the anchor (own + where the phase began),
/// `own` (its pseudo-gradient inside the mean in flight), its own outer
/// state and step count, and the outer lr for the group's size.
template <class Space, class Outer>
struct eager::runtime : runtime_base {
  buffer<float, Space> anchor;  ///< "schedule.anchor"
  buffer<float, Space> own;     ///< "schedule.own"
  buffer<float, Space> slots;   ///< "schedule.eager_slots": this worker's outer state
  std::uint64_t steps = 0;      ///< "schedule.eager_steps": this worker's outer step count
  eager::options opts;  ///< the schedule's options (outer_lr)
  int lr_world = -1;                               ///< the group size the outer lr was resolved for
  std::optional<typename Outer::options> user_outer;  ///< the outer options as the user gave them

  /// Keeps the options (outer_lr).
  explicit runtime(const eager::options& o) : opts(o) {}

  /// The outer lr for the group's size now (the default follows M; a set lr
  /// above the stability bound is honoured and reported each time the group
  /// size changes). Both outer steps read the engine's outer options. An
  /// outer policy without an lr option keeps its options.
  template <class E>
  void on_group(E& e) {
    if constexpr (requires(typename Outer::options& o) { o.lr = 1.0f; }) {
      auto& outer = e.outer_options();
      if (!user_outer) user_outer = outer;
      const int world = e.workers();
      if (world < 1 || lr_world == world) return;  // a joiner before it joined has no group yet
      lr_world = world;
      const auto M = static_cast<std::size_t>(world);
      const auto r = resolve_eager_outer_lr<Outer>(opts, *user_outer, M);
      outer.lr = r.lr;
      if (r.automatic || !(static_cast<double>(r.lr) > r.bound)) return;
      e.warn([&] {
        typename Outer::options unset = *user_outer;
        unset.lr = typename Outer::options{}.lr;
        const auto num = [](double v) {  // 0.7f as "0.7", not concat's "0.699999988"
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.6g", v);
          return std::string(buf);
        };
        return ::diloco::detail::concat(
            "sync::eager: outer lr ", num(r.lr), " is above the stability bound ", num(r.bound), " for ", world,
            " workers", opts.fresh_weight > 0.0f ? " at fresh weight " + num(opts.fresh_weight) : std::string(),
            " (the largest stable lr on f = theta^2/2 with this outer momentum, "
            "docs/algorithms.md section 4); it runs as set and may diverge. Unset, the lr would be ",
            num(resolve_eager_outer_lr<Outer>({.fresh_weight = opts.fresh_weight}, unset, M).lr));
      });
    }
  }
  /// The anchor starts at theta_global with nothing owed.
  template <class E>
  void init(E& e) {
    anchor = buffer<float, Space>(e.flat_size());
    e.copy_replica_to(anchor.data());
    own = buffer<float, Space>(e.flat_size());
    slots = buffer<float, Space>(e.flat_size() * e.outer_slots());
  }
  /// The pseudo-gradient is taken from the anchor.
  template <class E>
  const float* reference(E&) const {
    return anchor.data();
  }
  /// Applies the previous phase's round and begins this one's at a phase end.
  template <class E>
  bool after_step(E& e) {
    return delayed_after_step(e, *this);
  }
  /// Nothing in flight: the worker still takes its eager step, along fresh/M alone.
  template <class E>
  void idle_phase_end(E& e) {
    e.access_replica();
    const auto m = merge(e);
    e.exec().for_each_chunked(e.replica().chunks(), kernels::eager_advances<decltype(m.step)>{m, e.replica().ptrs()});
    e.replica_written();
    ++steps;
  }
  /// The worker's eager step (kernels::merge::eager); drained (finish()):
  /// the replica re-joins theta_global keeping its phase's progress.
  template <class E, class Run>
  void apply(E& e, std::size_t p, bool draining, Run&& run) {
    const std::size_t base = e.fragment_base(p);
    if (draining) {
      run(kernels::merge::eager_rejoin{{}, anchor.data() + base, own.data() + base});
    } else {
      run(merge(e));
      ++steps;
    }
  }
  /// Drained: the worker's outer state becomes the shared one again.
  template <class E>
  void after_apply(E& e, bool draining) {
    if (draining) rejoin(e);
  }
  /// "schedule.anchor", "schedule.own", "schedule.eager_slots", "schedule.eager_steps".
  template <class E>
  void visit_state(E& e, state_visitor& v) {
    v.buffer("schedule.anchor", anchor.data(), anchor.size(), E::device);
    v.buffer("schedule.own", own.data(), own.size(), E::device);
    if (e.outer_slots()) v.buffer("schedule.eager_slots", slots.data(), slots.size(), E::device);
    v.scalar("schedule.eager_steps", steps);
  }
  /// The replica restarted from theta_global: so does the phase, owing
  /// nothing, with the shared outer state.
  template <class E>
  void reset(E& e) {
    e.exec().for_each(e.flat_size(), kernels::copy{e.global(), anchor.data()});
    e.exec().for_each(e.flat_size(), kernels::fill{own.data(), 0.0f});
    rejoin(e);
  }
  /// The replica was stepped with the worker's own outer state: it restarts
  /// from theta_global.
  template <class E>
  void after_abort(E& e) {
    e.reset_replica();
  }

 private:
  // The worker's eager step: its own outer state and count.
  template <class E>
  auto merge(E& e) {
    using step_type = decltype(Outer::make_update(e.outer_options(), 1));
    return kernels::merge::eager<step_type>{{},
                                            Outer::make_update(e.outer_options(), steps + 1),
                                            anchor.data(),
                                            own.data(),
                                            e.outer_slots() ? slots.data() : nullptr,
                                            e.flat_size(),
                                            eager::fresh_weight_for(opts, static_cast<std::size_t>(e.workers()))};
  }
  // After a drained or refused round: the worker's outer state becomes the
  // shared one again.
  template <class E>
  void rejoin(E& e) {
    if (e.outer_slots())
      e.exec().for_each(e.flat_size() * e.outer_slots(), kernels::copy{e.outer_state(), slots.data()});
    steps = e.outer_steps(0);
  }
};

}  // namespace diloco::sync
