// SPDX-License-Identifier: Apache-2.0
#pragma once

// Eager's apply loop over a block of elements in a form compilers vectorize:
// apply_element over merge::eager (the worker's own outer step from where
// its phase began, then the shared step; kernels/merge.hpp) with both steps
// in their branch-free forms (kernels/sgd_update.hpp). The decode-apply pass
// (kernels/compressed_passes.hpp) runs it per codec block, the fp32 outer
// apply (kernels/outer_apply.hpp) per 256 elements of a range. Same
// operations per element, same bits, as the per-element loop.

#include <cstddef>
#include <type_traits>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/sgd_update.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Whether Merge and Update have eager_block's branch-free form: eager's
/// merge with torch-SGD outer steps.
template <class Merge, class Update>
inline constexpr bool eager_sgd = false;
template <class Step>
inline constexpr bool eager_sgd<merge::eager<Step>, sgd_update> = std::is_same_v<Step, sgd_update>;

namespace detail {

// The loop: the shared step u and the worker's own step w, both branch-free.
// Compilers vectorize a loop over this many buffers only if they can tell
// the buffers apart, which they cannot here (restrict on a struct's members
// or an inlined function's parameters is lost, and run-time overlap checks
// stop at ten pairs); so the loop reads the buffers and writes the results
// to arrays of its own, which nothing else can alias, and short loops copy
// them out. The replica keeps what the worker's step gave it.
template <std::size_t B, class U, class S>
DILOCO_HD DILOCO_FORCEINLINE void eager_elements(const U& update_, const S& own_step, float* anchor, float* own,
                                                 float* slots, float weight, float* g, float* l,
                                                 const float* mean, std::size_t n, float* s) {
  static_assert(U::vector_state_slots == 1 && S::vector_state_slots == 1, "one slot per element (momentum)");
  const U u = update_;
  const S w = own_step;
  float a_out[B], o_out[B], w_out[B], g_out[B], l_out[B], s_out[B];
  for (std::size_t j = 0; j < n; ++j) {
    float a = anchor[j], o = own[j], gj = g[j];
    float ws = S::has_momentum ? slots[j] : 0.0f;
    float ss = U::has_momentum ? s[j] : 0.0f;
    l_out[j] = merge::eager<S>::advance_element(w, a, o, &ws, 1, weight, mean[j], l[j]);
    u(gj, mean[j], &ss, 1);
    a_out[j] = a;
    o_out[j] = o;
    w_out[j] = ws;
    g_out[j] = gj;
    s_out[j] = ss;
  }
  for (std::size_t j = 0; j < n; ++j) anchor[j] = a_out[j];
  for (std::size_t j = 0; j < n; ++j) own[j] = o_out[j];
  for (std::size_t j = 0; j < n; ++j) g[j] = g_out[j];
  for (std::size_t j = 0; j < n; ++j) l[j] = l_out[j];
  if constexpr (S::has_momentum)
    for (std::size_t j = 0; j < n; ++j) slots[j] = w_out[j];
  if constexpr (U::has_momentum)
    for (std::size_t j = 0; j < n; ++j) s[j] = s_out[j];
}

}  // namespace detail

/// apply_element(update, m, j, g[j], mean[j], s + j, ...) for j in [0, n),
/// n <= B, with m's buffers, g, l and s (theta_global, the replica, the
/// shared momentum slots or null) all at the block's first element, in the
/// branch-free forms. Returns false, having done nothing, where those forms
/// do not fit (the two steps differ in weight decay or momentum, or a step
/// with momentum has no slots): the caller runs its general loop then.
template <std::size_t B, class Step>
DILOCO_HD DILOCO_FORCEINLINE bool eager_block(const sgd_update& update, const merge::eager<Step>& m, float* g,
                                              float* l, const float* mean, std::size_t n, float* s) {
  bool done = false;
  update.with_fixed_branches([&](auto fixed) {
    using F = decltype(fixed);
    if (!F::matches(m.step) || (s != nullptr) != F::has_momentum || (m.slots != nullptr) != F::has_momentum) return;
    detail::eager_elements<B>(fixed, F{m.step}, m.anchor, m.own, m.slots, m.weight, g, l, mean, n, s);
    done = true;
  });
  return done;
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
