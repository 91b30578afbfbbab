#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// One element of torch.optim.SGD's step (PyTorch's documented algorithm):
//   g <- g + wd * p                               (weight_decay != 0)
//   b <- g on the first step, else mu*b + (1-dampening)*g   (momentum != 0)
//   g <- g + mu*b if nesterov, else b
//   p <- p - lr * g
// State: slot 0 holds the momentum buffer b when momentum != 0.
struct sgd_update {
  // The momentum slot, when there is state at all (no momentum: no state
  // and a null pointer).
  static constexpr std::size_t vector_state_slots = 1;

  float lr = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;

  DILOCO_HD DILOCO_FORCEINLINE void operator()(float& p, float g, float* s, std::size_t /*stride*/) const {
    if (weight_decay != 0.0f) g = g + weight_decay * p;
    if (momentum != 0.0f) {
      const float b = first_step ? g : momentum * s[0] + one_minus_dampening * g;
      s[0] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p = p - lr * g;
  }
};

}  // namespace diloco::kernels
