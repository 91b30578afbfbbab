// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// One element of torch.optim.SGD's step (PyTorch's documented algorithm):
///   g <- g + wd * p                               (weight_decay != 0)
///   b <- g on the first step, else mu*b + (1-dampening)*g   (momentum != 0)
///   g <- g + mu*b if nesterov, else b
///   p <- p - lr * g
/// State: slot 0 holds the momentum buffer b when momentum != 0.
struct sgd_update {
  /// The momentum slot, when there is state at all (no momentum: no state
  /// and a null pointer).
  static constexpr std::size_t vector_state_slots = 1;

  float lr = 0.0f;  ///< learning rate
  float momentum = 0.0f;  ///< momentum factor mu (0: no state)
  float one_minus_dampening = 1.0f;  ///< 1 - dampening
  float weight_decay = 0.0f;  ///< L2 penalty added to the gradient
  ///@{
  /// Derived per step by make_sgd_update, so the element math has no
  /// data-dependent branches and vectorizes:
  /// ```
  /// b = carry * b_old + gain * g        (carry 0, gain 1 on the first step:
  ///                                      b = g, the zeroed slot times 0)
  /// g = keep * g + through * b          (Nesterov: keep 1, through mu;
  ///                                      plain momentum: keep 0, through 1)
  /// ```
  float carry = 0.0f;
  float gain = 1.0f;
  float keep = 0.0f;
  float through = 1.0f;
  ///@}

  /// One element: p and its gradient g; s is the momentum slot (null without momentum).
  DILOCO_HD DILOCO_FORCEINLINE void operator()(float& p, float g, float* s, std::size_t /*stride*/) const {
    step(p, g, s, weight_decay != 0.0f, momentum != 0.0f);
  }
  /// The element math, with whether to apply weight decay and momentum
  /// given: sgd_update_fixed passes constants, which leave no branch.
  DILOCO_HD DILOCO_FORCEINLINE void step(float& p, float g, float* s, bool decay, bool with_momentum) const {
    // Each operation rounded on its own (core/exact_float.hpp), so the
    // GPU gives the host's bits.
    if (decay) g = add_rn(g, mul_rn(weight_decay, p));
    if (with_momentum) {
      const float b = add_rn(mul_rn(carry, s[0]), mul_rn(gain, g));
      s[0] = b;
      g = add_rn(mul_rn(keep, g), mul_rn(through, b));
    }
    p = sub_rn(p, mul_rn(lr, g));
  }

  /// Calls f with this step as an sgd_update_fixed whose two branches
  /// (weight decay, momentum) are decided here, once, instead of per element.
  template <class F>
  DILOCO_HD DILOCO_FORCEINLINE void with_fixed_branches(F&& f) const;
};

/// sgd_update with the presence of weight decay and momentum fixed at
/// compile time: the same operations on every element, with no branch left
/// in the element math. A pass whose element loop runs more than one update
/// (eager's: the worker's own outer step beside the shared one) takes it,
/// because compilers hoist only a few loop-invariant branches out of a loop
/// (GCC 12: not the four of two updates) and a loop with branches left in it
/// does not vectorize. Each element's operations are sgd_update's, so are
/// its bits.
template <bool Decay, bool Momentum>
struct sgd_update_fixed : sgd_update {
  static constexpr bool has_decay = Decay;        ///< weight_decay != 0
  static constexpr bool has_momentum = Momentum;  ///< momentum != 0 (there is a slot)
  /// Whether `u` has this form's branches.
  DILOCO_HD static bool matches(const sgd_update& u) {
    return (u.weight_decay != 0.0f) == Decay && (u.momentum != 0.0f) == Momentum;
  }
  /// One element, sgd_update's math with the branches fixed (s is not read without momentum).
  DILOCO_HD DILOCO_FORCEINLINE void operator()(float& p, float g, float* s, std::size_t /*stride*/) const {
    step(p, g, s, Decay, Momentum);
  }
};

template <class F>
DILOCO_HD DILOCO_FORCEINLINE void sgd_update::with_fixed_branches(F&& f) const {
  if (weight_decay != 0.0f) {
    if (momentum != 0.0f)
      f(sgd_update_fixed<true, true>{*this});
    else
      f(sgd_update_fixed<true, false>{*this});
  } else {
    if (momentum != 0.0f)
      f(sgd_update_fixed<false, true>{*this});
    else
      f(sgd_update_fixed<false, false>{*this});
  }
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
