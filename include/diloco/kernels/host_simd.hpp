// SPDX-License-Identifier: Apache-2.0
#pragma once

// Hand-vectorised host forms of the two compute-bound passes of a
// compressed round with the block codecs (blockwise<int8|int4|int2|
// fp8_e4m3|fp8_e5m2|fp4_e3m0, B>, round to nearest): stage 1's encode of the
// pseudo-gradient (kernels::encode_pseudo_gradient) and stages 3+4's shard
// reduction (kernels::reduce_shard). Compilers vectorize neither well from
// the portable code: the block max, the rounding and the packing of codes
// sit in separate loops over block-local arrays, and the reduction decodes
// M blocks through byte loads. Each format's element operations (decoding
// 32 codes, rounding 8 values, packing 32 codes) are detail::ops<Format>;
// encode_block and reduce_blocks (a run of blocks at a time) are written
// once over them.
//
// Each routine does, per element, exactly the IEEE operations of the
// portable pass (AVX2 add, sub, mul and div are correctly rounded, and no
// FMA is enabled, so nothing is fused; where a form differs, such as fp8's
// decoding by one multiply of the code's bits, it is the same real product
// rounded once), and sums the norms in the same
// lanes (norm_lanes(B) lanes, eight to a 256-bit register, then
// lane_tree's tree), so the bytes on the wire, the residuals and the norms
// are the same bits as the portable code's, which the tests check block by
// block. A block they do not take returns false and the caller runs the
// portable code: partial blocks (a tensor's last), and blocks whose amax is
// infinite, NaN or so small (but not zero) that its scale is subnormal
// (rare; the portable code's special paths), or a received factor the
// format's decoding refuses (ops::make_rank).
//
// The library stays header-only and builds at the baseline ISA: these
// functions carry __attribute__((target("avx2"))) and are chosen at run
// time when the CPU has AVX2 (__builtin_cpu_supports), on x86-64 with GCC or
// Clang, outside nvcc's translation units (whose host code runs the
// portable passes: the same bits). DILOCO_HOST_SIMD=0 in the environment
// turns them off; defining DILOCO_NO_HOST_SIMD compiles them out. Where
// the CPU has AVX-512, kernels/host_simd512.hpp's forms of encode_block
// and reduce_blocks run instead (the same bits; DILOCO_HOST_SIMD=avx2
// keeps these).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "diloco/codec/blockwise.hpp"
#include "diloco/codec/cast.hpp"
#include "diloco/codec/float_formats.hpp"
#include "diloco/codec/packed_codes.hpp"
#include "diloco/codec/quantize.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/core/host_cpu.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels::host_simd {

// enabled() and DILOCO_HOST_SIMD_X86: core/host_cpu.hpp.

/// The most ranks whose blocks reduce_block sums (its scales live on the
/// stack); larger groups take the portable pass.
inline constexpr int max_world = 64;

/// Which codecs have hand-vectorised passes: blockwise int8, int4, int2,
/// fp8 e4m3 and e5m2 and fp4 e3m0 with round to nearest, B a multiple of 32
/// (whole 32-element steps; the caller also asks B to be a multiple of its
/// norm lanes). `format` is the codec's element format.
template <class Codec>
struct supports : std::false_type {};
/// blockwise_codec with round to nearest: those six formats, whole 32-element steps.
template <class Format, std::size_t B>
struct supports<compress::blockwise_codec<Format, B, compress::round_nearest>>
    : std::bool_constant<(std::is_same_v<Format, int8> || std::is_same_v<Format, int4> ||
                          std::is_same_v<Format, int2> || std::is_same_v<Format, fp8_e4m3> ||
                          std::is_same_v<Format, fp8_e5m2> || std::is_same_v<Format, fp4_e3m0>) &&
                         B % 32 == 0> {
  /// The codec's element format.
  using format = Format;
};

#if defined(DILOCO_HOST_SIMD_X86)

#define DILOCO_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline
#define DILOCO_AVX2 __attribute__((target("avx2"))) inline

namespace detail {

/// lane_tree over Lanes lanes held eight to a register in acc[0, Lanes / 8).
template <std::size_t Lanes>
DILOCO_AVX2_INLINE double lane_tree8(__m256* acc) {
  for (std::size_t w = Lanes / 8 / 2; w > 0; w /= 2)  // lane widths Lanes / 2, ..., 8
    for (std::size_t k = 0; k < w; ++k) acc[k] = _mm256_add_ps(acc[k], acc[k + w]);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1));  // w = 4
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));                                                   // w = 2
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));                                               // w = 1
  return static_cast<double>(_mm_cvtss_f32(x));
}

/// The largest of eight int32s.
DILOCO_AVX2_INLINE std::int32_t max8(__m256i m) {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  x = _mm_max_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_max_epi32(x, _mm_shuffle_epi32(x, 0xb1));
  return _mm_cvtsi128_si32(x);
}

/// A block's quantization constants, when its amax takes quantize_block's
/// common path (positive, finite, L / amax finite, amax / L normal) or is
/// zero: an all-zero block (a frozen layer's every round) codes q = 0 and
/// decodes +0, which inv = scale = 0 reproduce (y = +-0 rounds to +0).
struct block_scale {
  float amax, inv, scale;
  bool common;
};
inline block_scale scale_of(std::int32_t max_bits, float levels) {
  block_scale s{};
  std::memcpy(&s.amax, &max_bits, 4);
  if (s.amax == 0.0f) {
    s.common = true;
    return s;
  }
  s.inv = levels / s.amax;
  s.scale = s.amax / levels;
  s.common = s.amax > 0.0f && s.amax - s.amax == 0.0f && s.inv - s.inv == 0.0f &&
             kernels::scale_is_normal(s.amax, levels);
  return s;
}

/// round_even(y) as int32 in code (int_grid::round<false>: ties to even,
/// the default rounding mode, which every add of the portable code assumes
/// too), and back, for a y that needs no clamp to [-L, L]: the encode's and
/// the reduction's, y = x * inv on a block on the common path (scale_of),
/// where |x| <= amax and inv = L / amax rounded once, so |y| <= L (1 +
/// 2^-24)^2 < L + 1/2, which rounds to at most L. (A non-finite x makes
/// amax non-finite, which leaves the common path; so the portable code's
/// clamp, and the one this had, never acts here: dropping it changed no
/// bit, test_host_simd and test_codec_fast_paths, and saved two operations
/// of about twenty per eight elements.)
DILOCO_AVX2_INLINE __m256 grid_round(__m256 y, __m256i& code) {
  code = _mm256_cvtps_epi32(y);
  return _mm256_cvtepi32_ps(code);
}

/// 32 int32 codes in [-128, 255] (four registers, elements 8k .. 8k + 7 in
/// the k-th) as 32 bytes in element order: Unsigned packs 0..255 (the small
/// floats' codes), signed packs -128..127 (the integer grids' values).
template <bool Unsigned>
DILOCO_AVX2_INLINE __m256i bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {
  // The packs interleave 128-bit halves, which the permutation undoes.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  if constexpr (Unsigned)
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d)), order);
  else
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d)), order);
}

/// Codes of 32 elements (grid values as int32, four registers) into the block's code bytes:
/// int8 one byte each, int4 two to a byte (element 2i in the low nibble).
template <int Bits>
DILOCO_AVX2_INLINE void put_codes32(unsigned char* out, __m256i a, __m256i b, __m256i c, __m256i d) {
  // Saturating packs keep the values (|q| <= 127).
  const __m256i bytes = bytes32<false>(a, b, c, d);
  if constexpr (Bits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
  } else {
    // 16-bit words hold elements (2i, 2i + 1): low nibble of the low byte,
    // then the high byte's low nibble moved up by 4.
    const __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi16(0x000f));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00f0));
    const __m256i words = _mm256_or_si256(lo, hi);
    const __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
  }
}

/// The grid values of 32 codes as floats, in four registers (elements 8k .. 8k + 7 in v[k]).
template <int Bits>
DILOCO_AVX2_INLINE void values32(const unsigned char* in, __m256* v) {
  if constexpr (Bits == 8) {
    for (int k = 0; k < 4; ++k)
      v[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + 8 * k))));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, nib);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), nib);
    // Four-bit two's complement to int8: (c ^ 8) - 8.
    const __m128i eight = _mm_set1_epi8(8);
    const __m128i first = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);   // elements 0..15
    const __m128i second = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);  // 16..31
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8)));
  }
}

/// A format's vector operations, for the passes below: `rank` (what
/// decoding one received block needs of its scale), make_rank(amax, scale)
/// (false when this form cannot decode such a block bit for bit),
/// decode32(codes, rank, out) (value(q) * scale of 32 elements, in four
/// registers), round8(y, code) (the grid value nearest y, ties to the even
/// code, saturating, for finite y, and its code as int32),
/// put32(out, codes) (32 codes into the block's code bytes), and for the
/// reduction's norm `norm`, make_norm(scale) (once a block) and
/// square8(r, code, norm) ((r * scale)^2: two multiplies, or for fp4 and
/// int2 a lookup by code in a table of those squares, the same products).
template <class Format>
struct ops;

/// The reduction's norm for the formats that multiply: the square of the
/// decoding r * scale by two multiplies.
struct multiplied_squares {
  struct norm {
    __m256 scale;
  };
  DILOCO_AVX2_INLINE static norm make_norm(__m256 scale) { return {scale}; }
  DILOCO_AVX2_INLINE static __m256 square8(__m256 r, __m256i, const norm& n) {
    const __m256 d = _mm256_mul_ps(r, n.scale);
    return _mm256_mul_ps(d, d);
  }
};

/// int8 and int4: the grid values by sign extension and a conversion, the
/// rounding by a conversion to int32 (grid_round).
template <class Format>
  requires(std::is_same_v<Format, int8> || std::is_same_v<Format, int4>)
struct ops<Format> : multiplied_squares {
  static constexpr int bits = Format::bits;
  struct rank {
    __m256 scale;
  };
  DILOCO_AVX2_INLINE static bool make_rank(float, float scale, rank& r) {
    r.scale = _mm256_set1_ps(scale);
    return true;
  }
  DILOCO_AVX2_INLINE static void decode32(const unsigned char* in, const rank& r, __m256* out) {
    values32<bits>(in, out);
    for (int k = 0; k < 4; ++k) out[k] = _mm256_mul_ps(out[k], r.scale);
  }
  DILOCO_AVX2_INLINE static __m256 round8(__m256 y, __m256i& code) {
    return grid_round(y, code);
  }
  DILOCO_AVX2_INLINE static void put32(unsigned char* out, const __m256i* c) {
    put_codes32<bits>(out, c[0], c[1], c[2], c[3]);
  }
};

/// fp8 e4m3 and e5m2. Decoding: the code sign-extended to 32 bits and moved
/// left by 23 - M puts its sign at fp32's and its exponent and mantissa
/// fields under fp32's, so that those bits are value(q) * 2^-(127 - bias)
/// exactly (normal codes as normal floats, subnormal codes as subnormal
/// ones, the spacing matching); one multiply by scale * 2^(127 - bias) is
/// then value(q) * scale, one rounding of the same real product (make_rank
/// refuses a scale whose multiplier overflows, from amax ~1e5 for e4m3).
/// Rounding: |y| (at most L's upper neighbour: round8), added to and subtracted from 2^(e - M + 23),
/// 2^e its binade (its exponent field alone, at least the smallest
/// normal's), which rounds it to the format's spacing there, ties to the
/// even multiple (the even code); the magnitude code is the bits of
/// r * 2^-(127 - bias) moved right by 23 - M; the sign ORed in and + 0
/// added (a negative y that rounds to zero gives +0 and code 0).
template <class Format>
  requires(std::is_same_v<Format, fp8_e4m3> || std::is_same_v<Format, fp8_e5m2>)
struct ops<Format> : multiplied_squares {
  static constexpr int bits = 8;
  static constexpr int M = Format::mantissa_bits, bias = Format::bias;
  static constexpr float down = static_cast<float>(1.0 / static_cast<double>(1ull << 62) /
                                                   static_cast<double>(1ull << (127 - bias - 62)));  // 2^-(127 - bias)
  static constexpr float up = static_cast<float>(static_cast<double>(1ull << 62) *
                                                 static_cast<double>(1ull << (127 - bias - 62)));  // 2^(127 - bias)
  struct rank {
    __m256 mult;
  };
  DILOCO_AVX2_INLINE static bool make_rank(float, float scale, rank& r) {
    const float m = scale * up;
    r.mult = _mm256_set1_ps(m);
    return !(scale - scale == 0.0f) || m - m == 0.0f;  // a finite scale's multiplier must be finite
  }
  DILOCO_AVX2_INLINE static void decode32(const unsigned char* in, const rank& r, __m256* out) {
    const __m256i keep = _mm256_set1_epi32(static_cast<int>(0x80000000u | (0x7fu << (23 - M))));
    for (int k = 0; k < 4; ++k) {
      const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + 8 * k)));
      const __m256i b = _mm256_and_si256(_mm256_slli_epi32(c, 23 - M), keep);
      out[k] = _mm256_mul_ps(_mm256_castsi256_ps(b), r.mult);
    }
  }
  DILOCO_AVX2_INLINE static __m256 round8(__m256 y, __m256i& code) {
    const __m256 sign_bit = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    // |y|, unclamped: on the blocks round8 takes |y| <= L (1 + 2^-24)^2,
    // which rounds to L (grid_round's bound; L is a grid value far more
    // than that below the next binade's midpoint), and y is finite.
    const __m256 a = _mm256_andnot_ps(sign_bit, y);
    // 2^e of a's binade (its exponent field alone), at least the smallest
    // normal's 2^(1 - bias) (which zero and the subnormals take), times
    // 2^(23 - M): an exact power of two whose ulp is the format's spacing.
    const __m256 binade = _mm256_max_ps(_mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000))),
                                        _mm256_set1_ps(kernels::minifloat_grid<Format>::value_branchless(1u << M)));
    const __m256 magic = _mm256_mul_ps(binade, _mm256_set1_ps(static_cast<float>(1u << (23 - M))));
    const __m256 r = _mm256_sub_ps(_mm256_add_ps(a, magic), magic);
    const __m256i mag = _mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(r, _mm256_set1_ps(down))), 23 - M);
    // The sign where y < 0, then + 0: -0 (y < 0 rounded to zero) becomes
    // +0, code 0.
    const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_LT_OQ), sign_bit);
    const __m256 rs = _mm256_add_ps(_mm256_or_ps(r, neg), _mm256_setzero_ps());
    code = _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(rs), 24), _mm256_set1_epi32(0x80)));
    return rs;
  }
  DILOCO_AVX2_INLINE static void put32(unsigned char* out, const __m256i* c) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes32<true>(c[0], c[1], c[2], c[3]));
  }
};

/// fp4 e3m0: decoding looks each magnitude up in a table of the eight
/// value(m) * scale (vpermps), the sign ORed in (so make_rank refuses a
/// non-finite amax, whose NaN products would keep their own sign). Rounding
/// of |y| to nearest with ties to the even code: at or above
/// the smallest normal 2^(1 - bias), on the bit pattern (half an exponent
/// step less one plus the exponent's lowest bit, which is the code's,
/// then truncated); below it, 0 or 2^(1 - bias), ties to 0 (codes8); the
/// grid value, and the encode's decoding, looked up by the code.
template <class Format>
  requires std::is_same_v<Format, fp4_e3m0>
struct ops<Format> {
  static constexpr int bits = 4;
  static constexpr int bias = Format::bias;
  struct rank {
    __m256 table;
  };
  DILOCO_AVX2_INLINE static bool make_rank(float amax, float scale, rank& r) {
    // value(m) * scale for m = 0..7: eight products, each rounded once, as the scalar ones.
    r.table = _mm256_mul_ps(values8(), _mm256_set1_ps(scale));
    return amax - amax == 0.0f;
  }
  DILOCO_AVX2_INLINE static void decode32(const unsigned char* in, const rank& r, __m256* out) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i sign_bit = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    for (int k = 0; k < 4; ++k) {
      std::int32_t w;
      std::memcpy(&w, in + 4 * k, 4);
      const __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(w), shifts);  // code of element 8k + i in lane i's low bits
      const __m256 mag = _mm256_permutevar8x32_ps(r.table, c);                // by the low three bits
      out[k] = _mm256_or_ps(mag, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 28), sign_bit)));
    }
  }
  /// The eight magnitudes value(m), m = 0..7.
  DILOCO_AVX2_INLINE static __m256 values8() {
    using grid = kernels::minifloat_grid<Format>;
    return _mm256_setr_ps(grid::value_branchless(0), grid::value_branchless(1), grid::value_branchless(2),
                          grid::value_branchless(3), grid::value_branchless(4), grid::value_branchless(5),
                          grid::value_branchless(6), grid::value_branchless(7));
  }
  /// The codes of y (returned), their magnitude codes `mag` and their sign
  /// (`sign`: fp32's sign bit where it is set). |y| (unclamped: on the blocks
  /// codes8 takes, |y| <= L (1 + 2^-24)^2, whose exponent field is L's,
  /// a power of two, and y is finite), with its
  /// exponent field rounded to nearest on the bit pattern (half an exponent
  /// step less one plus the exponent's lowest bit, the code's, then
  /// truncated) less 127 - bias is the code where |y| is normal; below the
  /// smallest normal that is at most 0, and the code is 1 (the normal)
  /// where |y| exceeds half of it, else 0: so max(code, 1) where |y| > half
  /// the normal (which every normal |y| is), else 0. The sign where y < 0
  /// and the code is not 0.
  DILOCO_AVX2_INLINE static __m256i codes8(__m256 y, __m256i& mag, __m256i& sign) {
    const __m256i sign_bit = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    const __m256 a = _mm256_andnot_ps(_mm256_castsi256_ps(sign_bit), y);
    const __m256i ab = _mm256_castps_si256(a);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ab, 23), _mm256_set1_epi32(1));
    // ((ab + 0x3fffff + odd) >> 23) - (127 - bias), the subtraction moved
    // under an arithmetic shift (which floors: the same integer).
    const __m256i e = _mm256_srai_epi32(
        _mm256_add_epi32(_mm256_add_epi32(ab, _mm256_set1_epi32(0x3fffff - ((127 - bias) << 23))), odd), 23);
    const float min_normal = kernels::minifloat_grid<Format>::value_branchless(1);
    const __m256i nz = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.5f * min_normal), _CMP_GT_OQ));
    mag = _mm256_and_si256(_mm256_max_epi32(e, _mm256_set1_epi32(1)), nz);
    // y's sign bit where the code is not 0 (y < 0 there: -0 has code 0),
    // moved down to the code's bit 3.
    sign = _mm256_and_si256(_mm256_and_si256(_mm256_castps_si256(y), nz), sign_bit);
    return _mm256_or_si256(mag, _mm256_srli_epi32(sign, 28));
  }
  /// table[mag] with `sign` ORed in.
  DILOCO_AVX2_INLINE static __m256 signed_lookup(__m256 table, __m256i mag, __m256i sign) {
    return _mm256_or_ps(_mm256_permutevar8x32_ps(table, mag), _mm256_castsi256_ps(sign));
  }
  DILOCO_AVX2_INLINE static __m256 round8(__m256 y, __m256i& code) {
    __m256i mag, sign;
    code = codes8(y, mag, sign);
    return signed_lookup(values8(), mag, sign);
  }
  /// The square of the decoding r * scale, looked up by the magnitude's
  /// code (the sign does not change it) in the eight (value(m) * scale)^2:
  /// the same two products, made once a block.
  struct norm {
    __m256 sq;
  };
  DILOCO_AVX2_INLINE static norm make_norm(__m256 scale) {
    const __m256 d = _mm256_mul_ps(values8(), scale);
    return {_mm256_mul_ps(d, d)};
  }
  DILOCO_AVX2_INLINE static __m256 square8(__m256, __m256i code, const norm& n) {
    return _mm256_permutevar8x32_ps(n.sq, code);  // by the low three bits
  }
  /// The encode's rounding with the decoding dq = r * scale looked up by
  /// the magnitude's code in the eight value(m) * scale (`products`, made
  /// once a block: the same products), the sign ORed in; the codes as
  /// round8's.
  struct products {
    __m256 t;
  };
  DILOCO_AVX2_INLINE static products make_products(__m256 scale) { return {_mm256_mul_ps(values8(), scale)}; }
  DILOCO_AVX2_INLINE static __m256 round_dq8(__m256 y, __m256i& code, const products& p) {
    __m256i mag, sign;
    code = codes8(y, mag, sign);
    return signed_lookup(p.t, mag, sign);
  }
  DILOCO_AVX2_INLINE static void put32(unsigned char* out, const __m256i* c) {
    put_codes32<4>(out, c[0], c[1], c[2], c[3]);
  }
};

/// int2: decoding looks each code up in a table of value(c) * scale, twice
/// over (vpermps reads an index's low three bits, so a code's neighbour
/// above it does not matter); rounding by three comparisons (y > -2,
/// y >= 0, y > 2 count the code, as int2_grid::round's branches choose).
template <class Format>
  requires std::is_same_v<Format, int2>
struct ops<Format> {
  static constexpr int bits = 2;
  struct rank {
    __m256 table;
  };
  DILOCO_AVX2_INLINE static bool make_rank(float, float scale, rank& r) {
    r.table = _mm256_mul_ps(_mm256_setr_ps(-3.0f, -1.0f, 1.0f, 3.0f, -3.0f, -1.0f, 1.0f, 3.0f), _mm256_set1_ps(scale));
    return true;
  }
  DILOCO_AVX2_INLINE static void decode32(const unsigned char* in, const rank& r, __m256* out) {
    // The 16 bits of elements 8k .. 8k + 7 in both halves of every 32-bit
    // lane (one broadcast from memory), lane i moved right by 2i: its code
    // in the low two bits (the third, the next code's or the copy's, picks
    // the table's second copy).
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int k = 0; k < 4; ++k) {
      std::int16_t w;
      std::memcpy(&w, in + 2 * k, 2);
      out[k] = _mm256_permutevar8x32_ps(r.table, _mm256_srlv_epi32(_mm256_set1_epi16(w), shifts));
    }
  }
  DILOCO_AVX2_INLINE static __m256 round8(__m256 y, __m256i& code) {
    const __m256i a = _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_set1_ps(-2.0f), _CMP_GT_OQ));
    const __m256i b = _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GE_OQ));
    const __m256i c = _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_set1_ps(2.0f), _CMP_GT_OQ));
    code = _mm256_sub_epi32(_mm256_sub_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), a), b), c);
    return _mm256_permutevar8x32_ps(_mm256_setr_ps(-3.0f, -1.0f, 1.0f, 3.0f, -3.0f, -1.0f, 1.0f, 3.0f), code);
  }
  /// The square of the decoding r * scale, looked up by code in the four
  /// (value(c) * scale)^2 (twice over): the same two products, made once a
  /// block.
  struct norm {
    __m256 sq;
  };
  DILOCO_AVX2_INLINE static norm make_norm(__m256 scale) {
    const __m256 d = _mm256_mul_ps(_mm256_setr_ps(-3.0f, -1.0f, 1.0f, 3.0f, -3.0f, -1.0f, 1.0f, 3.0f), scale);
    return {_mm256_mul_ps(d, d)};
  }
  DILOCO_AVX2_INLINE static __m256 square8(__m256, __m256i code, const norm& n) {
    return _mm256_permutevar8x32_ps(n.sq, code);
  }
  DILOCO_AVX2_INLINE static void put32(unsigned char* out, const __m256i* c) {
    // One code a byte, then (b0 + 4 b1) per 16-bit word and (w0 + 16 w1) per 32-bit one:
    // element 4i + k at bits 2k of byte i.
    const __m256i bytes = bytes32<true>(c[0], c[1], c[2], c[3]);
    const __m256i words = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x0401));
    const __m256i quads = _mm256_madd_epi16(words, _mm256_set1_epi32(0x00100001));
    // The low byte of each 32-bit lane, in order: bytes 0, 4, 8, 12 of each half.
    const __m256i gathered = _mm256_shuffle_epi8(
        quads, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
                                -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const std::uint32_t lo = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(gathered)));
    const std::uint32_t hi = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(gathered, 1)));
    const std::uint64_t packed = lo | (static_cast<std::uint64_t>(hi) << 32);
    std::memcpy(out, &packed, 8);
  }
};

/// A format's `products` (the table its encode looks its decoding up in),
/// or int where it multiplies instead.
template <class O>
struct products_of {
  using type = int;
};
template <class O>
  requires requires { typename O::products; }
struct products_of<O> {
  using type = typename O::products;
};

/// What quantize_into does with each element's dq in the encode pass: it
/// writes the residual decay * (v - dq) (when it keeps one) and sums the
/// squares of v - dq (the reduction's quantize_group sums those of dq).
struct residual_sink {
  float* next;  ///< the new residual, or nullptr
  __m256 decay;
  bool scaled;  ///< decay != 1
  DILOCO_AVX2_INLINE __m256 operator()(std::size_t j, __m256 x, __m256 dq) const {
    const __m256 err = _mm256_sub_ps(x, dq);
    if (next) _mm256_storeu_ps(next + j, scaled ? _mm256_mul_ps(decay, err) : err);
    return err;
  }
};

/// Quantizes the block v[0, B) (its scale common) into `codes`; each
/// element's dq goes to sink(j, v, dq) (8 at a time), whose result's
/// squares the L norm lanes sum.
template <class Format, std::size_t B, std::size_t L, class Sink>
DILOCO_AVX2_INLINE double quantize_into(const float* v, const block_scale& s, unsigned char* codes, const Sink& sink) {
  __m256 acc[L / 8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 inv = _mm256_set1_ps(s.inv), scale = _mm256_set1_ps(s.scale);
  // (No lambda here: Clang compiles a lambda without its function's target.)
  constexpr bool looked_up = requires { ops<Format>::make_products(scale); };
  [[maybe_unused]] typename products_of<ops<Format>>::type products{};
  if constexpr (looked_up) products = ops<Format>::make_products(scale);
  for (std::size_t j = 0; j < B; j += 32) {
    __m256i q[4];
    for (std::size_t k = 0; k < 4; ++k) {
      const __m256 x = _mm256_loadu_ps(v + j + 8 * k);
      __m256 dq;
      if constexpr (looked_up)
        dq = ops<Format>::round_dq8(_mm256_mul_ps(x, inv), q[k], products);
      else
        dq = _mm256_mul_ps(ops<Format>::round8(_mm256_mul_ps(x, inv), q[k]), scale);
      const __m256 n = sink(j + 8 * k, x, dq);
      __m256& a = acc[((j + 8 * k) / 8) % (L / 8)];
      a = _mm256_add_ps(a, _mm256_mul_ps(n, n));
    }
    ops<Format>::put32(codes + j * Format::bits / 8, q);
  }
  return lane_tree8<L>(acc);
}

}  // namespace detail

/// encode_pseudo_gradient's block of B elements (v = (g - l) + e, encoded
/// into `out`, the new residual decay * (v - dq) into `next`, the sums
/// ||g - l||^2 and ||v - dq||^2 into delta_sq and error_sq in L lanes), when
/// its scale takes the common path; false (having written nothing) when not.
template <class Format, std::size_t B, std::size_t L>
DILOCO_AVX2 bool encode_block(const float* g, const float* l, const float* e, float* next, float decay,
                              std::byte* out, double& delta_sq, double& error_sq) {
  static_assert(B % 32 == 0 && L % 8 == 0 && B % L == 0, "whole 32-element steps and whole lanes");
  alignas(32) float v[B];
  __m256 acc[L / 8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256i mbits = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  for (std::size_t j = 0; j < B; j += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(g + j), _mm256_loadu_ps(l + j));
    const __m256 x = e ? _mm256_add_ps(d, _mm256_loadu_ps(e + j)) : d;
    _mm256_store_ps(v + j, x);
    __m256& a = acc[(j / 8) % (L / 8)];
    a = _mm256_add_ps(a, _mm256_mul_ps(d, d));
    mbits = _mm256_max_epi32(mbits, _mm256_and_si256(_mm256_castps_si256(x), abs_mask));
  }
  const detail::block_scale s = detail::scale_of(detail::max8(mbits), Format::levels);
  if (!s.common) return false;
  delta_sq = detail::lane_tree8<L>(acc);
  std::memcpy(out, &s.amax, 4);
  error_sq = detail::quantize_into<Format, B, L>(v, s, reinterpret_cast<unsigned char*>(out + 4),
                                                 detail::residual_sink{next, _mm256_set1_ps(decay), decay != 1.0f});
  return true;
}

namespace detail {

/// The mean of one block's M received encodings (rank k's at in[k] + at),
/// decoded, summed in rank order and divided by M, into mean[0, B), and the
/// bits of its largest magnitude into max_bits. False (mean unwritten) when
/// a received factor leaves the common path or the decoding refuses it.
template <class Format, std::size_t B>
DILOCO_AVX2_INLINE bool block_mean(const std::byte* const* in, std::size_t at, int world, float* mean,
                                   std::int32_t& max_bits) {
  constexpr float levels = Format::levels;
  using fmt = ops<Format>;
  typename fmt::rank ranks[max_world];
  for (int k = 0; k < world; ++k) {
    float amax;
    std::memcpy(&amax, in[k] + at, 4);
    // blockwise_codec::decode multiplies by amax / L when that is normal or
    // amax is not finite, and computes (q * amax) / L otherwise, which for
    // amax = 0 is q * 0 (+-0 by q's sign) too; other tiny factors take the
    // portable path.
    if (!(kernels::scale_is_normal(amax, levels) || !(amax - amax == 0.0f) || amax == 0.0f)) return false;
    if (!fmt::make_rank(amax, amax / levels, ranks[k])) return false;
  }
  // acc / M: for M a power of two, acc * (1 / M) is the same real number,
  // so the same correctly rounded float, and a multiply is several times
  // cheaper than a divide.
  const __m256 m = _mm256_set1_ps(static_cast<float>(world));
  const bool pow2 = (world & (world - 1)) == 0;
  const __m256 rcp = _mm256_set1_ps(1.0f / static_cast<float>(world));
  __m256i mbits = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  for (std::size_t j = 0; j < B; j += 32) {
    __m256 acc[4], x[4];
    fmt::decode32(reinterpret_cast<const unsigned char*>(in[0] + at + 4) + j * Format::bits / 8, ranks[0], acc);
    for (int k = 1; k < world; ++k) {
      fmt::decode32(reinterpret_cast<const unsigned char*>(in[k] + at + 4) + j * Format::bits / 8, ranks[k], x);
      for (int i = 0; i < 4; ++i) acc[i] = _mm256_add_ps(acc[i], x[i]);
    }
    for (int i = 0; i < 4; ++i) {
      const __m256 y = pow2 ? _mm256_mul_ps(acc[i], rcp) : _mm256_div_ps(acc[i], m);
      _mm256_store_ps(mean + j + 8 * i, y);
      mbits = _mm256_max_epi32(mbits, _mm256_and_si256(_mm256_castps_si256(y), abs_mask));
    }
  }
  max_bits = max8(mbits);
  return true;
}

/// The reduction's quantization of P blocks (scales common), quantize_into's
/// steps with the squares of dq summed, their steps interleaved (32
/// elements of each block in turn) so that their norm lanes' sums, each a
/// chain of dependent adds, run side by side: block p's mean v[p] (scale
/// s[p]) into codes[p], the squared norm of its decoding into norm[p], each
/// the bits it has alone.
template <class Format, std::size_t B, std::size_t L, std::size_t P>
DILOCO_AVX2_INLINE void quantize_group(const float* const* v, const block_scale* const* s,
                                       unsigned char* const* codes, double* const* norm) {
  __m256 acc[P][L / 8];
  for (auto& a : acc)
    for (auto& x : a) x = _mm256_setzero_ps();
  typename ops<Format>::norm nrm[P];
  for (std::size_t p = 0; p < P; ++p) nrm[p] = ops<Format>::make_norm(_mm256_set1_ps(s[p]->scale));
  for (std::size_t j = 0; j < B; j += 32)
    for (std::size_t p = 0; p < P; ++p) {
      const __m256 inv = _mm256_set1_ps(s[p]->inv);
      __m256i q[4];
      for (std::size_t k = 0; k < 4; ++k) {
        const __m256 r = ops<Format>::round8(_mm256_mul_ps(_mm256_loadu_ps(v[p] + j + 8 * k), inv), q[k]);
        __m256& a = acc[p][((j + 8 * k) / 8) % (L / 8)];
        a = _mm256_add_ps(a, ops<Format>::square8(r, q[k], nrm[p]));
      }
      ops<Format>::put32(codes[p] + j * Format::bits / 8, q);
    }
  for (std::size_t p = 0; p < P; ++p) *norm[p] = lane_tree8<L>(acc[p]);
}

/// reduce_blocks' middle phase, the same in every instruction set (no
/// vectors): each block of `done` gets its scale (scale[j]) from its mean's
/// largest magnitude's bits (max_bits[j]); a block whose scale leaves the
/// common path is dropped from `done`; the others have their amax written
/// at the front of their output block (out + j * stride) and are listed in
/// order (their mean, scale, code bytes and norm slot). Returns how many.
template <std::size_t K>
struct run_plan {
  block_scale scale[K];        ///< block j's scale (blocks of `done`)
  const float* v[K];           ///< the listed blocks' means
  const block_scale* s[K];     ///< their scales
  unsigned char* codes[K];     ///< their code bytes
  double* norms[K];            ///< their norms' slots
  template <std::size_t B>
  std::size_t make(unsigned& done, const std::int32_t* max_bits, const float (*mean)[B], float levels,
                   std::byte* out, std::size_t stride, double* norm_sq) {
    std::size_t taken = 0;
    for (std::size_t j = 0; j < K; ++j) {
      if (!(done >> j & 1u)) continue;
      scale[j] = scale_of(max_bits[j], levels);
      if (!scale[j].common) {
        done &= ~(1u << j);
        continue;
      }
      std::byte* o = out + j * stride;
      std::memcpy(o, &scale[j].amax, 4);
      v[taken] = mean[j];
      s[taken] = &scale[j];
      codes[taken] = reinterpret_cast<unsigned char*>(o + 4);
      norms[taken] = &norm_sq[j];
      ++taken;
    }
    return taken;
  }
};

}  // namespace detail

/// reduce_shard's blocks of B elements, a run of up to K consecutive ones
/// of a shard: block j (j < K) at in[k] + j * stride in rank k's encoding
/// and at out + j * stride in the reduced one. Each block of `want` (bit j:
/// block j) has its M received blocks decoded, summed in rank order,
/// divided by M and re-encoded into `out`, the squared norm of the
/// re-encoded block into norm_sq[j]. The run goes in three phases (every
/// block's mean, then every scale, then the quantizations two blocks at a
/// time), so that the out-of-order core overlaps the independent blocks'
/// dependent chains (the block max, its scale, the norm lanes' sums)
/// instead of waiting on one block's at a time; each block's operations are
/// those it has alone, so the same bits. Returns the blocks it wrote (bit
/// j: block j); the others, whose received factor or mean's scale leaves
/// the common path, it leaves untouched, for the portable code.
template <class Format, std::size_t B, std::size_t L, std::size_t K>
DILOCO_AVX2 unsigned reduce_blocks(const std::byte* const* in, std::size_t stride, int world, unsigned want,
                                   std::byte* out, double* norm_sq) {
  static_assert(B % 32 == 0 && L % 8 == 0 && B % L == 0, "whole 32-element steps and whole lanes");
  static_assert(K >= 1 && K <= 32, "a run's blocks are the bits of an unsigned");
  if (world < 1 || world > max_world) return 0;
  alignas(32) float mean[K][B];
  std::int32_t max_bits[K];
  unsigned done = 0;
  for (std::size_t j = 0; j < K; ++j)
    if ((want >> j & 1u) && detail::block_mean<Format, B>(in, j * stride, world, mean[j], max_bits[j]))
      done |= 1u << j;
  detail::run_plan<K> plan;
  const std::size_t taken = plan.make(done, max_bits, mean, Format::levels, out, stride, norm_sq);
  // The blocks taken, in order, quantized two at a time (their norm chains
  // side by side), then the odd one alone; fp8 and fp4, whose rounding
  // takes more registers, one at a time (pairs measured no faster).
  std::size_t i = 0;
  if constexpr (std::is_same_v<Format, int8> || std::is_same_v<Format, int4> || std::is_same_v<Format, int2>)
    for (; i + 2 <= taken; i += 2)
      detail::quantize_group<Format, B, L, 2>(plan.v + i, plan.s + i, plan.codes + i, plan.norms + i);
  for (; i < taken; ++i)
    detail::quantize_group<Format, B, L, 1>(plan.v + i, plan.s + i, plan.codes + i, plan.norms + i);
  return done;
}

/// reduce_blocks for one block: `in[k]` is rank k's encoding of it; false
/// (having written nothing) where it leaves the common path.
template <class Format, std::size_t B, std::size_t L>
DILOCO_AVX2 bool reduce_block(const std::byte* const* in, int world, std::byte* out, double& norm_sq) {
  return reduce_blocks<Format, B, L, 1>(in, 0, world, 1u, out, &norm_sq) != 0u;
}

#undef DILOCO_AVX2_INLINE
#undef DILOCO_AVX2

#endif  // DILOCO_HOST_SIMD_X86

// The block loops of every blockwise format with round to nearest (int8,
// int4, int2, fp8 e4m3 and e5m2, fp4 e3m0) and of cast<bf16> with round to
// nearest (bf16_loops): the shard reduction's block
// (decode M blocks, sum in rank order, divide by M, re-encode, the norm of
// what it encodes) and the encode pass's block (v = (g - l) + e, encoded,
// the new residual and both norms), each as a few loops over a whole block
// that compilers vectorize at the baseline ISA: each code's value without
// a branch (a table load per code does not vectorize), the rounding without
// a branch (the grid's round_nearest_code for the small floats, round<false>
// and code() for the integer grids), the norm lanes as whole vectors, codes
// packed a 64-bit word at a time (packed_codes::pack), and in the reduction
// sub-byte codes unpacked, summed, re-rounded and packed in plane order
// (code i of every value byte together). The same IEEE operations per element as the
// portable pass (blockwise_codec::decode / encode and quantize_block), in
// the same order, and the norms in the same lanes and tree, so the same
// bytes and bits; a block whose factor leaves the common path (a tiny
// nonzero scale, an infinite or NaN amax) returns false and takes the
// portable code. Each is compiled twice: as it is, and for AVX2
// (__attribute__((target("avx2"))), no FMA, so the same bits), chosen at
// run time by enabled(). Not under nvcc (its host code runs the portable
// passes, as above).
#if !defined(__CUDACC__)
/// Defined where block_loops is compiled in (every host compiler but nvcc).
#define DILOCO_HOST_BLOCK_LOOPS 1

/// How far ahead of the block it encodes the encode pass asks for the
/// streams it reads (prefetch_ahead): 2 KiB, four blocks of 128 floats.
/// The CPU's own prefetchers stop at every 4 KiB page and ramp up again;
/// the encode pass without error feedback went from 0.69-0.89 to 0.89-1.07
/// of triad with it (docs/performance.md, "Prefetching the encode's
/// streams").
inline constexpr std::size_t prefetch_distance = 2048;

/// Asks the CPU to bring the cache lines of [p + ahead, p + ahead + bytes)
/// in: a hint, which changes no result and cannot fault (the addresses may
/// lie past the end of p's array; they are formed as integers).
DILOCO_FORCEINLINE void prefetch_ahead(const void* p, std::size_t ahead, std::size_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + ahead;
  for (std::size_t c = 0; c < bytes; c += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + c), 0, 3);
#else
  (void)p;
  (void)ahead;
  (void)bytes;
#endif
}

/// reduce and encode of a loops struct (block_loops, bf16_loops) as
/// compiled for the baseline ISA, for AVX2 (where compiled in), and the
/// widest the CPU runs (enabled()); Loops gives the two as always-inline
/// statics, which each of these compiles in its own target.
template <class Loops>
struct dispatch {
  ///@{
  /// reduce (Loops::reduce's contract) on the baseline ISA, AVX2, or the widest the CPU runs.
  static bool reduce_baseline(const std::byte* const* in, int world, std::byte* out, double& norm_sq) {
    return Loops::reduce(in, world, out, norm_sq);
  }
#if defined(DILOCO_HOST_SIMD_X86)
  __attribute__((target("avx2"))) static bool reduce_avx2(const std::byte* const* in, int world, std::byte* out,
                                                          double& norm_sq) {
    return Loops::reduce(in, world, out, norm_sq);
  }
#endif
  /// reduce on the widest ISA the CPU runs.
  static bool reduce_any(const std::byte* const* in, int world, std::byte* out, double& norm_sq) {
#if defined(DILOCO_HOST_SIMD_X86)
    if (enabled()) return reduce_avx2(in, world, out, norm_sq);
#endif
    return reduce_baseline(in, world, out, norm_sq);
  }
  ///@}
  ///@{
  /// encode (Loops::encode's contract) on the baseline ISA, AVX2, or the widest the CPU runs.
  static bool encode_baseline(const float* g, const float* l, const float* e, float* next, float decay,
                              std::byte* out, double& delta_sq, double& error_sq) {
    return Loops::encode(g, l, e, next, decay, out, delta_sq, error_sq);
  }
#if defined(DILOCO_HOST_SIMD_X86)
  __attribute__((target("avx2"))) static bool encode_avx2(const float* g, const float* l, const float* e,
                                                          float* next, float decay, std::byte* out,
                                                          double& delta_sq, double& error_sq) {
    return Loops::encode(g, l, e, next, decay, out, delta_sq, error_sq);
  }
#endif
  /// encode on the widest ISA the CPU runs.
  static bool encode_any(const float* g, const float* l, const float* e, float* next, float decay, std::byte* out,
                         double& delta_sq, double& error_sq) {
#if defined(DILOCO_HOST_SIMD_X86)
    if (enabled()) return encode_avx2(g, l, e, next, decay, out, delta_sq, error_sq);
#endif
    return encode_baseline(g, l, e, next, decay, out, delta_sq, error_sq);
  }
  ///@}
};

template <class Format, std::size_t B, std::size_t L>
struct block_loops;

/// Which codecs block_loops serves: blockwise with round to nearest, B a
/// multiple of 8 (whole 64-bit words of unpacked codes); `loops<L>` are
/// theirs with L norm lanes.
template <class Codec>
struct fused : std::false_type {};
/// Blockwise codecs with round to nearest: block_loops.
template <class Format, std::size_t B>
struct fused<compress::blockwise_codec<Format, B, compress::round_nearest>> : std::bool_constant<B % 8 == 0> {
  /// The loops with L norm lanes.
  template <std::size_t L>
  using loops = block_loops<Format, B, L>;
};


template <std::size_t B, std::size_t L>
struct bf16_loops;
/// cast<bf16> with round to nearest: bf16_loops.
template <std::size_t B>
struct fused<compress::cast_codec<bf16, compress::round_nearest, B>> : std::bool_constant<B % 8 == 0> {
  /// The loops with L norm lanes.
  template <std::size_t L>
  using loops = bf16_loops<B, L>;
};

/// The fused block loops of blockwise_codec<Format, B, round_nearest> with
/// L norm lanes (kernels::norm_lanes(B)).
template <class Format, std::size_t B, std::size_t L>
struct block_loops : dispatch<block_loops<Format, B, L>> {
  static_assert(B % 8 == 0 && B % L == 0 && L > 0 && (L & (L - 1)) == 0, "whole words of codes and whole lanes");
  ///@{
  /// The format, its bits per code, its largest value, its grid.
  using format_type = Format;
  static constexpr int bits = Format::bits;
  static constexpr float levels = Format::levels;
  using grid_type = kernels::grid_t<Format>;
  ///@}

  /// The grid value of code c, without a branch (the grid's value()).
  DILOCO_FORCEINLINE static float value(std::uint32_t c) {
    if constexpr (requires { grid_type::value_branchless(c); })
      return grid_type::value_branchless(c);
    else
      return grid_type::value(c);
  }

  /// The grid value y rounds to (to the nearest, ties to even) and its code
  /// (the grid's round<false> and code()).
  DILOCO_FORCEINLINE static float round_code(float y, std::uint32_t& c) {
    if constexpr (requires(unsigned u) { grid_type::round_nearest_code(y, u); }) {
      unsigned u;
      const float r = grid_type::round_nearest_code(y, u);
      c = u;
      return r;
    } else {
      constexpr auto g = kernels::grid<Format>();
      const float r = g.template round<false>(y, 0.0f);
      c = g.code(r);
      return r;
    }
  }

  /// lane_tree (kernels/compressed_passes.hpp): acc[l] += acc[l + w] for w = L / 2, ..., 1.
  DILOCO_FORCEINLINE static double tree(float* acc) {
    for (std::size_t w = L / 2; w > 0; w /= 2)
      for (std::size_t l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
    return static_cast<double>(acc[0]);
  }

  /// The scale terms of a block whose amax is `amax` when it takes the
  /// common path (positive, finite, L / amax finite, amax / L normal) or
  /// is zero (inv = scale = 0 then give every element code(0) and dq = +0,
  /// quantize_block's zero block); false otherwise.
  DILOCO_FORCEINLINE static bool terms(float amax, float& inv, float& scale) {
    if (amax == 0.0f) {
      inv = scale = 0.0f;
      return true;
    }
    inv = levels / amax;
    scale = amax / levels;
    return amax > 0.0f && amax - amax == 0.0f && inv - inv == 0.0f && scale >= 1.17549435e-38f;
  }

  /// The squares of n[0, B) summed in L lanes (element j in lane j % L, in
  /// order: lane_squares' sums), then the lanes by tree().
  DILOCO_FORCEINLINE static double squares(const float* DILOCO_RESTRICT n) {
    float acc[L] = {};
    for (std::size_t j0 = 0; j0 < B; j0 += L)
      for (std::size_t l = 0; l < L; ++l) acc[l] = acc[l] + n[j0 + l] * n[j0 + l];
    return tree(acc);
  }

  /// a[j] = value(q[j]) * s (First) or a[j] + value(q[j]) * s, j in [0, B).
  template <bool First>
  DILOCO_FORCEINLINE static void accumulate(float* DILOCO_RESTRICT a, const unsigned char* DILOCO_RESTRICT q, float s) {
    if constexpr (First) {
      for (std::size_t j = 0; j < B; ++j) a[j] = value(q[j]) * s;
    } else {
      alignas(64) float d[B];
      for (std::size_t j = 0; j < B; ++j) d[j] = value(q[j]) * s;
      for (std::size_t j = 0; j < B; ++j) a[j] = a[j] + d[j];
    }
  }

  /// x[0, B) rounded against inv and scale: the codes into c, dq into d.
  DILOCO_FORCEINLINE static void round_block(const float* DILOCO_RESTRICT x, float inv, float scale,
                                             unsigned char* DILOCO_RESTRICT c, float* DILOCO_RESTRICT d) {
    // The codes as 32-bit words first, narrowed to bytes in a loop of their
    // own: one loop that rounds a vector at a time and one that packs,
    // rather than one that rounds four vectors per byte vector and spills.
    alignas(64) std::uint32_t wide[B];
    for (std::size_t j = 0; j < B; ++j) {
      std::uint32_t cj;
      const float r = round_code(x[j] * inv, cj);
      wide[j] = cj;
      d[j] = r * scale;
    }
    for (std::size_t j = 0; j < B; ++j) c[j] = static_cast<unsigned char>(wide[j]);
  }

  /// Quantizes x[0, B) against its amax into `out` (factor, codes) and dq
  /// into d; false (nothing written) off the common path.
  DILOCO_FORCEINLINE static bool quantize(const float* x, std::byte* out, float* d) {
    const float amax = kernels::block_amax(x, B);
    float inv, scale;
    if (!terms(amax, inv, scale)) return false;
    std::memcpy(out, &amax, 4);
    alignas(64) unsigned char c[B];
    round_block(x, inv, scale, c, d);
    compress::packed_codes::pack<bits>(c, B, reinterpret_cast<unsigned char*>(out + 4));
    return true;
  }

  /// reduce_shard's block: in[k] is rank k's encoding of the block; the
  /// mean re-encoded into `out`, the squared norm of its decoding into
  /// norm_sq. False (nothing written) where a received factor or the mean's
  /// leaves the common path.
  DILOCO_FORCEINLINE static bool reduce(const std::byte* const* in, int world, std::byte* out, double& norm_sq) {
    if (world < 1 || world > max_world) return false;
    float scales[max_world];
    for (int k = 0; k < world; ++k) {
      float amax;
      std::memcpy(&amax, in[k], 4);
      // decode() multiplies by amax / L when that is normal or amax is not
      // finite, and computes (q * amax) / L otherwise, which for amax = 0 is
      // q * 0 as well; other tiny factors take the portable path.
      if (!(kernels::scale_is_normal(amax, levels) || !(amax - amax == 0.0f) || amax == 0.0f)) return false;
      scales[k] = amax / levels;
    }
    // Sub-byte codes are summed, averaged and re-rounded in plane order
    // (element per_byte * p + i at i * B / per_byte + p: code i of every
    // byte, which a loop of byte shifts unpacks and packs); every step but
    // the norm is element by element, so the order changes nothing, and the
    // norm takes its elements back in order.
    alignas(64) float acc[B];
    alignas(64) unsigned char c[B];
    accumulate<true>(acc, planes(reinterpret_cast<const unsigned char*>(in[0] + 4), c), scales[0]);
    for (int k = 1; k < world; ++k)
      accumulate<false>(acc, planes(reinterpret_cast<const unsigned char*>(in[k] + 4), c), scales[k]);
    // For M a power of two, x * (1 / M) is x / M (the same real number, rounded once).
    const auto m = static_cast<float>(world);
    if ((world & (world - 1)) == 0) {
      const float rcp = 1.0f / m;
      for (std::size_t j = 0; j < B; ++j) acc[j] = acc[j] * rcp;
    } else {
      for (std::size_t j = 0; j < B; ++j) acc[j] = acc[j] / m;
    }
    alignas(64) float dq[B];
    if constexpr (bits == 8) {
      if (!quantize(acc, out, dq)) return false;
      norm_sq = squares(dq);
    } else {
      const float amax = kernels::block_amax(acc, B);
      float inv, scale;
      if (!terms(amax, inv, scale)) return false;
      std::memcpy(out, &amax, 4);
      round_block(acc, inv, scale, c, dq);
      pack_planes(c, reinterpret_cast<unsigned char*>(out + 4));
      alignas(64) float ordered[B];
      for (std::size_t p = 0; p < plane; ++p)
        for (std::size_t i = 0; i < per_byte; ++i) ordered[per_byte * p + i] = dq[i * plane + p];
      norm_sq = squares(ordered);
    }
    return true;
  }

  /// The codes of a whole block in plane order: code i of value byte p at
  /// c[i * B / per_byte + p] (8-bit codes are read in place).
  DILOCO_FORCEINLINE static const unsigned char* planes(const unsigned char* DILOCO_RESTRICT in,
                                                        unsigned char* DILOCO_RESTRICT c) {
    if constexpr (bits == 8) {
      (void)c;
      return in;
    } else {
      // Eight value bytes at a time: a 64-bit word shifted right by
      // bits * i holds code i of each byte in that byte's low bits.
      for (std::size_t w = 0; w < plane / 8; ++w) {
        std::uint64_t x;
        std::memcpy(&x, in + 8 * w, 8);
        for (std::size_t i = 0; i < per_byte; ++i) {
          const std::uint64_t y = (x >> (bits * i)) & low;
          std::memcpy(c + i * plane + 8 * w, &y, 8);
        }
      }
      for (std::size_t p = plane / 8 * 8; p < plane; ++p)  // the bytes after the last whole word
        for (std::size_t i = 0; i < per_byte; ++i)
          c[i * plane + p] = static_cast<unsigned char>((in[p] >> (bits * i)) & ((1u << bits) - 1u));
      return c;
    }
  }
  /// planes()' inverse: the value bytes of codes c in plane order.
  DILOCO_FORCEINLINE static void pack_planes(const unsigned char* DILOCO_RESTRICT c, unsigned char* DILOCO_RESTRICT out) {
    for (std::size_t w = 0; w < plane / 8; ++w) {
      std::uint64_t x = 0;
      for (std::size_t i = 0; i < per_byte; ++i) {
        std::uint64_t y;
        std::memcpy(&y, c + i * plane + 8 * w, 8);
        x |= y << (bits * i);  // each byte's code is below 2^bits: nothing crosses into the next byte
      }
      std::memcpy(out + 8 * w, &x, 8);
    }
    for (std::size_t p = plane / 8 * 8; p < plane; ++p) {
      unsigned byte = 0;
      for (std::size_t i = 0; i < per_byte; ++i) byte |= static_cast<unsigned>(c[i * plane + p]) << (bits * i);
      out[p] = static_cast<unsigned char>(byte);
    }
  }
  ///@{
  /// Codes per value byte, value bytes per block (a plane's codes), a code's mask in every byte.
  static constexpr std::size_t per_byte = 8 / bits, plane = B / per_byte;
  static constexpr std::uint64_t low = 0x0101010101010101ULL * ((1u << bits) - 1u);
  ///@}

  /// encode_pseudo_gradient's block: v = (g - l) + e (v = g - l without a
  /// residual) encoded into `out`; with `next`, the new residual
  /// decay * (v - dq) (v - dq for decay 1); ||g - l||^2 and ||v - dq||^2
  /// into delta_sq and error_sq. False (nothing written) off the common path.
  DILOCO_FORCEINLINE static bool encode(const float* DILOCO_RESTRICT g, const float* DILOCO_RESTRICT l,
                                        const float* DILOCO_RESTRICT e, float* DILOCO_RESTRICT next, float decay,
                                        std::byte* out, double& delta_sq, double& error_sq) {
    alignas(64) float d[B];
    alignas(64) float ve[B];
    for (std::size_t j = 0; j < B; ++j) d[j] = g[j] - l[j];
    if (e)
      for (std::size_t j = 0; j < B; ++j) ve[j] = d[j] + e[j];
    const float* DILOCO_RESTRICT v = e ? ve : d;  // v = (g - l) + e, or g - l
    alignas(64) float dq[B];
    if (!quantize(v, out, dq)) return false;
    delta_sq = squares(d);
    for (std::size_t j = 0; j < B; ++j) dq[j] = v[j] - dq[j];  // the error, in place
    error_sq = squares(dq);
    if (next != nullptr) {
      if (decay == 1.0f)
        for (std::size_t j = 0; j < B; ++j) next[j] = dq[j];
      else
        for (std::size_t j = 0; j < B; ++j) next[j] = decay * dq[j];
    }
    return true;
  }

};

/// The same block loops for cast_codec<bf16, round_nearest, B>: no factor,
/// each element's code the top 16 bits of its fp32 rounded to nearest even
/// (bf16_round_nearest, as cast_codec::encode), its value those bits moved
/// back up (bf16_format::decode).
template <std::size_t B, std::size_t L>
struct bf16_loops : dispatch<bf16_loops<B, L>> {
  static_assert(B % 8 == 0 && B % L == 0 && L > 0 && (L & (L - 1)) == 0, "whole words of codes and whole lanes");
  using same_lanes = block_loops<int8, B, L>;  ///< squares() and tree(), shared

  /// x[0, B) rounded to bf16: the codes into out, dq into d.
  DILOCO_FORCEINLINE static void round_block(const float* DILOCO_RESTRICT x, std::byte* DILOCO_RESTRICT out,
                                             float* DILOCO_RESTRICT d) {
    for (std::size_t j = 0; j < B; ++j) {
      const std::uint16_t h = kernels::bf16_round_nearest(x[j]);
      std::memcpy(out + 2 * j, &h, 2);
      d[j] = kernels::bf16_format::decode(h);
    }
  }
  /// a[j] = value(h[j]) (First) or a[j] + value(h[j]), h the codes at `in`.
  template <bool First>
  DILOCO_FORCEINLINE static void accumulate(float* DILOCO_RESTRICT a, const std::byte* DILOCO_RESTRICT in) {
    if constexpr (First) {
      for (std::size_t j = 0; j < B; ++j) {
        std::uint16_t h;
        std::memcpy(&h, in + 2 * j, 2);
        a[j] = kernels::bf16_format::decode(h);
      }
    } else {  // in two loops, which vectorize inside reduce's loop over ranks
      alignas(64) float d[B];
      accumulate<true>(d, in);
      for (std::size_t j = 0; j < B; ++j) a[j] = a[j] + d[j];
    }
  }
  /// reduce_shard's block (block_loops::reduce's contract; never refuses a block).
  DILOCO_FORCEINLINE static bool reduce(const std::byte* const* in, int world, std::byte* out, double& norm_sq) {
    alignas(64) float acc[B];
    accumulate<true>(acc, in[0]);
    for (int k = 1; k < world; ++k) accumulate<false>(acc, in[k]);
    const auto m = static_cast<float>(world);
    if ((world & (world - 1)) == 0) {
      const float rcp = 1.0f / m;
      for (std::size_t j = 0; j < B; ++j) acc[j] = acc[j] * rcp;
    } else {
      for (std::size_t j = 0; j < B; ++j) acc[j] = acc[j] / m;
    }
    alignas(64) float dq[B];
    round_block(acc, out, dq);
    norm_sq = same_lanes::squares(dq);
    return true;
  }
  /// encode_pseudo_gradient's block (block_loops::encode's contract; never refuses a block).
  DILOCO_FORCEINLINE static bool encode(const float* DILOCO_RESTRICT g, const float* DILOCO_RESTRICT l,
                                        const float* DILOCO_RESTRICT e, float* DILOCO_RESTRICT next, float decay,
                                        std::byte* out, double& delta_sq, double& error_sq) {
    alignas(64) float d[B];
    alignas(64) float ve[B];
    for (std::size_t j = 0; j < B; ++j) d[j] = g[j] - l[j];
    if (e)
      for (std::size_t j = 0; j < B; ++j) ve[j] = d[j] + e[j];
    const float* DILOCO_RESTRICT v = e ? ve : d;  // v = (g - l) + e, or g - l
    alignas(64) float dq[B];
    round_block(v, out, dq);
    delta_sq = same_lanes::squares(d);
    for (std::size_t j = 0; j < B; ++j) dq[j] = v[j] - dq[j];
    error_sq = same_lanes::squares(dq);
    if (next != nullptr) {
      if (decay == 1.0f)
        for (std::size_t j = 0; j < B; ++j) next[j] = dq[j];
      else
        for (std::size_t j = 0; j < B; ++j) next[j] = decay * dq[j];
    }
    return true;
  }
};
#endif  // !__CUDACC__

}  // namespace diloco::kernels::host_simd

DILOCO_EXACT_FP_END
