// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// One element of torch.optim.AdamW's step (decoupled weight decay), written
/// as PyTorch's single-tensor implementation computes it:
///   p <- p * (1 - lr*wd)
///   m <- m + (1-beta1) * (g - m)                   (lerp)
///   v <- beta2*v + (1-beta2) * g*g
///   p <- p - (lr / (1-beta1^t)) * m / (sqrt(v) / sqrt(1-beta2^t) + eps)
/// The step-dependent scalars are computed once per step on the host in
/// double precision. State: slot 0 = m (exp_avg), slot 1 = v (exp_avg_sq).
struct adamw_update {
  /// Both slots are read and written on every call (the 4-wide path moves
  /// them with 16-byte accesses; see vec4.hpp).
  static constexpr std::size_t vector_state_slots = 2;

  float decay = 1.0f;           ///< 1 - lr * weight_decay
  float one_minus_beta1 = 0.1f;  ///< 1 - beta1
  float beta2 = 0.95f;          ///< decay rate of the second moment
  float one_minus_beta2 = 0.05f;  ///< 1 - beta2
  float step_size = 0.0f;       ///< lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;  ///< sqrt(1 - beta2^t)
  float eps = 1e-8f;            ///< added to the denominator

  /// One element: p and its gradient g; the first moment at s[0], the second at s[stride].
  DILOCO_HD DILOCO_FORCEINLINE void operator()(float& p, float g, float* s, std::size_t stride) const {
    // Each operation rounded on its own (core/exact_float.hpp), so the
    // GPU gives the host's bits.
    p = mul_rn(p, decay);
    const float m = add_rn(s[0], mul_rn(one_minus_beta1, sub_rn(g, s[0])));
    const float v = add_rn(mul_rn(beta2, s[stride]), mul_rn(one_minus_beta2, mul_rn(g, g)));
    s[0] = m;
    s[stride] = v;
    const float denom = add_rn(div_rn(sqrt_rn(v), bias_correction2_sqrt), eps);
    p = sub_rn(p, mul_rn(step_size, div_rn(m, denom)));
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
