// SPDX-License-Identifier: Apache-2.0
#pragma once

// How a finished outer step reaches the replica. The outer-apply and
// decode-apply passes compute, per element i of a fragment,
//   l' = merge.pre(update, i, g, mean, state, stride, l)   (before the update)
//   update(g, mean, state, stride);  global[i] = g;
//   local[i] = merge(i, g, l')                              (after it)
// so the copy-back costs no pass of its own. `g` is theta_global, `l` the
// replica's value, `mean` the averaged pseudo-gradient.

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels::merge {

/// Nothing to do before the update (every merge but eager's).
struct base {
  /// What the replica's element l becomes before the update: l itself.
  template <class Update>
  DILOCO_HD DILOCO_FORCEINLINE float pre(const Update&, std::size_t, float, float, const float*, std::size_t,
                                         float l) const {
    return l;
  }
};

/// theta_local <- theta_global (DiLoCo; the blocking schedule).
struct overwrite : base {
  /// True only for overwrite (its passes take 16-byte paths and never load the replica).
  static constexpr bool is_overwrite = true;
  /// The same merge for a pass over the elements from `off` on (nothing to move).
  DILOCO_HD overwrite shifted(std::size_t) const { return *this; }
  /// The replica's new value: g, the new theta_global.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t, float g, float) const { return g; }
};

/// theta_local <- alpha·theta_local + (1 − alpha)·theta_global (Streaming
/// DiLoCo's mixing factor; alpha = 0 is overwrite).
struct mix : base {
  static constexpr bool is_overwrite = false;  ///< true only for overwrite
  float alpha;  ///< weight of the local value
  /// The same merge for a pass over the elements from `off` on (nothing to move).
  DILOCO_HD mix shifted(std::size_t) const { return *this; }
  /// The replica's new value: alpha l + (1 − alpha) g.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t, float g, float l) const {
    return add_rn(mul_rn(alpha, l), mul_rn(sub_rn(1.0f, alpha), g));
  }
};

/// One-step delay: keep the progress made since this phase started at
/// `start` and replace the stale part by the new theta_global:
///   theta_local <- theta_global − (start − theta_local);  start <- theta_local.
struct rebase : base {
  static constexpr bool is_overwrite = false;  ///< true only for overwrite
  float* DILOCO_RESTRICT start;                ///< where this phase started, per element of the pass
  /// The same merge for a pass over the elements from `off` on: `start` moved by off.
  DILOCO_HD rebase shifted(std::size_t off) const { return {{}, start + off}; }
  /// The replica's new value g − (start − l); start takes it.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i, float g, float l) const {
    const float v = sub_rn(g, sub_rn(start[i], l));
    start[i] = v;
    return v;
  }
};

/// Eager updates (Kale, Douillard, Donchev 2025), the worker's side. Each
/// worker steps its own replica with its own outer state `slots` (and its own
/// step count, baked into `step`) along the eager gradient
///   mean − w·own + w·fresh     (w = 1/M in the paper; sync::eager's fresh_weight)
/// where `own` is this worker's pseudo-gradient inside `mean` (sent one phase
/// ago) and `fresh` = start − theta_local the progress of the phase just
/// ended, start = anchor − own being where that phase began. Summed over
/// rounds the corrections telescope: every worker's progress enters its
/// replica with weight 1/M in all (w early, 1/M − w a round later).
/// Afterwards own <- fresh (it travels next) and anchor <- theta_local +
/// fresh, so anchor − theta_local is what is sent and anchor − own is where
/// the next phase starts. theta_global and the shared outer state are
/// untouched here (the pass's own update does them); `advance` with mean = 0
/// is the step of a phase end with nothing in flight.
template <class Step>
struct eager : base {
  static constexpr bool is_overwrite = false;  ///< true only for overwrite
  Step step;                     ///< the worker's own outer step (its state and step count baked in)
  float* DILOCO_RESTRICT anchor;  ///< anchor: own + where the phase began
  float* DILOCO_RESTRICT own;    ///< own: this worker's pseudo-gradient inside the mean in flight
  float* DILOCO_RESTRICT slots;  ///< null when the outer optimizer keeps none
  std::size_t stride;            ///< between an element's slots
  float weight;                  ///< w: of fresh − own (1/M: the paper's)
  /// The same merge for a pass over the elements from `off` on: its buffers moved by off.
  DILOCO_HD eager shifted(std::size_t off) const {
    return {{}, step, anchor + off, own + off, slots ? slots + off : nullptr, stride, weight};
  }

  /// The eager step of element i from where its phase began, along mean − w·own + w·fresh;
  /// own and anchor move on. Returns the replica's new value.
  DILOCO_HD DILOCO_FORCEINLINE float advance(std::size_t i, float mean, float l) const {
    return advance_element(step, anchor[i], own[i], slots ? slots + i : nullptr, stride, weight, mean, l);
  }
  /// advance() on one element's values: its anchor `a` and own `o` (both
  /// updated), its slots at `slot` (null without) and the replica's value l.
  /// Loops that keep the element's values in locals call it directly
  /// (kernels::decode_apply).
  DILOCO_HD DILOCO_FORCEINLINE static float advance_element(const Step& st, float& a, float& o, float* slot,
                                                            std::size_t slot_stride, float w, float mean, float l) {
    const float stale = o;
    const float start = sub_rn(a, stale);
    const float fresh = sub_rn(start, l);
    float x = start;
    st(x, add_rn(mean, mul_rn(sub_rn(fresh, stale), w)), slot, slot_stride);
    o = fresh;
    a = add_rn(x, fresh);
    return x;
  }
  /// The eager step (advance), before the shared update.
  template <class Update>
  DILOCO_HD DILOCO_FORCEINLINE float pre(const Update&, std::size_t i, float, float mean, const float*, std::size_t,
                                         float l) const {
    return advance(i, mean, l);
  }
  /// The replica's value as advance() left it.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t, float, float l) const { return l; }
};

/// The eager step alone, over one tensor (a phase end with nothing in
/// flight: the mean is zero and so is `own`).
template <class Step>
struct eager_advance {
  eager<Step> merge;  ///< the eager merge, mean 0
  float* local;       ///< the replica's tensor
  /// Element i: the eager step with a zero mean.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const { local[i] = merge.advance(i, 0.0f, local[i]); }
};

/// Eager, when the reduction in flight is drained (finish()): the replica
/// re-joins theta_global keeping the progress made since its phase began,
/// like rebase; the phase now starts at theta_global with nothing owed
/// (anchor <- theta_global, own <- 0). The engine then copies the shared
/// outer state into the worker's.
struct eager_rejoin : base {
  static constexpr bool is_overwrite = false;  ///< true only for overwrite
  float* DILOCO_RESTRICT anchor;               ///< anchor, set to theta_global
  float* DILOCO_RESTRICT own;                  ///< own, zeroed
  /// The same merge for a pass over the elements from `off` on: its buffers moved by off.
  DILOCO_HD eager_rejoin shifted(std::size_t off) const { return {{}, anchor + off, own + off}; }
  /// The replica's new value g − ((anchor − own) − l), keeping the progress of its phase.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i, float g, float l) const {
    const float v = sub_rn(g, sub_rn(sub_rn(anchor[i], own[i]), l));
    anchor[i] = g;
    own[i] = 0.0f;
    return v;
  }
};

// Merges index their buffers by the element's position in the flat layout
// of the pass that runs them; `shifted(off)` moves them to a pass over the
// elements from `off` on.

/// The element step every apply pass runs (the scalar path: overwrite also
/// has 16-byte paths in the passes). Under overwrite `l` is only written, so
/// the caller's load of it is dead and the compiler drops it.
template <class Update, class Merge>
DILOCO_HD DILOCO_FORCEINLINE void apply_element(const Update& update, const Merge& merge, std::size_t i, float& g,
                                                float mean, float* state, std::size_t stride, float& l) {
  if constexpr (Merge::is_overwrite) {
    update(g, mean, state, stride);
    l = g;
  } else {
    const float lm = merge.pre(update, i, g, mean, state, stride, l);
    update(g, mean, state, stride);
    l = merge(i, g, lm);
  }
}

}  // namespace diloco::kernels::merge

DILOCO_EXACT_FP_END
