#pragma once

// Symmetric integer quantization of one block: q = round(v * L / amax) in
// [-L, L] with one fp32 factor per block (amax, the block's largest
// magnitude), dequantized as q * (amax / L). L = 127 for int8, 7 for int4.
// Round to nearest gives |v - dq| <= (amax / L) / 2 (plus fp32 rounding);
// stochastic rounding floor(y + u) is unbiased: E[q] = y.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/exact_float.hpp"

namespace diloco::kernels {

// Round to nearest even by the 1.5 * 2^23 trick: exact for |y| < 2^22, and
// plain adds, so loops vectorize on any SIMD level and host and device agree
// bit for bit. The first add is add_rn so that nvcc cannot fuse it with the
// product that usually computes y (kernels/exact_float.hpp).
DILOCO_HD DILOCO_FORCEINLINE float round_even(float y) {
  constexpr float magic = 12582912.0f;
  return add_rn(y, magic) - magic;
}

// floor(z) for |z| < 2^22, from round_even.
DILOCO_HD DILOCO_FORCEINLINE float floor_small(float z) {
  const float r = round_even(z);
  return r > z ? r - 1.0f : r;
}

// The largest magnitude of v[0, len), NaN if any element is NaN. Taken on
// the bit patterns with the sign cleared: for IEEE floats their integer
// order is the order of magnitudes, NaN patterns sort above infinity, and an
// integer max vectorizes where a float max with NaN rules does not.
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

// Dequantization factor for a block: q * scale, with scale = amax / L. When
// that scale is subnormal it has lost most of its bits; then the value is
// (q * amax) / L instead (q * amax is exact there), see dequantize().
DILOCO_HD DILOCO_FORCEINLINE bool scale_is_normal(float amax, float levels) {
  return amax / levels >= 1.17549435e-38f;
}

DILOCO_HD DILOCO_FORCEINLINE float dequantize(int q, float amax, float levels) {
  const float scale = amax / levels;
  return scale >= 1.17549435e-38f ? static_cast<float>(q) * scale : (static_cast<float>(q) * amax) / levels;
}

// Quantizes v[0, len) against `amax` into q[0, len) (as floats holding
// integers in [-L, L]) and writes the dequantized values into dq.
// Stochastic: floor(y + random(j)) with random(j) in [0, 1); otherwise
// round to nearest even.
// A zero, infinite or NaN amax gives q = 0 and dq = 0 * (amax / L), i.e. 0
// or NaN: non-finite blocks stay visibly non-finite.
template <bool Stochastic, class Random>
DILOCO_HD DILOCO_FORCEINLINE void quantize_block(const float* v, std::size_t len, float amax, float levels, float* q,
                                                 float* dq, const Random& random) {
  const bool finite = amax - amax == 0.0f;
  if (!(amax > 0.0f) || !finite) {
    const float z = 0.0f * (amax / levels);
    for (std::size_t j = 0; j < len; ++j) {
      q[j] = 0.0f;
      dq[j] = z;
    }
    return;
  }
  const float inv = levels / amax;
  const float scale = amax / levels;
  auto level = [&](float y, std::size_t j) {
    float r = Stochastic ? floor_small(add_rn(y, random(j))) : round_even(y);
    r = r < levels ? r : levels;  // the min/max forms map onto SIMD min/max
    return r > -levels ? r : -levels;
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

// Kept for callers that quantize one value at a time (tests, references).
struct quant_scale {
  float amax = 0.0f;
  float levels = 127.0f;
  DILOCO_HD static quant_scale make(float amax, float levels) { return {amax, levels}; }
  DILOCO_HD int quantize(float v, float u) const {
    float q, dq;
    if (u < 0.0f)
      quantize_block<false>(&v, 1, amax, levels, &q, &dq, [](std::size_t) { return 0.0f; });
    else
      quantize_block<true>(&v, 1, amax, levels, &q, &dq, [u](std::size_t) { return u; });
    return static_cast<int>(q);
  }
};

}  // namespace diloco::kernels
