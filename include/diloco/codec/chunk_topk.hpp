// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "diloco/codec/blockwise.hpp"
#include "diloco/codec/block_codec.hpp"
#include "diloco/codec/float_formats.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/host_cpu.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/codec/grids.hpp"
#include "diloco/codec/quantize.hpp"
#include "diloco/core/random.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

namespace detail_bits {

// ceil(log2 n) for n >= 2.
constexpr int ceil_log2(std::size_t n) {
  int b = 0;
  while ((std::size_t{1} << b) < n) ++b;
  return b;
}

// `bits`-bit field number `i` of a little-endian bit stream.
DILOCO_HD inline unsigned get_field(const std::byte* p, std::size_t i, int bits) {
  const std::size_t bit = i * static_cast<std::size_t>(bits);
  std::uint32_t w = 0;
  const std::size_t first = bit / 8, last = (bit + static_cast<std::size_t>(bits) - 1) / 8;
  for (std::size_t b = first; b <= last; ++b) w |= static_cast<std::uint32_t>(p[b]) << (8 * (b - first));
  return (w >> (bit % 8)) & ((1u << bits) - 1u);
}
// Ors field `i` in (the stream starts zeroed).
inline void or_field(std::byte* p, std::size_t i, int bits, unsigned v) {
  const std::size_t bit = i * static_cast<std::size_t>(bits);
  std::uint32_t w = static_cast<std::uint32_t>(v) << (bit % 8);
  for (std::size_t b = bit / 8; w != 0; ++b, w >>= 8) p[b] |= static_cast<std::byte>(w & 0xffu);
}

// Fields 0 .. n - 1 of `bits` bits (1 <= bits <= 32), field e the value
// v(e) (below 2^bits), as the first ceil(n bits / 8) bytes of the
// little-endian bit stream at p, the last byte's unused high bits zero:
// the bytes or_field gives field by field on a zeroed stream, written 32
// bits at a time (as four bytes, lowest first) instead of a byte loop per
// field.
template <class Field>
inline void pack_fields(std::byte* p, std::size_t n, int bits, Field&& v) {
  std::uint64_t acc = 0;  // the stream's bits not yet written, from its lowest
  int filled = 0;         // how many: below 32 between fields
  for (std::size_t e = 0; e < n; ++e) {
    acc |= static_cast<std::uint64_t>(v(e)) << filled;
    filled += bits;
    if (filled >= 32) {
      for (int b = 0; b < 4; ++b) p[b] = static_cast<std::byte>((acc >> (8 * b)) & 0xffu);
      p += 4;
      acc >>= 32;
      filled -= 32;
    }
  }
  for (; filled > 0; filled -= 8, acc >>= 8) *p++ = static_cast<std::byte>(acc & 0xffu);
}

// Stochastic rounding's draw for selected entry e (element index0 +
// idx[e]), and none: functors rather than lambdas, which nvcc would make
// host-only inside this host function.
struct draw_at {
  std::uint64_t stream, index0;
  const std::uint64_t* idx;
  DILOCO_HD float operator()(std::size_t e) const { return kernels::random_unit(stream, index0 + idx[e]); }
};
struct no_draw {
  DILOCO_HD float operator()(std::size_t) const { return 0.0f; }
};

}  // namespace detail_bits

namespace detail_topk {

/// Whether the wide forms below are compiled (x86-64, GCC or Clang, not
/// nvcc: kernels::host_simd's condition); select<Width> falls back to
/// the portable loops elsewhere.
#if defined(DILOCO_HOST_SIMD_X86)
inline constexpr bool compiled = true;
#else
inline constexpr bool compiled = false;
#endif

struct avx512;
struct avx2;

/// chunk_topk_codec::nth_largest (the n-th largest of x[0, count), given
/// that it lies in [lo, hi], which holds all of x) with the candidates
/// narrowed as its bits are decided: after each bit only the values that
/// can still be it are kept (Ops::keep_half, into `scratch`, which has
/// room for count + 16), those above them counted out of n; the largest or
/// the smallest left (Ops::extreme), where n comes down to 1 or to all of
/// them. The same value, in passes over fewer values each time.
template <class Ops>
std::uint32_t narrowing_nth_largest(const std::uint32_t* x, std::size_t count, std::size_t n, std::uint32_t lo,
                                    std::uint32_t hi, std::uint32_t* scratch) {
  if (lo == hi) return lo;
  int bit = 31;
  while (((lo ^ hi) >> bit) == 0) --bit;  // the highest bit where they differ
  // Every value in cur lies in [t, t + 2^(bit + 1)); the answer is the
  // need-th largest of them.
  std::uint32_t t = hi & ~static_cast<std::uint32_t>((std::uint64_t{2} << bit) - 1u);
  const std::uint32_t* cur = x;
  std::size_t m = count, need = n;
  for (;; --bit) {
    if (need == 1 || need == m) return Ops::extreme(cur, m, need == 1);
    const std::uint32_t y = t | (1u << bit);
    const std::size_t above = Ops::count_at_least(cur, m, y);
    const bool upper = above >= need;  // the answer is at least y
    if (upper)
      t = y;
    else
      need -= above;
    if (bit == 0) return t;
    m = Ops::keep_half(cur, m, y, upper, scratch);  // the half the answer is in
    cur = scratch;
  }
}

#if defined(DILOCO_HOST_SIMD_X86)
/// The bounded selection's compactions in AVX-512 (chunk_topk_codec::
/// select<512>, which runs them where kernels::host_simd::avx512()): 16
/// lanes compared at once and the ones kept packed by a compress, where the
/// portable loops store every element and move on by one compare each. The
/// same elements in the same order.
struct avx512 {
  /// The lanes of [0, count) still inside the arrays, as a mask.
  __attribute__((target(DILOCO_HOST_AVX512_TARGET), always_inline)) static __mmask16 live(std::size_t i,
                                                                                        std::size_t count) {
    return count - i >= 16 ? static_cast<__mmask16>(0xffffu) : static_cast<__mmask16>((1u << (count - i)) - 1u);
  }

  /// Each i in [0, count) with key[i] >= bound, in order: key[i] into
  /// out_key (unless null) and val[i] (i where val is null) into out_val;
  /// returns how many. The outputs have room for count + 16 (each step
  /// stores 16 lanes).
  __attribute__((target(DILOCO_HOST_AVX512_TARGET))) static std::size_t compact_at_least(
      const std::uint32_t* key, const std::uint32_t* val, std::size_t count, std::uint32_t bound,
      std::uint32_t* out_key, std::uint32_t* out_val) {
    const __m512i b = _mm512_set1_epi32(static_cast<int>(bound));
    __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    std::size_t c = 0;
    for (std::size_t i = 0; i < count; i += 16) {
      const __mmask16 in = live(i, count);
      const __m512i k = _mm512_maskz_loadu_epi32(in, key + i);
      const __mmask16 keep = _mm512_mask_cmpge_epu32_mask(in, k, b);
      if (out_key) _mm512_storeu_si512(out_key + c, _mm512_maskz_compress_epi32(keep, k));
      const __m512i v = val ? _mm512_maskz_loadu_epi32(in, val + i) : index;
      _mm512_storeu_si512(out_val + c, _mm512_maskz_compress_epi32(keep, v));
      c += static_cast<std::size_t>(__builtin_popcount(keep));
      index = _mm512_add_epi32(index, step);
    }
    return c;
  }

  /// The elements of v at i * groups + warm[q] (rows i = 0..7 in order, each
  /// row's q < w in order) whose magnitude (|v| bits) is at least t: their
  /// magnitudes into cm and positions into pos, in that order; returns how
  /// many. cm and pos have room for 8 w + 16.
  __attribute__((target(DILOCO_HOST_AVX512_TARGET))) static std::size_t gather_at_least(
      const float* v, std::size_t groups, const std::uint32_t* warm, std::size_t w, std::uint32_t t, std::uint32_t* cm,
      std::uint32_t* pos) {
    const __m512i bound = _mm512_set1_epi32(static_cast<int>(t));
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    std::size_t c = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      const __m512i row = _mm512_set1_epi32(static_cast<int>(i * groups));
      for (std::size_t q = 0; q < w; q += 16) {
        const __mmask16 in = live(q, w);
        const __m512i j = _mm512_add_epi32(_mm512_maskz_loadu_epi32(in, warm + q), row);
        const __m512i m =
            _mm512_and_si512(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), in, j, v, 4), magnitude);
        const __mmask16 keep = _mm512_mask_cmpge_epu32_mask(in, m, bound);
        _mm512_storeu_si512(cm + c, _mm512_maskz_compress_epi32(keep, m));
        _mm512_storeu_si512(pos + c, _mm512_maskz_compress_epi32(keep, j));
        c += static_cast<std::size_t>(__builtin_popcount(keep));
      }
    }
    return c;
  }

  /// How many of x[0, count) are at least y.
  __attribute__((target(DILOCO_HOST_AVX512_TARGET))) static std::size_t count_at_least(const std::uint32_t* x,
                                                                                      std::size_t count,
                                                                                      std::uint32_t y) {
    const __m512i b = _mm512_set1_epi32(static_cast<int>(y));
    std::size_t c = 0;
    for (std::size_t i = 0; i < count; i += 16) {
      const __mmask16 in = live(i, count);
      c += static_cast<std::size_t>(
          __builtin_popcount(_mm512_mask_cmpge_epu32_mask(in, _mm512_maskz_loadu_epi32(in, x + i), b)));
    }
    return c;
  }

  /// The largest (or, with !largest, the smallest) of x[0, count), count >= 1.
  __attribute__((target(DILOCO_HOST_AVX512_TARGET))) static std::uint32_t extreme(const std::uint32_t* x,
                                                                                 std::size_t count, bool largest) {
    __m512i r = _mm512_set1_epi32(largest ? 0 : -1);
    for (std::size_t i = 0; i < count; i += 16) {
      const __mmask16 in = live(i, count);
      r = largest ? _mm512_mask_max_epu32(r, in, r, _mm512_maskz_loadu_epi32(in, x + i))
                  : _mm512_mask_min_epu32(r, in, r, _mm512_maskz_loadu_epi32(in, x + i));
    }
    alignas(64) std::uint32_t lanes[16];
    _mm512_store_si512(lanes, r);
    std::uint32_t a = lanes[0];
    for (const std::uint32_t l : lanes) a = largest == (l > a) ? l : a;
    return a;
  }

  /// The values of x[0, count) at least y (upper) or below it (!upper), in
  /// order, into out (room for count + 16; out may be x: the e-th kept is
  /// at or before the e-th read); returns how many.
  __attribute__((target(DILOCO_HOST_AVX512_TARGET))) static std::size_t keep_half(const std::uint32_t* x,
                                                                                 std::size_t count, std::uint32_t y,
                                                                                 bool upper, std::uint32_t* out) {
    const __m512i b = _mm512_set1_epi32(static_cast<int>(y));
    std::size_t kept = 0;
    for (std::size_t i = 0; i < count; i += 16) {
      const __mmask16 in = live(i, count);
      const __m512i v = _mm512_maskz_loadu_epi32(in, x + i);
      const __mmask16 ge = _mm512_mask_cmpge_epu32_mask(in, v, b);
      const __mmask16 keep = upper ? ge : static_cast<__mmask16>(in & ~ge);
      _mm512_storeu_si512(out + kept, _mm512_maskz_compress_epi32(keep, v));
      kept += static_cast<std::size_t>(__builtin_popcount(keep));
    }
    return kept;
  }
};

/// For each 8-bit mask, the lanes it keeps in order, 3 bits each.
struct compress_table {
  std::uint32_t packed[256];
  constexpr compress_table() : packed{} {
    for (unsigned m = 0; m < 256; ++m) {
      unsigned k = 0;
      for (unsigned i = 0; i < 8; ++i)
        if (m >> i & 1u) packed[m] |= i << (3 * k++);
    }
  }
};
inline constexpr compress_table compress_lanes{};

/// avx512's compactions, gather and search in AVX2 (select<256>,
/// where kernels::host_simd::enabled()): eight lanes a step, the kept lanes
/// packed by a permutation looked up by their mask (AVX2 has no compress),
/// the comparisons signed (every key is a magnitude below 2^31). The same
/// elements in the same order, the same n-th largest.
struct avx2 {
  /// The lanes of v that mask m keeps, moved to the low lanes in order.
  __attribute__((target("avx2"), always_inline)) static __m256i compress8(__m256i v, unsigned m) {
    const __m256i at = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(compress_lanes.packed[m])),
                          _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)),
        _mm256_set1_epi32(7));
    return _mm256_permutevar8x32_epi32(v, at);
  }

  /// The lanes of [0, count) still inside the arrays, as a lane mask.
  __attribute__((target("avx2"), always_inline)) static __m256i live(std::size_t i, std::size_t count) {
    const std::size_t left = count - i < 8 ? count - i : 8;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  /// The live lanes of x that are at least b, as a lane mask.
  __attribute__((target("avx2"), always_inline)) static __m256i at_least(__m256i x, __m256i b, __m256i in) {
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(b, x), in);
  }

  /// A lane mask's bits.
  __attribute__((target("avx2"), always_inline)) static unsigned bits(__m256i m) {
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
  }

  /// avx512::compact_at_least: room for count + 8 in the outputs.
  __attribute__((target("avx2"))) static std::size_t compact_at_least(const std::uint32_t* key, const std::uint32_t* val,
                                                                      std::size_t count, std::uint32_t bound,
                                                                      std::uint32_t* out_key, std::uint32_t* out_val) {
    const __m256i b = _mm256_set1_epi32(static_cast<int>(bound));
    __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    std::size_t c = 0;
    for (std::size_t i = 0; i < count; i += 8) {
      const __m256i in = live(i, count);
      const __m256i k = _mm256_maskload_epi32(reinterpret_cast<const int*>(key + i), in);
      const unsigned keep = bits(at_least(k, b, in));
      if (out_key) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_key + c), compress8(k, keep));
      const __m256i v = val ? _mm256_maskload_epi32(reinterpret_cast<const int*>(val + i), in) : index;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_val + c), compress8(v, keep));
      c += static_cast<std::size_t>(__builtin_popcount(keep));
      index = _mm256_add_epi32(index, _mm256_set1_epi32(8));
    }
    return c;
  }

  /// avx512::gather_at_least: room for 8 w + 8 in cm and pos.
  __attribute__((target("avx2"))) static std::size_t gather_at_least(const float* v, std::size_t groups,
                                                                     const std::uint32_t* warm, std::size_t w,
                                                                     std::uint32_t t, std::uint32_t* cm,
                                                                     std::uint32_t* pos) {
    const __m256i bound = _mm256_set1_epi32(static_cast<int>(t));
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    std::size_t c = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      const __m256i row = _mm256_set1_epi32(static_cast<int>(i * groups));
      for (std::size_t q = 0; q < w; q += 8) {
        const __m256i in = live(q, w);
        const __m256i j = _mm256_add_epi32(_mm256_maskload_epi32(reinterpret_cast<const int*>(warm + q), in), row);
        const __m256i m = _mm256_and_si256(
            _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(v), j, in, 4), magnitude);
        const unsigned keep = bits(at_least(m, bound, in));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(cm + c), compress8(m, keep));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + c), compress8(j, keep));
        c += static_cast<std::size_t>(__builtin_popcount(keep));
      }
    }
    return c;
  }

  /// avx512::count_at_least.
  __attribute__((target("avx2"))) static std::size_t count_at_least(const std::uint32_t* x, std::size_t count,
                                                                    std::uint32_t y) {
    const __m256i b = _mm256_set1_epi32(static_cast<int>(y));
    std::size_t c = 0;
    for (std::size_t i = 0; i < count; i += 8) {
      const __m256i in = live(i, count);
      c += static_cast<std::size_t>(
          __builtin_popcount(bits(at_least(_mm256_maskload_epi32(reinterpret_cast<const int*>(x + i), in), b, in))));
    }
    return c;
  }

  /// avx512::extreme.
  __attribute__((target("avx2"))) static std::uint32_t extreme(const std::uint32_t* x, std::size_t count, bool largest) {
    __m256i r = _mm256_set1_epi32(largest ? 0 : -1);
    for (std::size_t i = 0; i < count; i += 8) {
      const __m256i in = live(i, count);
      const __m256i v = _mm256_maskload_epi32(reinterpret_cast<const int*>(x + i), in);  // 0 where not live
      r = largest ? _mm256_max_epu32(r, v)
                  : _mm256_min_epu32(r, _mm256_or_si256(v, _mm256_andnot_si256(in, _mm256_set1_epi32(-1))));
    }
    alignas(32) std::uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), r);
    std::uint32_t a = lanes[0];
    for (const std::uint32_t l : lanes) a = largest == (l > a) ? l : a;
    return a;
  }

  /// avx512::keep_half: room for count + 8 in out.
  __attribute__((target("avx2"))) static std::size_t keep_half(const std::uint32_t* x, std::size_t count,
                                                               std::uint32_t y, bool upper, std::uint32_t* out) {
    const __m256i b = _mm256_set1_epi32(static_cast<int>(y));
    std::size_t kept = 0;
    for (std::size_t i = 0; i < count; i += 8) {
      const __m256i in = live(i, count);
      const __m256i v = _mm256_maskload_epi32(reinterpret_cast<const int*>(x + i), in);
      const unsigned ge = bits(at_least(v, b, in));
      const unsigned keep = upper ? ge : bits(in) & ~ge;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kept), compress8(v, keep));
      kept += static_cast<std::size_t>(__builtin_popcount(keep));
    }
    return kept;
  }
};
#endif

}  // namespace detail_topk

/// SparseLoCo's compressor (arXiv 2508.15706): per chunk of `Chunk`
/// consecutive elements keep the K largest magnitudes, their values
/// quantized to `Values` (int2, int4, int8, fp8_e4m3, ...) against the
/// chunk's largest magnitude, their positions packed in ceil(log2 Chunk)
/// bits. With error_feedback (options.decay = beta, SparseLoCo uses 0.95)
/// what is not sent is carried over: r <- beta (r + delta - sent).
///
/// Chunk layout (the codec block), fixed stride:
/// ```
/// offset 0            fp32 amax: the chunk's largest magnitude (always kept)
/// 4                   K value codes, Values::bits each, packed from the low bits
/// 4 + ceil(K*vb/8)    K positions, I = ceil(log2 Chunk) bits each, packed
///                     from the low bits, strictly increasing
/// ```
/// A partial chunk of len < K elements sends len entries; unused entries
/// and padding bits are zero. Bytes per parameter at Chunk 4096, K 64, int2:
/// (4 + 16 + 96) / 4096 = 0.0283.
///
/// Which elements: the K largest |v|, ties to the lower index; NaN counts as
/// the largest magnitude so it is never hidden (the chunk's amax is then
/// NaN and the round is refused). Aggregation is sparse: the reducer
/// all-gathers every rank's segment and each rank sums the decoded chunks in
/// fp32 in rank order (reduce/gathered.hpp); re-encoding a mean of sparse
/// vectors would only lose more.
///
/// Encoding on the host finds the chunk's K-th largest magnitude (select());
/// the device form (kernels/topk_blocks.hpp) runs a radix select in shared
/// memory per chunk and gives the same bytes.
template <std::size_t Chunk, std::size_t K, class Values, class Rounding>
struct chunk_topk_codec {
  static_assert(Chunk >= 2 && Chunk <= 16384, "chunk_topk: Chunk must be in [2, 16384]");
  static_assert(K >= 1 && K <= Chunk, "chunk_topk: K must be in [1, Chunk]");
  static_assert(Values::bits == 8 || Values::bits == 4 || Values::bits == 2,
                "chunk_topk: Values must be int8, int4, int2, fp8_e4m3, fp8_e5m2 or fp4_e3m0");
  static constexpr std::size_t block = Chunk;  ///< elements per chunk (the codec block)
  static constexpr std::size_t k = K;  ///< entries a full chunk sends
  static constexpr const char* values_name = Values::name;  ///< the values' format, by name
  /// The codec's part of the compressor's fingerprint (compress/fingerprint.hpp).
  static std::string fingerprint() { return diloco::detail::concat(", chunk ", Chunk, ", k ", K, ", values ", values_name); }
  /// The codec's id in segment headers: chunk_topk + the values' format id.
  static constexpr codec_id id = static_cast<codec_id>(static_cast<unsigned>(codec_id::chunk_topk) +
                                                       static_cast<unsigned>(format_id<Values>()));
  static constexpr int value_bits = Values::bits;  ///< bits per value code
  static constexpr int index_bits = detail_bits::ceil_log2(Chunk);  ///< bits per position: ceil(log2 Chunk)
  static constexpr std::size_t value_bytes = (K * Values::bits + 7) / 8;  ///< bytes of the packed value codes
  static constexpr std::size_t index_bytes = (K * index_bits + 7) / 8;  ///< bytes of the packed positions
  static constexpr float levels = Values::levels;  ///< the values' format's largest magnitude
  static constexpr bool stochastic = Rounding::stochastic;  ///< whether the values' rounding is stochastic

  /// Bytes of an encoded chunk: the amax, the value codes, the positions.
  DILOCO_HD static constexpr std::size_t stride() { return 4 + value_bytes + index_bytes; }
  /// Entries a chunk of len elements sends.
  DILOCO_HD static constexpr std::size_t entries(std::size_t len) { return len < K ? len : K; }

  /// Encodes the chunk's K largest magnitudes (ties to the lower index, NaN first) against its
  /// amax; dq receives decode(out). `stream` and `index0 + j` seed stochastic rounding.
  DILOCO_FORCEINLINE void encode(const float* v, std::size_t len, std::byte* out, float* dq, std::uint64_t stream,
                                 std::uint64_t index0) const {
    len = std::min(len, Chunk);
    std::uint64_t idx[Chunk];
    float sdq[K];
    const std::size_t n = encode_entries(v, len, out, idx, sdq, stream, index0);
    std::fill(dq, dq + len, 0.0f);
    for (std::size_t e = 0; e < n; ++e) dq[idx[e]] = sdq[e];
  }

  /// encode() without the dense dq: writes the chunk's bytes to out, the
  /// n = entries(len) positions it sends (increasing) to idx[0, n) (idx has
  /// room for Chunk) and their decoded values to sdq[0, n), and returns n.
  /// encode()'s dq is sdq[e] at idx[e] and zero elsewhere, so a caller that
  /// wants v - dq subtracts sdq at the n positions and keeps v elsewhere
  /// (v - 0 is v, -0 and NaN included), as the host's encode pass does
  /// (kernels/compressed_passes.hpp).
  /// With Width 512 or 256, the selection's compactions and searches run
  /// in AVX-512 or AVX2 (select<Width>: only where
  /// kernels::host_simd::avx512(), enabled()); the same bytes.
  template <int Width = 0>
  DILOCO_FORCEINLINE std::size_t encode_entries(const float* v, std::size_t len, std::byte* out, std::uint64_t* idx,
                                                float* sdq, std::uint64_t stream, std::uint64_t index0) const {
    len = std::min(len, Chunk);
    const std::size_t n = entries(len);
    // Selection: the n largest keys (|v| bits, then the lower index), so
    // every tie is decided and the result is the same on every machine.
    select<Width>(v, len, n, idx);
    float sel[K], q[K];
    for (std::size_t e = 0; e < n; ++e) sel[e] = v[idx[e]];
    const float amax = kernels::block_amax(sel, n);
    constexpr auto g = kernels::grid<Values>();
    if constexpr (Rounding::stochastic)
      kernels::quantize_block<true>(sel, n, amax, g, q, sdq, detail_bits::draw_at{stream, index0, idx});
    else
      kernels::quantize_block<false>(sel, n, amax, g, q, sdq, detail_bits::no_draw{});
    std::memset(out, 0, stride());
    std::memcpy(out, &amax, 4);
    detail_bits::pack_fields(out + 4, n, value_bits, [&](std::size_t e) { return g.code(q[e]); });
    detail_bits::pack_fields(out + 4 + value_bytes, n, index_bits, [&](std::size_t e) { return static_cast<unsigned>(idx[e]); });
    return n;
  }

  /// The positions of the n largest keys of v[0, len) (key: |v| bits, then
  /// the lower index; n <= len), in increasing order, into idx[0, n). The
  /// top n of a total order are one set however they are found: where the
  /// chunk has at least 2n groups of 8 by the n-th largest magnitude, which
  /// the groups' largest bound (select_bounded), otherwise by a histogram
  /// of the magnitudes (select_binned). With Width 512 (call it only where
  /// kernels::host_simd::avx512()) or 256 (where enabled()),
  /// select_bounded's compactions and searches run in AVX-512
  /// (detail_topk::avx512) or AVX2 (detail_topk::avx2): the same positions.
  template <int Width = 0>
  DILOCO_FORCEINLINE static void select(const float* v, std::size_t len, std::size_t n, std::uint64_t* idx) {
    if (n >= len) {
      for (std::size_t j = 0; j < len; ++j) idx[j] = j;
      return;
    }
    if (len % 8 == 0 && len / 8 >= 2 * n)
      select_bounded<Width>(v, len, n, idx);
    else
      select_binned(v, len, n, idx);
  }

  /// select() by a bound (len a multiple of 8, at least 2n groups of 8,
  /// n < len). The n-th largest magnitude t decides the selection: every
  /// element above t, then the first of those equal to t (ties to the lower
  /// index), collected in one pass in position order that stops when it has
  /// n. t is found without ordering anything: the n-th largest of the
  /// groups' largest magnitudes is at most t (n groups each hold one at
  /// least that), so t is it when fewer than n elements exceed it, and
  /// otherwise t is the n-th largest of the elements above it, which lie in
  /// fewer than n groups (those whose largest exceeds it). Each n-th largest
  /// is built bit by bit (nth_largest), in counting passes that vectorize,
  /// where a selection's comparisons branch on the data; passes skip the
  /// groups whose largest is below what they look for. The groups are the
  /// columns of the chunk seen as 8 rows of G = len / 8 (group g holds
  /// elements g, g + G, ..., g + 7G): any partition into groups of 8 bounds
  /// t the same way, and the columns' largest are an element-wise maximum
  /// of the rows, which vectorizes where a maximum within 8 neighbours
  /// does not. The last pass walks the rows in order and each row's warm
  /// columns in order, which is position order. With a Width the lists are
  /// compacted a vector at a time, the last pass gathers, and each n-th
  /// largest narrows its candidates as it decides their bits
  /// (detail_topk::avx512, avx2): on a chunk whose magnitudes spread those
  /// were most of the time, in loops a compiler does not vectorize.
  template <int Width = 0>
  DILOCO_FORCEINLINE static void select_bounded(const float* v, std::size_t len, std::size_t n, std::uint64_t* idx) {
    constexpr bool wide = detail_topk::compiled && (Width == 512 || Width == 256);
    using ops = std::conditional_t<Width == 512, detail_topk::avx512, detail_topk::avx2>;
    auto magnitude = [v](std::size_t j) { return kernels::float_bits(v[j]) & 0x7fffffffu; };
    constexpr std::size_t most = Chunk / 8 > 0 ? Chunk / 8 : 1;
    const std::size_t groups = len / 8;
    std::uint32_t top[most];
    for (std::size_t g = 0; g < groups; ++g) top[g] = magnitude(g);
    for (std::size_t i = 1; i < 8; ++i)
      for (std::size_t g = 0; g < groups; ++g) top[g] = magnitude(i * groups + g) > top[g] ? magnitude(i * groups + g) : top[g];
    std::uint32_t hi = 0;
    for (std::size_t g = 0; g < groups; ++g) hi = top[g] > hi ? top[g] : hi;
    // A lower bound to start from: with n runs of 8 groups or more, the
    // smallest of the runs' largest (n of `top`, one per run, are at least
    // it), else 0. A chunk of equal magnitudes has it equal to hi. The runs
    // are the columns of `top` seen as 8 rows, as the groups are the
    // chunk's.
    std::uint32_t lo = 0;
    if constexpr (most >= 8) {  // a smaller chunk has no run of 8 groups
      if (const std::size_t runs = groups / 8; runs >= n) {
        std::uint32_t run_top[most / 8];
        for (std::size_t r = 0; r < runs; ++r) run_top[r] = top[r];
        for (std::size_t i = 1; i < 8; ++i)
          for (std::size_t r = 0; r < runs; ++r) run_top[r] = top[i * runs + r] > run_top[r] ? top[i * runs + r] : run_top[r];
        lo = hi;
        for (std::size_t r = 0; r < runs; ++r) lo = run_top[r] < lo ? run_top[r] : lo;
      }
    }
    // The groups whose largest is at least t (warm: every element at least
    // t lies in one), in order, listed without branches (which they are
    // follows the data). The arrays have 16 more entries than they can
    // hold: detail_topk::avx512's compactions store 16 lanes a step.
    std::uint32_t t = lo;
    std::uint32_t warm[most + 16];
    std::size_t w = 0;
    if (lo != hi) {
      // Only the groups whose largest is in [lo, hi] decide t: gathered
      // without branches first, and the warm ones listed from them.
      std::uint32_t in_range[most + 16];
      std::uint32_t in_group[most + 16];
      std::size_t c = 0;
      if constexpr (wide) {
        c = ops::compact_at_least(top, nullptr, groups, lo, in_range, in_group);
      } else {
        for (std::size_t g = 0; g < groups; ++g) {
          in_range[c] = top[g];
          in_group[c] = static_cast<std::uint32_t>(g);
          c += top[g] >= lo;
        }
      }
      if constexpr (wide) {
        std::uint32_t scratch[most + 16];
        t = detail_topk::narrowing_nth_largest<ops>(in_range, c, n, lo, hi, scratch);
      } else {
        t = nth_largest(in_range, c, n, lo, hi);
      }
      if constexpr (wide) {
        w = ops::compact_at_least(in_range, in_group, c, t, nullptr, warm);
      } else {
        for (std::size_t u = 0; u < c; ++u) {
          warm[w] = in_group[u];
          w += in_range[u] >= t;
        }
      }
    } else {
      if constexpr (wide) {
        w = ops::compact_at_least(top, nullptr, groups, t, nullptr, warm);
      } else {
        for (std::size_t g = 0; g < groups; ++g) {
          warm[w] = static_cast<std::uint32_t>(g);
          w += top[g] >= t;
        }
      }
    }
    std::size_t e = 0;
    if (t == hi) {
      // Nothing exceeds the bound: the first n of the elements equal to it,
      // in position order (rows in order, each row's warm columns in order),
      // stopping at the n-th (a flat chunk has it early in its first row).
      for (std::size_t i = 0; i < 8 && e < n; ++i)
        for (std::size_t q = 0; q < w && e < n; ++q) {
          const std::size_t j = i * groups + warm[q];
          idx[e] = j;
          e += static_cast<std::size_t>(magnitude(j) == t);
        }
      return;
    }
    // Every element at least the bound (n or more of them, t's among them),
    // its magnitude and position, gathered in position order without
    // branches; t is the n-th largest of their magnitudes, and the
    // selection those above it and the first of those equal to it,
    // filtered in place (the e-th kept is at or after the e-th gathered).
    // The wide form gathers positions into pos (32 bits) and the filter
    // widens the ones it keeps.
    std::uint32_t cm[Chunk + 16];
    [[maybe_unused]] std::uint32_t pos[wide ? Chunk + 16 : 1];
    std::size_t c = 0;
    if constexpr (wide) {
      c = ops::gather_at_least(v, groups, warm, w, t, cm, pos);
    } else {
      for (std::size_t i = 0; i < 8; ++i)
        for (std::size_t q = 0; q < w; ++q) {
          const std::size_t j = i * groups + warm[q];
          cm[c] = magnitude(j);
          idx[c] = j;
          c += cm[c] >= t;
        }
    }
    if (c > n) {
      if constexpr (wide) {
        std::uint32_t scratch[Chunk + 16];
        t = detail_topk::narrowing_nth_largest<ops>(cm, c, n, t, hi, scratch);
      } else {
        t = nth_largest(cm, c, n, t, hi);
      }
    }
    std::size_t above = 0;
    for (std::size_t u = 0; u < c; ++u) above += cm[u] > t;
    std::size_t ties = n - above;  // of the magnitudes equal to t, the first ones
    for (std::size_t u = 0; u < c; ++u) {
      const bool tie = cm[u] == t && ties != 0;
      if constexpr (wide)
        idx[e] = pos[u];
      else
        idx[e] = idx[u];
      e += static_cast<std::size_t>(cm[u] > t) | static_cast<std::size_t>(tie);
      ties -= static_cast<std::size_t>(tie);
    }
  }

  /// The n-th largest of x[0, count) (1 <= n <= count), given that it lies
  /// in [lo, hi]: the bits lo and hi share are its bits; below them it is
  /// built bit by bit from the top as the largest value with at least n of
  /// x at or above it.
  DILOCO_FORCEINLINE static std::uint32_t nth_largest(const std::uint32_t* x, std::size_t count, std::size_t n,
                                                      std::uint32_t lo, std::uint32_t hi) {
    if (lo == hi) return lo;
    auto at_least = [&](std::uint32_t y) {
      std::uint32_t c = 0;
      for (std::size_t i = 0; i < count; ++i) c += x[i] >= y;
      return std::size_t{c};
    };
    int bit = 31;
    while (((lo ^ hi) >> bit) == 0) --bit;  // the highest bit where they differ
    std::uint32_t t = hi & ~static_cast<std::uint32_t>((std::uint64_t{2} << bit) - 1u);
    for (; bit >= 0; --bit)
      if (const std::uint32_t y = t | (1u << bit); at_least(y) >= n) t = y;
    return t;
  }

  /// select() by a histogram (n < len): a histogram of the keys' top 11
  /// bits (the exponent and 3 mantissa bits) finds the bin that holds the
  /// n-th largest, every element above it is selected, and only that bin's
  /// elements are ordered (nth_element) to find how many of it are; a last
  /// pass collects the selected positions in order, so no sort either.
  static void select_binned(const float* v, std::size_t len, std::size_t n, std::uint64_t* idx) {
    auto magnitude = [v](std::size_t j) { return kernels::float_bits(v[j]) & 0x7fffffffu; };
    auto key = [](std::uint32_t mag, std::size_t j) {
      return (static_cast<std::uint64_t>(mag) << 32) | (0xffffffffu - static_cast<std::uint32_t>(j));
    };
    constexpr unsigned bins = 2048, shift = 20;  // |v| bits are 31: their top 11
    // Two histograms, even and odd positions: the counts of neighbours in
    // one bin (most of a chunk's magnitudes share a few) do not wait on
    // each other's stores.
    std::uint16_t count[2][bins];
    std::uint32_t largest = 0;  // where the scan down the bins starts: most bins above are empty
    for (std::size_t j = 0; j < len; ++j) largest = magnitude(j) > largest ? magnitude(j) : largest;
    unsigned bin = largest >> shift;
    // When the top bin alone holds n or more (nearly equal magnitudes, as a
    // flat chunk has), it is the bin, found by one counting pass that
    // vectorizes instead of the histogram (whose counts of one crowded bin
    // wait on each other's stores).
    std::size_t in_top = 0;
    for (std::size_t j = 0; j < len; ++j) in_top += (magnitude(j) >> shift) == bin;
    std::size_t above = 0;  // elements in the bins above `bin`
    std::size_t in_bin = in_top;
    if (in_top < n) {
      for (auto& row : count)
        for (auto& x : row) x = 0;
      for (std::size_t j = 0; j + 1 < len; j += 2) {
        ++count[0][magnitude(j) >> shift];
        ++count[1][magnitude(j + 1) >> shift];
      }
      if (len % 2) ++count[0][magnitude(len - 1) >> shift];
      while (above + count[0][bin] + count[1][bin] < n) above += count[0][bin] + count[1][bin], --bin;
      in_bin = count[0][bin] + count[1][bin];
    }
    const std::size_t need = n - above;  // of the bin's elements, in [1, its count]
    auto greater = [](std::uint64_t a, std::uint64_t b) { return a > b; };
    // The keys of every element in the bin or above, in position order
    // (compacted without branches: store always, move on when it counts;
    // which elements count follows the data, and mispredicted branches were
    // most of the time). The bin's own are ordered in a small local copy to
    // find the smallest selected one; then the list is filtered in place.
    constexpr std::size_t small = 512;
    if (in_bin <= small) {
      // Eight at a time, and only a group with a candidate compacted (few
      // are: about n of len elements).
      const std::uint32_t lowest = static_cast<std::uint32_t>(bin) << shift;
      std::size_t c = 0;
      auto take = [&](std::size_t j) {
        const std::uint32_t m = magnitude(j);
        idx[c] = key(m, j);
        c += m >= lowest;
      };
      std::size_t j = 0;
      for (; j + 8 <= len; j += 8) {
        std::uint32_t group = 0;
        for (std::size_t i = 0; i < 8; ++i) group = magnitude(j + i) > group ? magnitude(j + i) : group;
        if (group >= lowest)
          for (std::size_t i = 0; i < 8; ++i) take(j + i);
      }
      for (; j < len; ++j) take(j);
      std::uint64_t keys[small + 1];  // one more: the store after the last of the bin
      std::size_t found = 0;
      for (std::size_t i = 0; i < c; ++i) {
        keys[found] = idx[i];
        found += (idx[i] >> (32 + shift)) == bin;
      }
      std::nth_element(keys, keys + (need - 1), keys + found, greater);
      const std::uint64_t threshold = keys[need - 1];
      std::size_t e = 0;
      for (std::size_t i = 0; i < c; ++i) {
        const std::uint64_t ki = idx[i];
        idx[e] = 0xffffffffu - (ki & 0xffffffffu);
        e += ki >= threshold;  // every key above the bin is above the threshold too
      }
      return;
    }
    // A crowded bin (magnitudes that share their top bits, as a chunk of
    // nearly equal values does): its keys, narrowed the same way on the
    // next 11 magnitude bits and then the last 9, until what is left to
    // order holds one magnitude (ties by position), then one more pass.
    std::size_t c = 0;
    for (std::size_t j = 0; j < len; ++j) {
      const std::uint32_t m = magnitude(j);
      idx[c] = key(m, j);
      c += (m >> shift) == bin;
    }
    std::size_t left = need;  // of the keys in idx[0, c)
    for (const unsigned field : {9u, 0u}) {
      const unsigned width = field == 9u ? 11u : 9u;
      auto part = [&](std::uint64_t k) { return static_cast<unsigned>(k >> (32 + field)) & ((1u << width) - 1u); };
      // The top sub-bin, and whether it alone holds what is left (as above).
      unsigned sb = 0;
      for (std::size_t i = 0; i < c; ++i) sb = part(idx[i]) > sb ? part(idx[i]) : sb;
      std::size_t in_sb = 0;
      for (std::size_t i = 0; i < c; ++i) in_sb += part(idx[i]) == sb;
      if (in_sb < left) {
        std::uint16_t* sub = count[0];
        std::uint16_t* sub2 = count[1];
        for (unsigned b = 0; b < (1u << width); ++b) sub[b] = 0, sub2[b] = 0;
        for (std::size_t i = 0; i + 1 < c; i += 2) ++sub[part(idx[i])], ++sub2[part(idx[i + 1])];
        if (c % 2) ++sub[part(idx[c - 1])];
        std::size_t higher = 0;
        while (higher + sub[sb] + sub2[sb] < left) higher += sub[sb] + sub2[sb], --sb;
        left -= higher;
      }
      std::size_t kept = 0;
      for (std::size_t i = 0; i < c; ++i) {
        const std::uint64_t ki = idx[i];
        idx[kept] = ki;
        kept += part(ki) == sb;
      }
      c = kept;
    }
    // What is left holds one magnitude, its keys in position order, so in
    // decreasing order: the left-th of them is the smallest selected key.
    const std::uint64_t threshold = idx[left - 1];
    std::size_t e = 0;
    for (std::size_t j = 0; j < len && e < n; ++j) {
      const std::uint32_t m = magnitude(j);
      idx[e] = j;
      e += static_cast<std::size_t>((m >> shift) > bin) | static_cast<std::size_t>(key(m, j) >= threshold);
    }
  }

  /// Decodes a chunk into dq[0, len): the sent values, zeros elsewhere.
  DILOCO_HD void decode(const std::byte* in, std::size_t len, float* dq) const {
    len = len < Chunk ? len : Chunk;
    const float amax = factor(in);
    for (std::size_t j = 0; j < len; ++j) dq[j] = 0.0f;
    const std::size_t n = entries(len);
    for (std::size_t e = 0; e < n; ++e) {
      const unsigned i = position(in, e);
      if (i < len) dq[i] = decode_value(value_code(in, e), amax);  // check() refuses i >= len
    }
  }

  /// Element-level access, for the device passes (kernels/topk_blocks.hpp),
  /// which give a chunk's elements to the threads of a team: the same float
  /// operations as encode() and decode() per element, so the same bits.
  DILOCO_HD static float factor(const std::byte* in) {
    float amax;
    std::memcpy(&amax, in, 4);
    return amax;
  }
  /// Entry e's position in the chunk.
  DILOCO_HD static unsigned position(const std::byte* in, std::size_t e) {
    return detail_bits::get_field(in + 4 + value_bytes, e, index_bits);
  }
  /// Entry e's value code.
  DILOCO_HD static unsigned value_code(const std::byte* in, std::size_t e) {
    return detail_bits::get_field(in + 4, e, value_bits);
  }
  /// A selected value against the chunk's amax, as encode() quantizes it (u:
  /// its draw under stochastic rounding).
  DILOCO_HD static void encode_value(float v, float amax, float u, unsigned& code, float& dq) {
    constexpr auto g = kernels::grid<Values>();
    float q;
    if constexpr (Rounding::stochastic)
      kernels::quantize_block<true>(&v, 1, amax, g, &q, &dq, [u](std::size_t) { return u; });
    else
      kernels::quantize_block<false>(&v, 1, amax, g, &q, &dq, [](std::size_t) { return 0.0f; });
    code = g.code(q);
  }
  /// The value a code stands for against the chunk's amax, as decode() computes it.
  DILOCO_HD static float decode_value(unsigned code, float amax) {
    constexpr auto g = kernels::grid<Values>();
    const float x = g.value(code);
    if (kernels::scale_is_normal(amax, levels) || !(amax - amax == 0.0f)) return x * (amax / levels);
    return kernels::dequantize(x, amax, levels);
  }

  /// nullptr when the chunk's bytes are well formed (positions in range and increasing, unused
  /// entries and padding zero), else what is wrong.
  DILOCO_HD const char* check(const std::byte* in, std::size_t len) const {
    for (std::size_t e = 0; e < K; ++e)
      if (const char* why = entry_problem(in, len, e)) return why;
    return padding_problem(in);
  }
  /// Thread t of `threads`' share of check(), for a team scanning one chunk
  /// (kernels::check_blocks): entries t, t + threads, ..., and thread 0 the
  /// padding bits. check() finds a problem iff some share does.
  DILOCO_HD bool share_malformed(const std::byte* in, std::size_t len, std::size_t t, std::size_t threads) const {
    for (std::size_t e = t; e < K; e += threads)
      if (entry_problem(in, len, e)) return true;
    return t == 0 && padding_problem(in) != nullptr;
  }
  /// What is wrong with entry e, if anything: the first entries(len) hold a
  /// valid code at a position inside the chunk, above the previous entry's
  /// (check() reaches entry e only when the earlier ones are fine, so that
  /// is its previous position); the rest are empty.
  DILOCO_HD static const char* entry_problem(const std::byte* in, std::size_t len, std::size_t e) {
    constexpr auto g = kernels::grid<Values>();
    const unsigned code = value_code(in, e);
    const unsigned i = position(in, e);
    if (e >= entries(len))
      return code != 0 || i != 0 ? "chunk_topk entry beyond the chunk's count is not empty" : nullptr;
    if (i >= len) return "chunk_topk position beyond its chunk";
    if (e > 0 && i <= position(in, e - 1)) return "chunk_topk positions not strictly increasing";
    if (!g.valid(code)) return g.invalid;
    return nullptr;
  }
  /// Padding bits after the last value and the last position.
  DILOCO_HD static const char* padding_problem(const std::byte* in) {
    if (const std::size_t used = K * value_bits; used % 8 != 0 && (static_cast<unsigned>(in[4 + used / 8]) >> (used % 8)) != 0)
      return "non-zero padding bits after the chunk_topk values";
    if (const std::size_t used = K * index_bits;
        used % 8 != 0 && (static_cast<unsigned>(in[4 + value_bytes + used / 8]) >> (used % 8)) != 0)
      return "non-zero padding bits after the chunk_topk positions";
    return nullptr;
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
