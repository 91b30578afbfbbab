// SPDX-License-Identifier: Apache-2.0
#pragma once

// Hand-vectorised host forms of the two compute-bound passes of a
// compressed round with the integer block codecs (blockwise<int8|int4, B>,
// round to nearest): stage 1's encode of the pseudo-gradient
// (kernels::encode_pseudo_gradient) and stages 3+4's shard reduction
// (kernels::reduce_shard). Compilers vectorize neither well from the
// portable code: the block max, the rounding and the packing of codes sit
// in separate loops over block-local arrays, and the reduction decodes M
// blocks through byte loads.
//
// Each routine does, per element, exactly the IEEE operations of the
// portable pass (AVX2 add, sub, mul and div are correctly rounded, and no
// FMA is enabled, so nothing is fused), and sums the norms in the same
// lanes (norm_lanes(B) lanes, eight to a 256-bit register, then
// lane_tree's tree), so the bytes on the wire, the residuals and the norms
// are the same bits as the portable code's, which the tests check block by
// block. A block they do not take returns false and the caller runs the
// portable code: partial blocks (a tensor's last), and blocks whose amax is
// infinite, NaN or so small (but not zero) that its scale is subnormal
// (rare; the portable code's special paths).
//
// The library stays header-only and builds at the baseline ISA: these
// functions carry __attribute__((target("avx2"))) and are chosen at run
// time when the CPU has AVX2 (__builtin_cpu_supports), on x86-64 with GCC or
// Clang, outside nvcc's translation units (whose host code runs the
// portable passes: the same bits). DILOCO_HOST_SIMD=0 in the environment
// turns them off; defining DILOCO_NO_HOST_SIMD compiles them out.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "diloco/codec/blockwise.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/core/macros.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(DILOCO_NO_HOST_SIMD)
/// Defined where the hand-vectorised host passes are compiled in (x86-64,
/// GCC or Clang, not nvcc, DILOCO_NO_HOST_SIMD not defined).
#define DILOCO_HOST_SIMD_X86 1
#include <immintrin.h>
#endif

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels::host_simd {

/// Whether the hand-vectorised passes run: compiled in, the CPU has AVX2,
/// and DILOCO_HOST_SIMD is not 0 (read once).
inline bool enabled() {
#if defined(DILOCO_HOST_SIMD_X86)
  static const bool on = [] {
    const char* env = std::getenv("DILOCO_HOST_SIMD");
    if (env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0)) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return on;
#else
  return false;
#endif
}

/// The most ranks whose blocks reduce_block sums (its scales live on the
/// stack); larger groups take the portable pass.
inline constexpr int max_world = 64;

/// Which codecs have hand-vectorised passes: blockwise int8 and int4 with
/// round to nearest, B a multiple of 32 (whole 32-element steps; the
/// caller also asks B to be a multiple of its norm lanes).
template <class Codec>
struct supports : std::false_type {};
template <class Format, std::size_t B>
struct supports<compress::blockwise_codec<Format, B, compress::round_nearest>>
    : std::bool_constant<(std::is_same_v<Format, int8> || std::is_same_v<Format, int4>) && B % 32 == 0> {};

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

/// round_even(y) clamped to [-L, L] (int_grid::round<false>).
DILOCO_AVX2_INLINE __m256 grid_round(__m256 y, __m256 levels, __m256 neg_levels) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  __m256 r = _mm256_sub_ps(_mm256_add_ps(y, magic), magic);
  r = _mm256_min_ps(r, levels);
  return _mm256_max_ps(r, neg_levels);
}

/// Codes of 32 elements (grid values as int32, four registers) into the block's code bytes:
/// int8 one byte each, int4 two to a byte (element 2i in the low nibble).
template <int Bits>
DILOCO_AVX2_INLINE void put_codes32(unsigned char* out, __m256i a, __m256i b, __m256i c, __m256i d) {
  // Saturating packs keep the values (|q| <= 127); they interleave 128-bit
  // halves, which the permutation undoes: bytes of elements 0..31 in order.
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
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

/// What quantize_into does with each element's dq: the encode pass writes
/// the residual decay * (v - dq) (when it keeps one) and sums the squares of
/// v - dq; the reduction sums the squares of dq.
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
struct decoded_sink {
  DILOCO_AVX2_INLINE __m256 operator()(std::size_t, __m256, __m256 dq) const { return dq; }
};

/// Quantizes the block v[0, B) (its scale common) into `codes`; each
/// element's dq goes to sink(j, v, dq) (8 at a time), whose result's
/// squares the L norm lanes sum.
template <int Bits, std::size_t B, std::size_t L, class Sink>
DILOCO_AVX2_INLINE double quantize_into(const float* v, const block_scale& s, float levels, unsigned char* codes,
                                        const Sink& sink) {
  __m256 acc[L / 8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 inv = _mm256_set1_ps(s.inv), scale = _mm256_set1_ps(s.scale);
  const __m256 lv = _mm256_set1_ps(levels), nlv = _mm256_set1_ps(-levels);
  for (std::size_t j = 0; j < B; j += 32) {
    __m256i q[4];
    for (std::size_t k = 0; k < 4; ++k) {
      const __m256 x = _mm256_loadu_ps(v + j + 8 * k);
      const __m256 r = grid_round(_mm256_mul_ps(x, inv), lv, nlv);
      q[k] = _mm256_cvttps_epi32(r);
      const __m256 n = sink(j + 8 * k, x, _mm256_mul_ps(r, scale));
      __m256& a = acc[((j + 8 * k) / 8) % (L / 8)];
      a = _mm256_add_ps(a, _mm256_mul_ps(n, n));
    }
    put_codes32<Bits>(codes + j * Bits / 8, q[0], q[1], q[2], q[3]);
  }
  return lane_tree8<L>(acc);
}

}  // namespace detail

/// encode_pseudo_gradient's block of B elements (v = (g - l) + e, encoded
/// into `out`, the new residual decay * (v - dq) into `next`, the sums
/// ||g - l||^2 and ||v - dq||^2 into delta_sq and error_sq in L lanes), when
/// its scale takes the common path; false (having written nothing) when not.
template <int Bits, std::size_t B, std::size_t L>
DILOCO_AVX2 bool encode_block(const float* g, const float* l, const float* e, float* next, float decay, float levels,
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
  const detail::block_scale s = detail::scale_of(detail::max8(mbits), levels);
  if (!s.common) return false;
  delta_sq = detail::lane_tree8<L>(acc);
  std::memcpy(out, &s.amax, 4);
  error_sq = detail::quantize_into<Bits, B, L>(v, s, levels, reinterpret_cast<unsigned char*>(out + 4),
                                               detail::residual_sink{next, _mm256_set1_ps(decay), decay != 1.0f});
  return true;
}

/// reduce_shard's block of B elements: the M payloads' blocks decoded,
/// summed in rank order, divided by M and re-encoded into `out`; the squared
/// norm of the re-encoded block into norm_sq. False (having written
/// nothing) when a received factor or the mean's scale leaves the common
/// path. `in[k]` is rank k's encoding of the block.
template <int Bits, std::size_t B, std::size_t L>
DILOCO_AVX2 bool reduce_block(const std::byte* const* in, int world, float levels, std::byte* out, double& norm_sq) {
  static_assert(B % 32 == 0 && L % 8 == 0 && B % L == 0, "whole 32-element steps and whole lanes");
  alignas(32) float mean[B];
  float scales[max_world];
  if (world < 1 || world > max_world) return false;
  for (int k = 0; k < world; ++k) {
    float amax;
    std::memcpy(&amax, in[k], 4);
    // blockwise_codec::decode multiplies by amax / L when that is normal or
    // amax is not finite, and computes (q * amax) / L otherwise, which for
    // amax = 0 is q * 0 (+-0 by q's sign) too; other tiny factors take the
    // portable path.
    if (!(kernels::scale_is_normal(amax, levels) || !(amax - amax == 0.0f) || amax == 0.0f)) return false;
    scales[k] = amax / levels;
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
    detail::values32<Bits>(reinterpret_cast<const unsigned char*>(in[0] + 4) + j * Bits / 8, acc);
    const __m256 s0 = _mm256_set1_ps(scales[0]);
    for (auto& a : acc) a = _mm256_mul_ps(a, s0);
    for (int k = 1; k < world; ++k) {
      detail::values32<Bits>(reinterpret_cast<const unsigned char*>(in[k] + 4) + j * Bits / 8, x);
      const __m256 sk = _mm256_set1_ps(scales[k]);
      for (int i = 0; i < 4; ++i) acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(x[i], sk));
    }
    for (int i = 0; i < 4; ++i) {
      const __m256 y = pow2 ? _mm256_mul_ps(acc[i], rcp) : _mm256_div_ps(acc[i], m);
      _mm256_store_ps(mean + j + 8 * i, y);
      mbits = _mm256_max_epi32(mbits, _mm256_and_si256(_mm256_castps_si256(y), abs_mask));
    }
  }
  const detail::block_scale s = detail::scale_of(detail::max8(mbits), levels);
  if (!s.common) return false;
  std::memcpy(out, &s.amax, 4);
  norm_sq = detail::quantize_into<Bits, B, L>(mean, s, levels, reinterpret_cast<unsigned char*>(out + 4),
                                              detail::decoded_sink{});
  return true;
}

#undef DILOCO_AVX2_INLINE
#undef DILOCO_AVX2

#endif  // DILOCO_HOST_SIMD_X86

}  // namespace diloco::kernels::host_simd

DILOCO_EXACT_FP_END
