// SPDX-License-Identifier: Apache-2.0
#pragma once

// The shard reduction's runs of blocks (host_simd::reduce_blocks) in
// AVX-512: sixteen elements a step where host_simd.hpp's AVX2 form takes
// eight, for the same six block formats (int8, int4, int2, fp8 e4m3 and
// e5m2, fp4 e3m0, round to nearest, B a multiple of 32). The reduction is
// compute-bound (M decodings, a sum, a divide, a rounding and a packing per
// element of a block that sits in cache), so the wider vectors, the mask
// registers (int2's rounding is three compares whose masks are its code
// bits, packed by BMI2's pdep) and 16-entry table lookups (fp4's decoding
// with the sign in the table, int2's) shorten it.
//
// Every element gets the IEEE operations of the AVX2 form (and so of the
// portable pass), in the same order: each rank's value(q) * scale, the sum
// in rank order, the divide by M (a multiply by 1 / M where M is a power of
// two: the same real number), the block max as the largest magnitude's
// bits, the rounding, and the norm's squares in the same norm_lanes(B)
// lanes in element order (two steps of eight lanes where L = 8), then
// lane_tree8. So the same bytes and bits, and the same blocks refused (the
// same checks of each received factor and of the mean's scale), which
// test_host_simd checks against the portable code for every path this CPU
// runs. Chosen at run time by host_simd::avx512() (AVX-512 F, DQ, BW, VL
// and BMI2; DILOCO_HOST_SIMD=avx2 keeps the AVX2 form).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "diloco/kernels/host_simd.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels::host_simd {

#if defined(DILOCO_HOST_SIMD_X86)

// GCC 12's unmasked forms of most AVX-512 intrinsics pass an undefined
// vector (_mm512_undefined_*) as the masked instruction's source, which its
// -Wuninitialized and -Wmaybe-uninitialized report where they are inlined
// (GCC bug 105593; every lane is written, so nothing is read).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define DILOCO_AVX512_INLINE __attribute__((target(DILOCO_HOST_AVX512_TARGET), always_inline)) inline
#define DILOCO_AVX512 __attribute__((target(DILOCO_HOST_AVX512_TARGET))) inline

namespace detail512 {

/// 16 int32 codes (lanes 0..15) as 16 bytes, each its low byte.
DILOCO_AVX512_INLINE __m128i low_bytes16(__m512i c) { return _mm512_cvtepi32_epi8(c); }

/// 16 four-bit codes (the low nibble of each int32 lane) as 8 bytes, element
/// 2i in the low nibble of byte i.
DILOCO_AVX512_INLINE void put_nibbles16(unsigned char* out, __m512i c) {
  // Each 64-bit lane holds elements (2i, 2i + 1): the upper one's nibble
  // moved down to bits 4..7 beside the lower one's, then each lane's low byte.
  const __m512i up = _mm512_srli_epi64(c, 28);
  const __m512i byte = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x0f), c, up, 0xca);  // nibble mask ? c : up
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_cvtepi64_epi8(byte));
}

/// 32 four-bit codes given as the even elements' (`even`, lane i: element
/// 2i) and the odd ones' (`odd`, lane i: element 2i + 1), each the low
/// nibble of its int32 lane, as 16 bytes: byte i holds element 2i in its
/// low nibble, 2i + 1 in its high one.
DILOCO_AVX512_INLINE void put_pairs32(unsigned char* out, __m512i even, __m512i odd) {
  const __m512i byte = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x0f), even, _mm512_slli_epi32(odd, 4), 0xca);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(byte));  // each lane's low byte
}

/// 32 four-bit codes (16 bytes, element 2i in the low nibble of byte i)
/// looked up in a 16-entry table: the even elements' values into `even`,
/// the odd ones' into `odd` (lane i: element 2i, 2i + 1).
DILOCO_AVX512_INLINE void nibbles32(const unsigned char* in, __m512 table, __m512& even, __m512& odd) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
  even = _mm512_permutexvar_ps(bytes, table);  // by the low four bits
  odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

/// A format's operations, as host_simd's detail::ops but 16 elements at a
/// time: `rank` and make_rank (the same refusals), decode16(codes, rank)
/// (value(q) * scale of elements 0..15 of `codes`; the four-bit formats
/// have decode32 instead, elements 0..31 as their even and odd ones,
/// nibbles32), round16(y, code) (the
/// grid value nearest y, as ops::round8, and its code in the format's
/// `code` form), put32(out, code[2]) (32 codes into the block's bytes), and
/// make_norm(scale) and square16(r, code, norm) for the reduction's norm
/// ((r * scale)^2, as ops::square8; int4 too looks it up, in 16 entries).
template <class Format>
struct ops;

/// int8 and int4: int8's codes by sign extension and a conversion, int4's
/// by one lookup in a 16-entry table of value(c) * scale (c's two's
/// complement times the scale, each product rounded once, as the
/// conversion's); grid_round's conversion to int32.
template <class Format>
  requires(std::is_same_v<Format, int8> || std::is_same_v<Format, int4>)
struct ops<Format> {
  static constexpr int bits = Format::bits;
  using code = __m512i;
  struct rank {
    __m512 scale;  ///< int8: the scale; int4: the table
  };
  DILOCO_AVX512_INLINE static bool make_rank(float, float scale, rank& r) {
    if constexpr (bits == 8)
      r.scale = _mm512_set1_ps(scale);
    else
      r.scale = _mm512_mul_ps(_mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, -8.0f, -7.0f, -6.0f,
                                             -5.0f, -4.0f, -3.0f, -2.0f, -1.0f),
                              _mm512_set1_ps(scale));
    return true;
  }
  DILOCO_AVX512_INLINE static __m512 decode16(const unsigned char* in, const rank& r)
    requires(bits == 8)
  {
    const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(c), r.scale);
  }
  DILOCO_AVX512_INLINE static void decode32(const unsigned char* in, const rank& r, __m512& even, __m512& odd)
    requires(bits == 4)
  {
    nibbles32(in, r.scale, even, odd);
  }
  /// round_even(y), as int32 in c, and back: grid_round's (no clamp to
  /// [-L, L], which cannot act on the blocks round16 is called on).
  DILOCO_AVX512_INLINE static __m512 round16(__m512 y, code& c) {
    c = _mm512_cvtps_epi32(y);
    return _mm512_cvtepi32_ps(c);
  }
  /// The squares of the decoded grid values r * scale: int8's by two
  /// multiplies, int4's looked up by code in a table of value(c) * scale
  /// squared (the same two products, made once a block).
  struct norm {
    __m512 t;
  };
  DILOCO_AVX512_INLINE static norm make_norm(__m512 scale) {
    if constexpr (bits == 8) {
      return {scale};
    } else {
      const __m512 d = _mm512_mul_ps(_mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, -8.0f, -7.0f,
                                                    -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f),
                                     scale);
      return {_mm512_mul_ps(d, d)};
    }
  }
  DILOCO_AVX512_INLINE static __m512 square16(__m512 r, const code& c, const norm& n) {
    if constexpr (bits == 8) {
      const __m512 d = _mm512_mul_ps(r, n.t);
      return _mm512_mul_ps(d, d);
    } else {
      return _mm512_permutexvar_ps(c, n.t);  // by c's low four bits: its two's complement nibble
    }
  }
  DILOCO_AVX512_INLINE static void put32(unsigned char* out, const code* c) {
    if constexpr (bits == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), low_bytes16(c[0]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), low_bytes16(c[1]));
    } else {
      put_nibbles16(out, c[0]);
      put_nibbles16(out + 8, c[1]);
    }
  }
};

/// fp8 e4m3 and e5m2: ops<Format>'s decoding (the code's bits under
/// fp32's, one multiply) and rounding (the add and subtract of the
/// binade's magic number), the sign by a mask.
template <class Format>
  requires(std::is_same_v<Format, fp8_e4m3> || std::is_same_v<Format, fp8_e5m2>)
struct ops<Format> {
  static constexpr int bits = 8;
  static constexpr int M = Format::mantissa_bits;
  using avx2 = detail::ops<Format>;
  using code = __m512i;
  struct rank {
    __m512 mult;
  };
  DILOCO_AVX512_INLINE static bool make_rank(float, float scale, rank& r) {
    const float m = scale * avx2::up;
    r.mult = _mm512_set1_ps(m);
    return !(scale - scale == 0.0f) || m - m == 0.0f;
  }
  DILOCO_AVX512_INLINE static __m512 decode16(const unsigned char* in, const rank& r) {
    const __m512i keep = _mm512_set1_epi32(static_cast<int>(0x80000000u | (0x7fu << (23 - M))));
    const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
    const __m512i b = _mm512_and_si512(_mm512_slli_epi32(c, 23 - M), keep);
    return _mm512_mul_ps(_mm512_castsi512_ps(b), r.mult);
  }
  DILOCO_AVX512_INLINE static __m512 round16(__m512 y, code& c) {
    const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    // |y|, unclamped, as ops<Format>::round8's.
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign_bit, _mm512_castps_si512(y)));
    const __m512 binade =
        _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7f800000))),
                      _mm512_set1_ps(kernels::minifloat_grid<Format>::value_branchless(1u << M)));
    const __m512 magic = _mm512_mul_ps(binade, _mm512_set1_ps(static_cast<float>(1u << (23 - M))));
    const __m512 r = _mm512_sub_ps(_mm512_add_ps(a, magic), magic);
    const __m512i mag =
        _mm512_srli_epi32(_mm512_castps_si512(_mm512_mul_ps(r, _mm512_set1_ps(avx2::down))), 23 - M);
    // The sign where y < 0, then + 0 (a negative y rounded to zero: +0, code 0).
    const __mmask16 neg = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512i rb = _mm512_mask_or_epi32(_mm512_castps_si512(r), neg, _mm512_castps_si512(r), sign_bit);
    const __m512 rs = _mm512_add_ps(_mm512_castsi512_ps(rb), _mm512_setzero_ps());
    c = _mm512_or_si512(mag, _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(rs), 24),
                                              _mm512_set1_epi32(0x80)));
    return rs;
  }
  struct norm {
    __m512 scale;
  };
  DILOCO_AVX512_INLINE static norm make_norm(__m512 scale) { return {scale}; }
  DILOCO_AVX512_INLINE static __m512 square16(__m512 r, const code&, const norm& n) {
    const __m512 d = _mm512_mul_ps(r, n.scale);
    return _mm512_mul_ps(d, d);
  }
  DILOCO_AVX512_INLINE static void put32(unsigned char* out, const code* c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), low_bytes16(c[0]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), low_bytes16(c[1]));
  }
};

/// fp4 e3m0: decoding by one lookup in a 16-entry table indexed by the
/// whole code (entries 8..15 the first eight with the sign bit ORed in, as
/// ops<fp4_e3m0> ORs it); the codes as ops<fp4_e3m0>::codes8, the sign by
/// a mask; the grid value, and the encode's decoding, looked up by code.
template <class Format>
  requires std::is_same_v<Format, fp4_e3m0>
struct ops<Format> {
  static constexpr int bits = 4;
  static constexpr int bias = Format::bias;
  using code = __m512i;
  struct rank {
    __m512 table;
  };
  DILOCO_AVX512_INLINE static bool make_rank(float amax, float scale, rank& r) {
    typename detail::ops<Format>::rank eight;
    const bool ok = detail::ops<Format>::make_rank(amax, scale, eight);
    const __m512 both = _mm512_insertf32x8(_mm512_castps256_ps512(eight.table), eight.table, 1);
    r.table = _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(both), 0xff00, _mm512_castps_si512(both),
                                                       _mm512_set1_epi32(static_cast<int>(0x80000000u))));
    return ok;
  }
  DILOCO_AVX512_INLINE static void decode32(const unsigned char* in, const rank& r, __m512& even, __m512& odd) {
    nibbles32(in, r.table, even, odd);
  }
  /// The sixteen values value(c), the sign's codes included.
  DILOCO_AVX512_INLINE static __m512 values16() {
    using grid = kernels::minifloat_grid<Format>;
    alignas(64) float v[16];
    for (std::uint32_t c = 0; c < 16; ++c) v[c] = grid::value_branchless(c);
    return _mm512_load_ps(v);
  }
  /// The codes of y, as ops<fp4_e3m0>::codes8: the exponent field rounded
  /// on the bit pattern, less 127 - bias, at least 1 where |y| exceeds
  /// half the smallest normal, else 0; the sign where y < 0 and the code
  /// is not 0.
  DILOCO_AVX512_INLINE static __m512i codes16(__m512 y) {
    const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    // |y|, unclamped, as ops<fp4_e3m0>::codes8's.
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign_bit, _mm512_castps_si512(y)));
    const __m512i ab = _mm512_castps_si512(a);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ab, 23), _mm512_set1_epi32(1));
    const __m512i e = _mm512_srai_epi32(  // as codes8's
        _mm512_add_epi32(_mm512_add_epi32(ab, _mm512_set1_epi32(0x3fffff - ((127 - bias) << 23))), odd), 23);
    const float min_normal = kernels::minifloat_grid<Format>::value_branchless(1);
    const __mmask16 nz = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.5f * min_normal), _CMP_GT_OQ);
    const __m512i mag = _mm512_maskz_max_epi32(nz, e, _mm512_set1_epi32(1));
    const __mmask16 neg = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ) & nz;
    return _mm512_mask_or_epi32(mag, neg, mag, _mm512_set1_epi32(0x8));
  }
  DILOCO_AVX512_INLINE static __m512 round16(__m512 y, code& c) {
    c = codes16(y);
    return _mm512_permutexvar_ps(c, values16());
  }
  /// The squares of value(c) * scale by code (value(c) is round16's value
  /// for code c: the same two products, made once a block).
  struct norm {
    __m512 sq;
  };
  DILOCO_AVX512_INLINE static norm make_norm(__m512 scale) {
    const __m512 d = _mm512_mul_ps(values16(), scale);
    return {_mm512_mul_ps(d, d)};
  }
  DILOCO_AVX512_INLINE static __m512 square16(__m512, const code& c, const norm& n) {
    return _mm512_permutexvar_ps(c, n.sq);
  }
  /// The encode's rounding with the decoding dq = r * scale looked up by
  /// code in the sixteen value(c) * scale (`products`, made once a block:
  /// the same products, the sign's in the table); the codes as round16's.
  struct products {
    __m512 t;
  };
  DILOCO_AVX512_INLINE static products make_products(__m512 scale) { return {_mm512_mul_ps(values16(), scale)}; }
  DILOCO_AVX512_INLINE static __m512 round_dq16(__m512 y, code& c, const products& p) {
    c = codes16(y);
    return _mm512_permutexvar_ps(c, p.t);
  }
  DILOCO_AVX512_INLINE static void put32(unsigned char* out, const code* c) {
    put_nibbles16(out, c[0]);
    put_nibbles16(out + 8, c[1]);
  }
};

/// int2: decoding by a lookup in value(c) * scale four times over (the
/// index's two bits above the code, its neighbour's, do not matter);
/// rounding by the three comparisons of ops<int2>::round8 (y > -2, y >= 0,
/// y > 2), whose masks are the code's bits (a thermometer: bit 0 is their
/// parity, bit 1 the middle one), packed two bits an element by pdep.
template <class Format>
  requires std::is_same_v<Format, int2>
struct ops<Format> {
  static constexpr int bits = 2;
  struct code {
    __mmask16 low, high, outer;  ///< outer: the lanes rounded to -3 or 3
  };
  struct rank {
    __m512 table;
  };
  DILOCO_AVX512_INLINE static bool make_rank(float, float scale, rank& r) {
    r.table = _mm512_mul_ps(_mm512_setr_ps(-3.0f, -1.0f, 1.0f, 3.0f, -3.0f, -1.0f, 1.0f, 3.0f, -3.0f, -1.0f, 1.0f,
                                           3.0f, -3.0f, -1.0f, 1.0f, 3.0f),
                            _mm512_set1_ps(scale));
    return true;
  }
  DILOCO_AVX512_INLINE static __m512 decode16(const unsigned char* in, const rank& r) {
    std::int32_t w;
    std::memcpy(&w, in, 4);
    const __m512i down = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32(w), down), r.table);
  }
  DILOCO_AVX512_INLINE static __m512 round16(__m512 y, code& c) {
    const __mmask16 a = _mm512_cmp_ps_mask(y, _mm512_set1_ps(-2.0f), _CMP_GT_OQ);
    const __mmask16 b = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GE_OQ);
    const __mmask16 d = _mm512_cmp_ps_mask(y, _mm512_set1_ps(2.0f), _CMP_GT_OQ);
    c.low = static_cast<__mmask16>(a ^ b ^ d);
    c.high = b;
    c.outer = static_cast<__mmask16>(~a | d);
    __m512 r = _mm512_mask_mov_ps(_mm512_set1_ps(-3.0f), a, _mm512_set1_ps(-1.0f));
    r = _mm512_mask_mov_ps(r, b, _mm512_set1_ps(1.0f));
    return _mm512_mask_mov_ps(r, d, _mm512_set1_ps(3.0f));
  }
  /// The squares of r * scale: (3 * scale)^2 where r is -3 or 3, scale^2
  /// where it is -1 or 1 (the same two products, made once a block).
  struct norm {
    __m512 inner, outer;
  };
  DILOCO_AVX512_INLINE static norm make_norm(__m512 scale) {
    const __m512 three = _mm512_mul_ps(_mm512_set1_ps(3.0f), scale);
    return {_mm512_mul_ps(scale, scale), _mm512_mul_ps(three, three)};
  }
  DILOCO_AVX512_INLINE static __m512 square16(__m512, const code& c, const norm& n) {
    return _mm512_mask_mov_ps(n.inner, c.outer, n.outer);
  }
  DILOCO_AVX512_INLINE static void put32(unsigned char* out, const code* c) {
    // Element e's code at bits 2e of the 64-bit word: its low bit at 2e, its high bit at 2e + 1.
    const std::uint64_t low = static_cast<std::uint64_t>(c[0].low) | static_cast<std::uint64_t>(c[1].low) << 16;
    const std::uint64_t high = static_cast<std::uint64_t>(c[0].high) | static_cast<std::uint64_t>(c[1].high) << 16;
    const std::uint64_t packed =
        _pdep_u64(low, 0x5555555555555555ull) | _pdep_u64(high, 0xaaaaaaaaaaaaaaaaull);
    std::memcpy(out, &packed, 8);
  }
};

/// detail::block_mean with 16 elements a step: rank k's block at in[k] +
/// at, decoded, summed in rank order, divided by M, into mean[0, B); the
/// largest magnitude's bits into max_bits. The same refusals. W is M where
/// it is known at compile time (the ranks' loop unrolled, their tables in
/// registers), 0 where it is `world`.
template <class Format, std::size_t B, int W>
DILOCO_AVX512_INLINE bool block_mean(const std::byte* const* in, std::size_t at, int world, float* mean,
                                     std::int32_t& max_bits) {
  constexpr float levels = Format::levels;
  using fmt = ops<Format>;
  constexpr int slots = W > 0 ? W : max_world;
  const int ranks_n = W > 0 ? W : world;
  typename fmt::rank ranks[slots];
  const unsigned char* codes[slots];
  for (int k = 0; k < ranks_n; ++k) {
    float amax;
    std::memcpy(&amax, in[k] + at, 4);
    // As detail::block_mean: a normal scale, a non-finite amax or zero.
    if (!(kernels::scale_is_normal(amax, levels) || !(amax - amax == 0.0f) || amax == 0.0f)) return false;
    if (!fmt::make_rank(amax, amax / levels, ranks[k])) return false;
    codes[k] = reinterpret_cast<const unsigned char*>(in[k] + at + 4);
  }
  const __m512 m = _mm512_set1_ps(static_cast<float>(ranks_n));
  const bool pow2 = (ranks_n & (ranks_n - 1)) == 0;
  const __m512 rcp = _mm512_set1_ps(1.0f / static_cast<float>(ranks_n));
  __m512i mbits = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  if constexpr (Format::bits == 4) {
    // Four-bit codes, 32 elements a step: each rank's 16 bytes looked up
    // as its even and odd elements, summed so (the same sums: each
    // element's ranks in rank order), and stored so: the step's even
    // elements at mean + j, its odd ones at mean + j + 16 (pairs order,
    // which quantize_group reads).
    for (std::size_t j = 0; j < B; j += 32) {
      const std::size_t byte = j / 2;
      __m512 even, odd;
      fmt::decode32(codes[0] + byte, ranks[0], even, odd);
      for (int k = 1; k < ranks_n; ++k) {
        __m512 e, o;
        fmt::decode32(codes[k] + byte, ranks[k], e, o);
        even = _mm512_add_ps(even, e);
        odd = _mm512_add_ps(odd, o);
      }
      even = pow2 ? _mm512_mul_ps(even, rcp) : _mm512_div_ps(even, m);
      odd = pow2 ? _mm512_mul_ps(odd, rcp) : _mm512_div_ps(odd, m);
      _mm512_store_ps(mean + j, even);
      _mm512_store_ps(mean + j + 16, odd);
      mbits = _mm512_max_epi32(mbits, _mm512_and_si512(_mm512_castps_si512(even), abs_mask));
      mbits = _mm512_max_epi32(mbits, _mm512_and_si512(_mm512_castps_si512(odd), abs_mask));
    }
  } else {
    for (std::size_t j = 0; j < B; j += 16) {
      const std::size_t byte = j * Format::bits / 8;
      __m512 acc = fmt::decode16(codes[0] + byte, ranks[0]);
      for (int k = 1; k < ranks_n; ++k) acc = _mm512_add_ps(acc, fmt::decode16(codes[k] + byte, ranks[k]));
      const __m512 y = pow2 ? _mm512_mul_ps(acc, rcp) : _mm512_div_ps(acc, m);
      _mm512_store_ps(mean + j, y);
      mbits = _mm512_max_epi32(mbits, _mm512_and_si512(_mm512_castps_si512(y), abs_mask));
    }
  }
  max_bits = _mm512_reduce_max_epi32(mbits);
  return true;
}

/// block_mean for `world` ranks: unrolled for 2, 4 and 8, else the loop.
template <class Format, std::size_t B>
DILOCO_AVX512_INLINE bool block_mean_any(const std::byte* const* in, std::size_t at, int world, float* mean,
                                         std::int32_t& max_bits) {
  switch (world) {
    case 2: return block_mean<Format, B, 2>(in, at, world, mean, max_bits);
    case 4: return block_mean<Format, B, 4>(in, at, world, mean, max_bits);
    case 8: return block_mean<Format, B, 8>(in, at, world, mean, max_bits);
    default: return block_mean<Format, B, 0>(in, at, world, mean, max_bits);
  }
}

/// Sums of squares in the norm's L lanes (norm_lanes(B)), element j's in
/// lane j % L, each lane's in element order, sixteen elements a step: with
/// L = 8 a step's two halves one after the other into one register of
/// eight lanes, else its sixteen lanes into one of L / 16 registers; tree()
/// is lane_tree8 over them as registers of eight lanes.
template <std::size_t L>
struct lanes {
  static constexpr std::size_t R = L == 8 ? 1 : L / 16;
  __m512 acc[R];
  __m256 acc8;
  DILOCO_AVX512_INLINE void zero() {
    acc8 = _mm256_setzero_ps();
    for (auto& a : acc) a = _mm512_setzero_ps();
  }
  /// The squares of x, elements j .. j + 15 (j a multiple of 16).
  DILOCO_AVX512_INLINE void add_squares(std::size_t j, __m512 x) { add_sq(j, _mm512_mul_ps(x, x)); }
  /// Squares already made, elements j .. j + 15.
  DILOCO_AVX512_INLINE void add_sq(std::size_t j, __m512 sq) {
    if constexpr (L == 8) {
      acc8 = _mm256_add_ps(acc8, _mm512_castps512_ps256(sq));
      acc8 = _mm256_add_ps(acc8, _mm512_extractf32x8_ps(sq, 1));
    } else {
      __m512& a = acc[(j % L) / 16];
      a = _mm512_add_ps(a, sq);
    }
  }
  DILOCO_AVX512_INLINE double tree() {
    __m256 eight[L / 8];
    if constexpr (L == 8) {
      eight[0] = acc8;
    } else {
      for (std::size_t r = 0; r < R; ++r) {
        eight[2 * r] = _mm512_castps512_ps256(acc[r]);
        eight[2 * r + 1] = _mm512_extractf32x8_ps(acc[r], 1);
      }
    }
    return detail::lane_tree8<L>(eight);
  }
};

/// detail::quantize_group with 16 elements a step: P blocks (means v[p],
/// scales s[p]) into codes[p], the squared norms of their decodings into
/// norm[p], 32 elements of each block in turn.
template <class Format, std::size_t B, std::size_t L, std::size_t P>
DILOCO_AVX512_INLINE void quantize_group(const float* const* v, const detail::block_scale* const* s,
                                         unsigned char* const* codes, double* const* norm) {
  using fmt = ops<Format>;
  lanes<L> acc[P];
  for (auto& a : acc) a.zero();
  typename fmt::norm nrm[P];
  for (std::size_t p = 0; p < P; ++p) nrm[p] = fmt::make_norm(_mm512_set1_ps(s[p]->scale));
  for (std::size_t j = 0; j < B; j += 32)
    for (std::size_t p = 0; p < P; ++p) {
      const __m512 inv = _mm512_set1_ps(s[p]->inv);
      typename fmt::code q[2];
      if constexpr (Format::bits == 4) {
        // The means in pairs order (block_mean): q[0] the step's even
        // elements, q[1] its odd ones; their squares interleaved back into
        // element order for the norm's lanes, the codes packed a pair a byte.
        const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        __m512 sq[2];
        for (std::size_t k = 0; k < 2; ++k)
          sq[k] = fmt::square16(fmt::round16(_mm512_mul_ps(_mm512_load_ps(v[p] + j + 16 * k), inv), q[k]), q[k],
                                nrm[p]);
        acc[p].add_sq(j, _mm512_permutex2var_ps(sq[0], lo, sq[1]));
        acc[p].add_sq(j + 16, _mm512_permutex2var_ps(sq[0], hi, sq[1]));
        put_pairs32(codes[p] + j / 2, q[0], q[1]);
      } else {
        for (std::size_t k = 0; k < 2; ++k) {
          const __m512 r = fmt::round16(_mm512_mul_ps(_mm512_load_ps(v[p] + j + 16 * k), inv), q[k]);
          acc[p].add_sq(j + 16 * k, fmt::square16(r, q[k], nrm[p]));
        }
        fmt::put32(codes[p] + j * Format::bits / 8, q);
      }
    }
  for (std::size_t p = 0; p < P; ++p) *norm[p] = acc[p].tree();
}

}  // namespace detail512

/// reduce_blocks (its contract, its three phases, the same bits and the
/// same blocks written) with AVX-512.
template <class Format, std::size_t B, std::size_t L, std::size_t K>
DILOCO_AVX512 unsigned reduce_blocks_avx512(const std::byte* const* in, std::size_t stride, int world, unsigned want,
                                            std::byte* out, double* norm_sq) {
  static_assert(B % 32 == 0 && L % 8 == 0 && B % L == 0, "whole 32-element steps and whole lanes");
  static_assert(K >= 1 && K <= 32, "a run's blocks are the bits of an unsigned");
  if (world < 1 || world > max_world) return 0;
  alignas(64) float mean[K][B];
  std::int32_t max_bits[K];
  unsigned done = 0;
  for (std::size_t j = 0; j < K; ++j)
    if ((want >> j & 1u) && detail512::block_mean_any<Format, B>(in, j * stride, world, mean[j], max_bits[j]))
      done |= 1u << j;
  detail::run_plan<K> plan;
  const std::size_t taken = plan.make(done, max_bits, mean, Format::levels, out, stride, norm_sq);
  std::size_t i = 0;
  for (; i + 2 <= taken; i += 2)
    detail512::quantize_group<Format, B, L, 2>(plan.v + i, plan.s + i, plan.codes + i, plan.norms + i);
  for (; i < taken; ++i)
    detail512::quantize_group<Format, B, L, 1>(plan.v + i, plan.s + i, plan.codes + i, plan.norms + i);
  return done;
}

/// encode_block (its contract: v = (g - l) + e encoded into `out`, the new
/// residual decay * (v - dq) into `next` where not null, ||g - l||^2 and
/// ||v - dq||^2 in L lanes; false, having written nothing, where the scale
/// leaves the common path) with AVX-512: the same bits.
template <class Format, std::size_t B, std::size_t L>
DILOCO_AVX512 bool encode_block_avx512(const float* g, const float* l, const float* e, float* next, float decay,
                                       std::byte* out, double& delta_sq, double& error_sq) {
  static_assert(B % 32 == 0 && L % 8 == 0 && B % L == 0, "whole 32-element steps and whole lanes");
  using fmt = detail512::ops<Format>;
  alignas(64) float v[B];
  detail512::lanes<L> delta;
  delta.zero();
  __m512i mbits = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  for (std::size_t j = 0; j < B; j += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(g + j), _mm512_loadu_ps(l + j));
    const __m512 x = e ? _mm512_add_ps(d, _mm512_loadu_ps(e + j)) : d;
    _mm512_store_ps(v + j, x);
    delta.add_squares(j, d);
    mbits = _mm512_max_epi32(mbits, _mm512_and_si512(_mm512_castps_si512(x), abs_mask));
  }
  const detail::block_scale s = detail::scale_of(_mm512_reduce_max_epi32(mbits), Format::levels);
  if (!s.common) return false;
  delta_sq = delta.tree();
  std::memcpy(out, &s.amax, 4);
  unsigned char* codes = reinterpret_cast<unsigned char*>(out + 4);
  const __m512 inv = _mm512_set1_ps(s.inv), scale = _mm512_set1_ps(s.scale), dec = _mm512_set1_ps(decay);
  const bool scaled = decay != 1.0f;
  detail512::lanes<L> error;
  error.zero();
  // (No lambda here: Clang compiles a lambda without its function's target.)
  constexpr bool looked_up = requires { fmt::make_products(scale); };
  [[maybe_unused]] typename detail::products_of<fmt>::type products{};
  if constexpr (looked_up) products = fmt::make_products(scale);
  for (std::size_t j = 0; j < B; j += 32) {
    typename fmt::code q[2];
    for (std::size_t k = 0; k < 2; ++k) {
      const __m512 x = _mm512_load_ps(v + j + 16 * k);
      __m512 dq;
      if constexpr (looked_up)
        dq = fmt::round_dq16(_mm512_mul_ps(x, inv), q[k], products);
      else
        dq = _mm512_mul_ps(fmt::round16(_mm512_mul_ps(x, inv), q[k]), scale);
      const __m512 err = _mm512_sub_ps(x, dq);
      if (next) _mm512_storeu_ps(next + j + 16 * k, scaled ? _mm512_mul_ps(dec, err) : err);
      error.add_squares(j + 16 * k, err);
    }
    fmt::put32(codes + j * Format::bits / 8, q);
  }
  error_sq = error.tree();
  return true;
}

/// reduce_blocks by the widest form the CPU runs (call it only where
/// enabled()): AVX-512 where avx512() says so, else AVX2; the same bits
/// and blocks either way.
template <class Format, std::size_t B, std::size_t L, std::size_t K>
inline unsigned reduce_blocks_widest(const std::byte* const* in, std::size_t stride, int world, unsigned want,
                                     std::byte* out, double* norm_sq) {
  if (avx512()) return reduce_blocks_avx512<Format, B, L, K>(in, stride, world, want, out, norm_sq);
  return reduce_blocks<Format, B, L, K>(in, stride, world, want, out, norm_sq);
}

/// encode_block by the widest form the CPU runs (call it only where
/// enabled()): the same bits either way.
template <class Format, std::size_t B, std::size_t L>
inline bool encode_block_widest(const float* g, const float* l, const float* e, float* next, float decay,
                                std::byte* out, double& delta_sq, double& error_sq) {
  if (avx512()) return encode_block_avx512<Format, B, L>(g, l, e, next, decay, out, delta_sq, error_sq);
  return encode_block<Format, B, L>(g, l, e, next, decay, out, delta_sq, error_sq);
}

#undef DILOCO_AVX512
#undef DILOCO_AVX512_INLINE

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // DILOCO_HOST_SIMD_X86

}  // namespace diloco::kernels::host_simd

DILOCO_EXACT_FP_END
