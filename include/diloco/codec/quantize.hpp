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

/// What quantizing and dequantizing need of a block's amax, worked out once
/// per block: the two divisions (L / amax and amax / L) and the cases they
/// select. Each is an IEEE division (about ten instructions on the device);
/// made per element they were most of the int8 encode's and the shard
/// reduce's instructions. Both the host's block loops (quantize_block) and
/// the device team programs' element form (blockwise_codec's elements)
/// quantize through these terms, so the float operations per element are
/// written once.
struct quant_terms {
  float amax;     ///< the block's amax
  float inv;      ///< L / amax
  float scale;    ///< amax / L
  bool zero;      ///< amax is 0, infinite or NaN: every code that of 0, dq = zero_dq
  bool normal;    ///< inv finite and scale normal: r = round(v * inv), dq = r * scale
  bool plain;     ///< dequantize as r * scale (a normal scale, or a non-finite amax)
  float zero_dq;  ///< dq of a zero block: value(code(0)) * scale, i.e. 0, or NaN/inf
};

/// The terms of a block whose amax is `amax`, on `grid` (levels L = grid.levels).
template <class Grid>
DILOCO_HD DILOCO_FORCEINLINE quant_terms quant_terms_of(float amax, const Grid& grid) {
  const float levels = grid.levels;
  quant_terms t{};
  t.amax = amax;
  t.inv = levels / amax;
  t.scale = amax / levels;
  const bool finite = amax - amax == 0.0f;
  t.zero = !(amax > 0.0f) || !finite;
  t.normal = t.inv - t.inv == 0.0f && t.scale >= 1.17549435e-38f;
  t.plain = t.scale >= 1.17549435e-38f || !finite;
  t.zero_dq = grid.value(grid.code(0.0f)) * t.scale;
  return t;
}

/// The grid value r of v on a block whose terms are normal and not zero (the
/// common case), and its dequantized value dq = r * scale; u is v's draw
/// (stochastic rounding).
template <bool Stochastic, class Grid>
DILOCO_HD DILOCO_FORCEINLINE float quantize_normal(float v, const quant_terms& t, const Grid& grid, float u,
                                                   float& dq) {
  const float r = grid.template round<Stochastic>(v * t.inv, u);
  dq = r * t.scale;
  return r;
}

/// The grid value r of v on any block, and dq: a zero, infinite or NaN amax
/// gives r = 0 and dq = zero_dq (non-finite blocks stay visibly non-finite);
/// tiny blocks, where L / amax may overflow (divide first) and amax / L is
/// subnormal (multiply by amax first, see dequantize()), take the exact path.
template <bool Stochastic, class Grid>
DILOCO_HD DILOCO_FORCEINLINE float quantize_element(float v, const quant_terms& t, const Grid& grid, float u,
                                                    float& dq) {
  if (t.zero) {
    dq = t.zero_dq;
    return 0.0f;
  }
  if (t.normal) return quantize_normal<Stochastic>(v, t, grid, u, dq);
  const float r = grid.template round<Stochastic>(t.inv - t.inv == 0.0f ? v * t.inv : (v / t.amax) * grid.levels, u);
  dq = dequantize(r, t.amax, grid.levels);
  return r;
}

/// The value of grid value r on a block with terms t: r * scale where the
/// scale is normal (or the amax not finite), else dequantize()'s exact form.
DILOCO_HD DILOCO_FORCEINLINE float dequantize_element(float r, const quant_terms& t, float levels) {
  return t.plain ? r * t.scale : dequantize(r, t.amax, levels);
}

/// Quantizes v[0, len) against `amax` into q[0, len) (as floats holding grid
/// values in [-L, L]) and writes the dequantized values into dq, each
/// element by quantize_element (the normal and zero blocks in loops of their
/// own, which vectorize). Stochastic: the grid's stochastic rounding with
/// random(j) in [0, 1); otherwise round to nearest, ties to even.
template <bool Stochastic, class Grid, class Random>
DILOCO_HD DILOCO_FORCEINLINE void quantize_block(const float* v, std::size_t len, float amax, const Grid& grid, float* q,
                                                 float* dq, const Random& random) {
  const quant_terms t = quant_terms_of(amax, grid);
  if (t.zero) {
    for (std::size_t j = 0; j < len; ++j) {
      q[j] = 0.0f;
      dq[j] = t.zero_dq;
    }
    return;
  }
  if (t.normal) {  // every normal block
    for (std::size_t j = 0; j < len; ++j) q[j] = quantize_normal<Stochastic>(v[j], t, grid, Stochastic ? random(j) : 0.0f, dq[j]);
    return;
  }
  for (std::size_t j = 0; j < len; ++j) q[j] = quantize_element<Stochastic>(v[j], t, grid, Stochastic ? random(j) : 0.0f, dq[j]);
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
