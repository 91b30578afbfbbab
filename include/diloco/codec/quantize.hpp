// SPDX-License-Identifier: Apache-2.0
#pragma once

// Block-wise quantization of one block onto a format's grid
// (codec/grids.hpp): q = round(v * L / amax) with one fp32 factor per
// block (amax, the block's largest magnitude), dequantized as q * (amax / L),
// where L is the grid's largest value (127 for int8, 7 for int4, 3 for int2,
// 448 for fp8_e4m3, ...). Round to nearest gives |v - dq| <= half the grid's
// gap around v, times amax / L (plus fp32 rounding); stochastic rounding is
// unbiased: E[q] = v * L / amax.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/codec/grids.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// The largest magnitude of v[0, len), NaN if any element is NaN. Taken on
/// the bit patterns with the sign cleared: for IEEE floats their integer
/// order is the order of magnitudes, NaN patterns sort above infinity, and an
/// integer max vectorizes where a float max with NaN rules does not.
DILOCO_HD DILOCO_FORCEINLINE float block_amax(const float* v, std::size_t len) {
  std::int32_t m = 0;
  for (std::size_t j = 0; j < len; ++j) {
    std::int32_t bits;
    std::memcpy(&bits, v + j, sizeof bits);
    bits &= 0x7fffffff;
    m = bits > m ? bits : m;
  }
  float out;
  std::memcpy(&out, &m, sizeof out);
  return out;
}

/// Dequantization factor for a block: q * scale, with scale = amax / L. When
/// that scale is subnormal it has lost most of its bits; then the value is
/// (q * amax) / L instead (q * amax is exact there), see dequantize().
DILOCO_HD DILOCO_FORCEINLINE bool scale_is_normal(float amax, float levels) {
  return amax / levels >= 1.17549435e-38f;
}

/// q * (amax / L), or (q * amax) / L where that scale is subnormal (see scale_is_normal).
DILOCO_HD DILOCO_FORCEINLINE float dequantize(float q, float amax, float levels) {
  const float scale = amax / levels;
  return scale >= 1.17549435e-38f ? q * scale : (q * amax) / levels;
}

/// Quantizes v[0, len) against `amax` into q[0, len) (as floats holding grid
/// values in [-L, L]) and writes the dequantized values into dq.
/// Stochastic: the grid's stochastic rounding with random(j) in [0, 1);
/// otherwise round to nearest, ties to even.
/// A zero, infinite or NaN amax gives q = 0 and dq = value(code(0)) * (amax / L),
/// i.e. 0, or inf/NaN: non-finite blocks stay visibly non-finite.
template <bool Stochastic, class Grid, class Random>
DILOCO_HD DILOCO_FORCEINLINE void quantize_block(const float* v, std::size_t len, float amax, const Grid& grid, float* q,
                                                 float* dq, const Random& random) {
  const float levels = grid.levels;
  const bool finite = amax - amax == 0.0f;
  if (!(amax > 0.0f) || !finite) {
    const float z = grid.value(grid.code(0.0f)) * (amax / levels);  // what decode gives: 0 or NaN
    for (std::size_t j = 0; j < len; ++j) {
      q[j] = 0.0f;
      dq[j] = z;
    }
    return;
  }
  const float inv = levels / amax;
  const float scale = amax / levels;
  auto level = [&](float y, std::size_t j) {
    return grid.template round<Stochastic>(y, Stochastic ? random(j) : 0.0f);
  };
  if (inv - inv == 0.0f && scale >= 1.17549435e-38f) {  // every normal block
    for (std::size_t j = 0; j < len; ++j) {
      const float r = level(v[j] * inv, j);
      q[j] = r;
      dq[j] = r * scale;
    }
    return;
  }
  // Tiny blocks: L / amax may overflow (divide first) and amax / L is
  // subnormal (multiply by amax first), see dequantize().
  for (std::size_t j = 0; j < len; ++j) {
    const float r = level(inv - inv == 0.0f ? v[j] * inv : (v[j] / amax) * levels, j);
    q[j] = r;
    dq[j] = scale >= 1.17549435e-38f ? r * scale : (r * amax) / levels;
  }
}

/// Kept for callers that quantize one value at a time (tests, references).
struct quant_scale {
  ///@{
  /// The block's amax and the format's levels L (127: int8).
  float amax = 0.0f;
  float levels = 127.0f;
  ///@}
  /// The scale of a block with this amax and L.
  DILOCO_HD static quant_scale make(float amax, float levels) { return {amax, levels}; }
  /// The quantized value q of v (an 8-bit integer grid with these levels): to the nearest, or
  /// with u >= 0 stochastically, u being the draw.
  DILOCO_HD int quantize(float v, float u) const {
    float q, dq;
    const int_grid<8> g{levels};
    if (u < 0.0f)
      quantize_block<false>(&v, 1, amax, g, &q, &dq, [](std::size_t) { return 0.0f; });
    else
      quantize_block<true>(&v, 1, amax, g, &q, &dq, [u](std::size_t) { return u; });
    return static_cast<int>(q);
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
