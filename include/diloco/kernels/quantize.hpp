#pragma once

// Symmetric integer quantization of one block: q = round(v * L / amax) in
// [-L, L] with one fp32 factor per block (amax, the block's largest
// magnitude), dequantized as q * (amax / L). L = 127 for int8, 7 for int4.
// Round to nearest gives |v - dq| <= (amax / L) / 2 (plus fp32 rounding);
// stochastic rounding floor(y + u) is unbiased: E[q] = y.

#include <cmath>
#include <cstdint>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// The largest magnitude, NaN-propagating: a NaN anywhere makes the block's
// factor NaN, which the round's finiteness checks then reject.
DILOCO_HD DILOCO_FORCEINLINE float amax_step(float m, float v) {
  const float a = v < 0.0f ? -v : v;
  return (a > m || a != a) ? a : m;
}

// What quantize() needs per block, computed once from amax.
struct quant_scale {
  float amax = 0.0f;
  float inv = 0.0f;       // L / amax, or 0 when that overflows (denormal amax)
  float levels = 127.0f;  // L
  bool degenerate = true; // amax is 0 or not finite: every q is 0

  DILOCO_HD static quant_scale make(float amax, float levels) {
    quant_scale s;
    s.amax = amax;
    s.levels = levels;
    s.degenerate = !(amax > 0.0f) || !(amax - amax == 0.0f);
    if (!s.degenerate) {
      const float inv = levels / amax;
      s.inv = inv - inv == 0.0f ? inv : 0.0f;
    }
    return s;
  }

  // u < 0: round to nearest even; u in [0, 1): stochastic.
  DILOCO_HD DILOCO_FORCEINLINE int quantize(float v, float u) const {
    if (degenerate) return 0;
    // For a denormal amax, L / amax overflows: divide first instead.
    const float y = inv != 0.0f ? v * inv : (v / amax) * levels;
#if defined(__CUDA_ARCH__)
    float r = u < 0.0f ? rintf(y) : floorf(y + u);
#else
    float r = u < 0.0f ? std::rint(y) : std::floor(y + u);
#endif
    r = r > levels ? levels : (r < -levels ? -levels : r);
    return static_cast<int>(r);
  }
};

DILOCO_HD DILOCO_FORCEINLINE float dequantize(int q, float amax, float levels) {
  // amax / L is subnormal for tiny blocks and would lose most of its bits;
  // there q * amax is exact (an integer times a subnormal) and one division
  // rounds once.
  const float scale = amax / levels;
  return scale >= 1.17549435e-38f ? static_cast<float>(q) * scale : (static_cast<float>(q) * amax) / levels;
}

}  // namespace diloco::kernels
