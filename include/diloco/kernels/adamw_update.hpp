#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/math.hpp"

namespace diloco::kernels {

// One element of torch.optim.AdamW's step (decoupled weight decay), written
// as PyTorch's single-tensor implementation computes it:
//   p <- p * (1 - lr*wd)
//   m <- m + (1-beta1) * (g - m)                   (lerp)
//   v <- beta2*v + (1-beta2) * g*g
//   p <- p - (lr / (1-beta1^t)) * m / (sqrt(v) / sqrt(1-beta2^t) + eps)
// The step-dependent scalars are computed once per step on the host in
// double precision. State: slot 0 = m (exp_avg), slot 1 = v (exp_avg_sq).
struct adamw_update {
  // Both slots are read and written on every call (the 4-wide path moves
  // them with 16-byte accesses; see vec4.hpp).
  static constexpr std::size_t vector_state_slots = 2;

  float decay = 1.0f;           // 1 - lr * weight_decay
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.95f;
  float one_minus_beta2 = 0.05f;
  float step_size = 0.0f;       // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;
  float eps = 1e-8f;

  DILOCO_HD DILOCO_FORCEINLINE void operator()(float& p, float g, float* s, std::size_t stride) const {
    p = p * decay;
    const float m = s[0] + one_minus_beta1 * (g - s[0]);
    const float v = beta2 * s[stride] + one_minus_beta2 * (g * g);
    s[0] = m;
    s[stride] = v;
    const float denom = sqrt_f(v) / bias_correction2_sqrt + eps;
    p = p - step_size * (m / denom);
  }
};

}  // namespace diloco::kernels
