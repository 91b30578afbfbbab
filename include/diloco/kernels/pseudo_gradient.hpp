#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// Pass 1 of a round (world > 1, fp32 wire): the pseudo-gradient
//   delta_i = global_i - local_i
// written straight into the communication buffer; returns delta_i^2 so the
// same pass yields the worker's pseudo-gradient norm.
// Bytes per element: read 8 (global, local), write 4 (wire) = 12.
struct pseudo_gradient {
  const float* DILOCO_RESTRICT global;
  const float* DILOCO_RESTRICT local;
  float* DILOCO_RESTRICT out;

  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const {
    const float d = global[i] - local[i];
    out[i] = d;
    return d * d;
  }
};

// The norm alone, for a world of one where nothing travels: read 8 bytes.
struct pseudo_gradient_sq {
  const float* DILOCO_RESTRICT global;
  const float* DILOCO_RESTRICT local;

  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const {
    const float d = global[i] - local[i];
    return d * d;
  }
};

// Sum of squares of a tensor (gradient clipping): read 4 bytes.
struct squares {
  const float* DILOCO_RESTRICT x;
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const { return x[i] * x[i]; }
};

// dst_i = src_i (restoring replicas, initial copies): read 4, write 4.
struct copy {
  const float* DILOCO_RESTRICT src;
  float* DILOCO_RESTRICT dst;
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const { dst[i] = src[i]; }
};

}  // namespace diloco::kernels
