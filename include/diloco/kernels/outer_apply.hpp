#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// Pass 2 of a round: the outer optimizer step fused with the copy-back.
// Reads the reduced pseudo-gradient sum, scales it to the mean, updates the
// outer state and global parameters, and writes the new global value into
// the worker's replica.
// Bytes per element with one state slot (Nesterov): read 12 (wire, state,
// global), write 12 (state, global, local) = 24.
template <class Update>
struct outer_apply {
  Update update;
  const float* DILOCO_RESTRICT reduced;
  float scale;  // 1/M: the wire holds the sum over workers
  float* DILOCO_RESTRICT global;
  float* DILOCO_RESTRICT state;  // nullptr when the optimizer keeps none
  std::size_t stride;
  float* DILOCO_RESTRICT local;

  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    float g = global[i];
    update(g, reduced[i] * scale, state == nullptr ? nullptr : state + i, stride);
    global[i] = g;
    local[i] = g;
  }
};

// The same step for a world of one: the pseudo-gradient is computed in the
// pass itself, nothing travels. Bytes per element with one state slot:
// read 12 (global, local, state), write 12 (state, global, local) = 24.
template <class Update>
struct outer_apply_local {
  Update update;
  float* DILOCO_RESTRICT global;
  float* DILOCO_RESTRICT state;
  std::size_t stride;
  float* DILOCO_RESTRICT local;

  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    float g = global[i];
    update(g, g - local[i], state == nullptr ? nullptr : state + i, stride);
    global[i] = g;
    local[i] = g;
  }
};

}  // namespace diloco::kernels
