#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// One inner optimizer step on one tensor. The gradient is scaled on read
// (global-norm clipping), leaving the caller's gradient untouched.
// Bytes per element with AdamW: read 16 (param, grad, m, v), write 12.
template <class Update>
struct inner_step {
  Update update;
  float* DILOCO_RESTRICT param;
  const float* DILOCO_RESTRICT grad;
  float grad_scale;
  float* DILOCO_RESTRICT state;
  std::size_t stride;

  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    float p = param[i];
    update(p, grad[i] * grad_scale, state == nullptr ? nullptr : state + i, stride);
    param[i] = p;
  }
};

}  // namespace diloco::kernels
