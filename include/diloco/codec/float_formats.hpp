// SPDX-License-Identifier: Apache-2.0
#pragma once

// fp32 -> bf16 / fp16 conversion with round-to-nearest-even or stochastic
// rounding, and back, written once for host and device. Both roundings pick
// between the two representable neighbours of |x|: `lo` (toward zero) and
// `hi` (the next one away from zero); stochastic rounding picks hi with
// probability (|x| - lo) / (hi - lo), so it is unbiased.

#include <cstdint>
#include <cstring>

#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// The bits of a float.
DILOCO_HD DILOCO_FORCEINLINE std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
/// The float of these bits.
DILOCO_HD DILOCO_FORCEINLINE float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// bfloat16: the top 16 bits of an fp32.
struct bf16_format {
  static constexpr std::uint16_t inf = 0x7f80;        ///< +infinity's code
  static constexpr std::uint16_t quiet_nan = 0x7fc0;  ///< a quiet NaN's code
  /// The float a code stands for (exact).
  DILOCO_HD static float decode(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }
  /// |x| (finite, non-negative bits) truncated toward zero.
  DILOCO_HD static std::uint16_t truncate(std::uint32_t abs_bits) { return static_cast<std::uint16_t>(abs_bits >> 16); }
};

/// IEEE binary16: 5 exponent bits (bias 15), 10 mantissa bits, subnormals
/// down to 2^-24, largest finite 65504.
struct fp16_format {
  static constexpr std::uint16_t inf = 0x7c00;        ///< +infinity's code
  static constexpr std::uint16_t quiet_nan = 0x7e00;  ///< a quiet NaN's code
  /// The float a code stands for (exact: subnormals included).
  DILOCO_HD static float decode(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
      const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  /// |x| (finite, non-negative bits) truncated toward zero; inf when |x| is
  /// at or beyond 65536, the first value past the last binade.
  DILOCO_HD static std::uint16_t truncate(std::uint32_t abs_bits) {
    if (abs_bits >= 0x47800000u) return inf;
    if (abs_bits >= 0x38800000u) {  // normal in fp16: |x| >= 2^-14
      const std::uint32_t exp = (abs_bits >> 23) - 112u;
      return static_cast<std::uint16_t>((exp << 10) | ((abs_bits & 0x7fffffu) >> 13));
    }
    // Subnormal in fp16: floor(|x| * 2^24); the scaling is exact.
    return static_cast<std::uint16_t>(bits_float(abs_bits) * 16777216.0f);
  }
};

/// bf16 round-to-nearest-even on the bit pattern: adding 0x7fff plus the
/// kept part's lowest bit and truncating is IEEE's rounding for every finite
/// value and subnormal (the carry moves into the exponent exactly when it
/// should, and past the largest finite value into inf); NaN is kept quiet.
/// Branch-free, so it vectorizes; encode_float16<bf16_format> gives the same
/// result for every input. This form works on the fp32 bits `u` and returns
/// the code << 16 (the fp32 bits of the rounded value: a loop that stays in
/// 32-bit lanes, as the low-precision mirror's, uses it directly).
DILOCO_HD DILOCO_FORCEINLINE std::uint32_t bf16_round_nearest_wide(std::uint32_t u) {
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return nan ? (u & 0x80000000u) | 0x7fc00000u : rounded;
}
/// bf16_round_nearest_wide of x, as the 16-bit code.
DILOCO_HD DILOCO_FORCEINLINE std::uint16_t bf16_round_nearest(float x) {
  return static_cast<std::uint16_t>(bf16_round_nearest_wide(float_bits(x)) >> 16);
}

/// Rounds x to the format. `u` in [0, 1) selects stochastic rounding; a
/// negative `u` selects round-to-nearest-even. NaN stays NaN; values beyond
/// the format's range become +-inf (the caller's finiteness checks see them).
template <class Format>
DILOCO_HD DILOCO_FORCEINLINE std::uint16_t encode_float16(float x, float u) {
  const std::uint32_t bits = float_bits(x);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<std::uint16_t>(sign | Format::quiet_nan);
  if (abs_bits == 0x7f800000u) return static_cast<std::uint16_t>(sign | Format::inf);
  const std::uint16_t t = Format::truncate(abs_bits);
  if (t >= Format::inf) return static_cast<std::uint16_t>(sign | Format::inf);
  const float a = bits_float(abs_bits);
  const float lo = Format::decode(t);
  if (a == lo) return static_cast<std::uint16_t>(sign | t);
  const auto up = static_cast<std::uint16_t>(t + 1);  // the next magnitude (may be inf)
  // The gap to the next magnitude; past the largest finite value, the width
  // the next binade would have (so max vs inf is decided as IEEE does).
  const float step = up == Format::inf ? lo - Format::decode(static_cast<std::uint16_t>(t - 1)) : Format::decode(up) - lo;
  const float below = a - lo;  // exact: a and lo are within a factor of 2, or lo is 0
  bool round_up;
  if (u < 0.0f) {
    const float half = 0.5f * step;
    round_up = below > half || (below == half && (t & 1u));
  } else {
    round_up = u * step < below;
  }
  return static_cast<std::uint16_t>(sign | (round_up ? up : t));
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
