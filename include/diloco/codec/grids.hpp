// SPDX-License-Identifier: Apache-2.0
#pragma once

// The value grids of the block-wise formats (codec/formats.hpp): where a
// value y, already divided by the block's scale (so |y| <= levels), lands,
// and the bits that say so. Each grid gives
//
//   round<Stochastic>(y, u)  the grid value for y: the nearest (ties to the
//                            even code), or with Stochastic the upper of the
//                            two neighbours with probability
//                            (y - lo) / (hi - lo) (u in [0, 1)), which is
//                            unbiased; beyond the largest value it saturates
//   code(r)                  the Format::bits-bit code of grid value r
//   value(c)                 the grid value of code c
//   valid(c)                 false for a code the format never writes,
//                            `invalid` saying what such a code is
//
// Written once for host and device; plain float operations (add_rn where a
// sum could be fused with a product), so both put the same codes on the wire.

#include <cstdint>

#include "diloco/codec/formats.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/codec/float_formats.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Round to nearest even by the 1.5 * 2^23 trick: exact for |y| < 2^22, and
/// plain adds, so loops vectorize on any SIMD level and host and device agree
/// bit for bit. The first add is add_rn so that nvcc cannot fuse it with the
/// product that usually computes y (core/exact_float.hpp).
DILOCO_HD DILOCO_FORCEINLINE float round_even(float y) {
  constexpr float magic = 12582912.0f;
  return add_rn(y, magic) - magic;
}

/// floor(z) for |z| < 2^22, from round_even.
DILOCO_HD DILOCO_FORCEINLINE float floor_small(float z) {
  const float r = round_even(z);
  return r > z ? r - 1.0f : r;
}

/// Symmetric integers in [-L, L], two's complement codes of `Bits` bits
/// (int8: L = 127, int4: L = 7; the code -L - 1 is never written).
template <int Bits>
struct int_grid {
  /// The largest |q|: 127 for int8, 7 for int4.
  float levels;
  ///@{
  /// The grid's operations (the table atop codec/grids.hpp): the grid value for y, the code
  /// of a grid value, the value of a code, whether a code is ever written, and what a code
  /// never written is.
  template <bool Stochastic>
  DILOCO_HD DILOCO_FORCEINLINE float round(float y, float u) const {
    float r = Stochastic ? floor_small(add_rn(y, u)) : round_even(y);
    r = r < levels ? r : levels;  // the min/max forms map onto SIMD min/max
    return r > -levels ? r : -levels;
  }
  DILOCO_HD static unsigned code(float r) {
    return static_cast<unsigned>(static_cast<int>(r)) & ((1u << Bits) - 1u);
  }
  DILOCO_HD static float value(unsigned c) {
    constexpr unsigned sign = 1u << (Bits - 1);
    return static_cast<float>(static_cast<int>((c & ((1u << Bits) - 1u)) ^ sign) - static_cast<int>(sign));
  }
  DILOCO_HD bool valid(unsigned c) const { return value(c) >= -levels; }
  static constexpr const char* invalid = "quantized value out of range";
  ///@}
};

/// int2: the four levels -3, -1, +1, +3 (codes 0..3, value 2c - 3).
struct int2_grid {
  /// The largest |q|.
  static constexpr float levels = 3.0f;
  ///@{
  /// The grid's operations (the table atop codec/grids.hpp): the grid value for y, the code
  /// of a grid value, the value of a code, whether a code is ever written (all are), and what a
  /// code never written is (none).
  template <bool Stochastic>
  DILOCO_HD DILOCO_FORCEINLINE static float round(float y, float u) {
    if constexpr (Stochastic) {
      // Position on the code axis, p = (y + 3) / 2 in [0, 3]; the code is
      // floor(p + u), so E[code] = p and E[value] = y.
      float c = floor_small(add_rn((y + 3.0f) * 0.5f, u));
      c = c < 3.0f ? c : 3.0f;
      c = c > 0.0f ? c : 0.0f;
      return 2.0f * c - 3.0f;
    } else {
      // Nearest level; the midpoints -2, 0, +2 go to the even code
      // (-3, +1, +1). Comparisons rather than arithmetic on y, so even a
      // tiny negative y finds -1.
      const float hi = y > 2.0f ? 3.0f : 1.0f;
      const float lo = y > -2.0f ? -1.0f : -3.0f;
      return y >= 0.0f ? hi : lo;
    }
  }
  DILOCO_HD static unsigned code(float r) { return static_cast<unsigned>(static_cast<int>(r) + 4) >> 1; }  // 0 -> code 2
  DILOCO_HD static float value(unsigned c) { return static_cast<float>(2 * static_cast<int>(c & 3u) - 3); }
  DILOCO_HD static bool valid(unsigned) { return true; }
  static constexpr const char* invalid = "";
  ///@}
};

/// Sign-magnitude small floats (fp8_e4m3, fp8_e5m2, fp4_e3m0): the top bit
/// is the sign, then the exponent field, then the mantissa.
template <class Format>
struct minifloat_grid {
  ///@{
  /// The format's exponent and mantissa bits, exponent bias, largest magnitude, and the sign
  /// bit of a code.
  static constexpr int E = Format::exponent_bits;
  static constexpr int M = Format::mantissa_bits;
  static constexpr int bias = Format::bias;
  static constexpr float levels = Format::levels;
  static constexpr unsigned sign_bit = 1u << (E + M);
  ///@}
  static_assert(E + M + 1 == Format::bits, "minifloat: sign, exponent and mantissa must fill the format");

  /// The value of magnitude code c (no sign): exponent field 0 holds
  /// m * 2^(1 - bias - M), the others (1 + m / 2^M) * 2^(e - bias).
  DILOCO_HD DILOCO_FORCEINLINE static float magnitude(unsigned c) {
    const unsigned e = c >> M;
    const unsigned m = c & ((1u << M) - 1u);
    // 2^(1 - bias - M) is a normal fp32 for every format here.
    const float sub = static_cast<float>(m) * bits_float(static_cast<std::uint32_t>(127 + 1 - bias - M) << 23);
    const float normal = bits_float(((e + 127u - static_cast<unsigned>(bias)) << 23) | (m << (23 - M)));
    return e == 0 ? sub : normal;
  }
  /// The magnitude code of the largest grid value <= a, for 0 <= a < levels.
  DILOCO_HD DILOCO_FORCEINLINE static unsigned truncate(float a) {
    const std::uint32_t b = float_bits(a);
    const std::uint32_t min_normal = static_cast<std::uint32_t>(127 + 1 - bias) << 23;
    if (b >= min_normal) {
      const unsigned e = (b >> 23) - 127u + static_cast<unsigned>(bias);
      return (e << M) | ((b & 0x7fffffu) >> (23 - M));
    }
    // Subnormal: floor(a / 2^(1 - bias - M)); the scaling is exact.
    return static_cast<unsigned>(a * bits_float(static_cast<std::uint32_t>(127 - 1 + bias + M) << 23));
  }

  ///@{
  /// The grid's operations (the table atop codec/grids.hpp): the grid value for y, the code
  /// of a grid value, the value of a code, whether a code is ever written, and what a code
  /// never written is.
  template <bool Stochastic>
  DILOCO_HD DILOCO_FORCEINLINE static float round(float y, float u) {
    const float a = bits_float(float_bits(y) & 0x7fffffffu);  // |y|, and +0 for -0
    float mag;
    if (!(a < levels)) {
      mag = levels;  // saturate
    } else {
      const unsigned t = truncate(a);
      const float lo = magnitude(t);
      const float hi = magnitude(t + 1);  // t < max_code, so t + 1 is a value
      const float step = hi - lo;         // exact: neighbours in one binade, or the subnormal spacing
      const float below = a - lo;         // exact: a and lo within a factor of 2, or lo = 0
      bool up;
      if constexpr (Stochastic) {
        up = u * step < below;
      } else {
        const float half = 0.5f * step;
        up = below > half || (below == half && (t & 1u));
      }
      mag = up ? hi : lo;
    }
    return y < 0.0f && mag > 0.0f ? -mag : mag;  // zero is always +0 (code 0)
  }
  DILOCO_HD static unsigned code(float r) {
    const float a = bits_float(float_bits(r) & 0x7fffffffu);
    const unsigned mag = a < levels ? truncate(a) : Format::max_code;
    return (r < 0.0f ? sign_bit : 0u) | mag;
  }
  DILOCO_HD static float value(unsigned c) {
    const float a = magnitude(c & (sign_bit - 1u));
    return (c & sign_bit) ? -a : a;
  }
  DILOCO_HD static bool valid(unsigned c) { return (c & (sign_bit - 1u)) <= Format::max_code; }
  static constexpr const char* invalid = "NaN or infinity code (the format saturates and never writes one)";
  ///@}

  /// value(c) without branches, so that a loop over codes vectorizes (the
  /// host's block loops, kernels/host_simd.hpp): the magnitude's exponent and
  /// mantissa fields moved to fp32's and the bias difference added to the
  /// exponent (magnitude()'s normal case, the same bits), or for exponent
  /// field 0 the mantissa times the subnormal spacing (its other case), chosen
  /// by a mask; the sign bit moved to fp32's. The same float for every code,
  /// the codes never written included (test_codec_fast_paths).
  DILOCO_HD DILOCO_FORCEINLINE static float value_branchless(std::uint32_t c) {
    const std::uint32_t m = c & (sign_bit - 1u);
    const std::uint32_t normal = (m << (23 - M)) + (static_cast<std::uint32_t>(127 - bias) << 23);
    if constexpr (M == 0) {  // no subnormals: exponent field 0 is zero alone
      const std::uint32_t zero = 0u - static_cast<std::uint32_t>(m == 0u);
      return bits_float((normal & ~zero) | ((c & sign_bit) << (31 - E - M)));
    }
    const float sub = static_cast<float>(static_cast<std::int32_t>(m)) *
                      bits_float(static_cast<std::uint32_t>(127 + 1 - bias - M) << 23);
    const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(m < (1u << M));
    return bits_float((float_bits(sub) & is_sub) | (normal & ~is_sub) | ((c & sign_bit) << (31 - E - M)));
  }

  /// round<false>(y, 0) and code() of it at once, without branches, so that
  /// a block's loop over it vectorizes on any SIMD level (the host's encode,
  /// compress/blockwise.hpp). The same value and code for every y: at or
  /// above the smallest normal, round to nearest even on the bit pattern
  /// (adding half a format ulp less one plus the kept part's lowest bit and
  /// truncating; the carry moves into the exponent exactly when it should);
  /// below it, the multiples of the subnormal spacing 2^(1 - bias - M),
  /// rounded by one fp32 add of a constant whose ulp is that spacing (ties
  /// to the even multiple, i.e. the even code; removing the constant again is
  /// exact). Both are round() to the nearest, ties to the even code, which
  /// round() finds through the two neighbours; test_codec_fast_paths checks
  /// every code's neighbourhood.
  DILOCO_HD DILOCO_FORCEINLINE static float round_nearest_code(float y, unsigned& c) {
    constexpr std::uint32_t drop = 23 - M;  // fp32 mantissa bits below the format's
    constexpr std::uint32_t min_normal = static_cast<std::uint32_t>(127 + 1 - bias) << 23;
    const std::uint32_t yb = float_bits(y);
    const std::uint32_t ab = yb & 0x7fffffffu;
    const std::uint32_t nb = (ab + ((1u << (drop - 1)) - 1u) + ((ab >> drop) & 1u)) & ~((1u << drop) - 1u);
    const unsigned ncode = (nb >> drop) - (static_cast<unsigned>(127 - bias) << M);
    const float magic = bits_float(static_cast<std::uint32_t>(127 + 1 - bias - M + 23) << 23);
    const float a = bits_float(ab);
    const float s = add_rn(a, magic);  // a < 2^(1 - bias) <= magic: s in [magic, 2 magic]
    const unsigned scode = float_bits(s) - float_bits(magic);
    // The choices as masks (and, or), which compilers vectorize where they
    // leave selects of this shape as branches.
    const std::uint32_t normal = 0u - static_cast<std::uint32_t>(ab >= min_normal);
    const std::uint32_t saturate = 0u - static_cast<std::uint32_t>(!(a < levels));  // NaN too, as round() does
    std::uint32_t mag = (nb & normal) | (float_bits(s - magic) & ~normal);
    mag = (float_bits(levels) & saturate) | (mag & ~saturate);
    std::uint32_t mc = (ncode & normal) | (scode & ~normal);
    mc = (Format::max_code & saturate) | (mc & ~saturate);
    // Zero is always +0 (code 0); y < 0 rather than the sign bit, as round() (-NaN saturates to +max).
    const std::uint32_t negative = static_cast<std::uint32_t>(y < 0.0f) & static_cast<std::uint32_t>(mc != 0u);
    c = mc | (negative << (E + M));
    return bits_float(mag | (negative << 31));
  }
};

namespace detail {
template <class Format>
struct grid_of {
  using type = minifloat_grid<Format>;
  DILOCO_HD static constexpr type make() { return {}; }
};
template <>
struct grid_of<diloco::int8> {
  using type = int_grid<8>;
  DILOCO_HD static constexpr type make() { return {127.0f}; }
};
template <>
struct grid_of<diloco::int4> {
  using type = int_grid<4>;
  DILOCO_HD static constexpr type make() { return {7.0f}; }
};
template <>
struct grid_of<diloco::int2> {
  using type = int2_grid;
  DILOCO_HD static constexpr type make() { return {}; }
};
}  // namespace detail

/// The grid of a block-wise format.
template <class Format>
using grid_t = typename detail::grid_of<Format>::type;
/// The grid of a block-wise format, ready to use.
template <class Format>
DILOCO_HD constexpr grid_t<Format> grid() {
  return detail::grid_of<Format>::make();
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
