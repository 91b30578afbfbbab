// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/kernels/vec4.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// One inner optimizer step on one tensor. The gradient is scaled on read
/// (global-norm clipping), leaving the caller's gradient untouched.
/// Bytes per element with AdamW: read 16 (param, grad, m, v), write 12
/// (param, m, v) = 28; with SGD + momentum: read 12, write 8 = 20; plain SGD:
/// read 8, write 4 = 12.
template <class Update>
struct inner_step {
  Update update;  ///< the optimizer's element step
  float* DILOCO_RESTRICT param;  ///< the tensor's parameters
  const float* DILOCO_RESTRICT grad;  ///< its gradients
  float grad_scale;  ///< the clipping scale applied to every gradient on read
  float* DILOCO_RESTRICT state;  ///< the optimizer's slots (null when it keeps none)
  std::size_t stride;  ///< elements between an element's slots

  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    float p = param[i];
    update(p, mul_rn(grad[i], grad_scale), state == nullptr ? nullptr : state + i, stride);
    param[i] = p;
  }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp).
  DILOCO_HD DILOCO_FORCEINLINE void vec4(std::size_t i) const
    requires vectorizable_update<Update>
  {
    vec4f p = load4(param + i);
    vec4f g = load4_readonly(grad + i);
    for (std::size_t l = 0; l < vec_width; ++l) g[l] = mul_rn(g[l], grad_scale);
    update4(update, p, g, state == nullptr ? nullptr : state + i, stride);
    store4(param + i, p);
  }
  /// Whether the pointers allow 16-byte accesses (and the slot stride keeps them aligned).
  DILOCO_HD bool vec4_aligned() const
    requires vectorizable_update<Update>
  {
    return aligned16(param, grad, state) && stride_keeps_alignment(state, stride);
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
