// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "diloco/codec/block_codec.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/codec/packed_codes.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/codec/grids.hpp"
#include "diloco/codec/group_bytes.hpp"
#include "diloco/core/host_cpu.hpp"
#include "diloco/codec/quantize.hpp"
#include "diloco/core/random.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The element-level form of blockwise_codec<Format, B, Rounding> (see
/// codec/element_codec.hpp for the members): a 4-byte factor (the block's
/// amax), then the codes (Format::bits each, packed from the low bits of
/// each byte). The device team programs code a block element by element
/// through it (kernels/codec_elements.hpp); the host block loops quantize
/// through the same codec/quantize.hpp functions (quantize_block) and
/// decode through it, so both give the same bytes and values.
template <class Format, std::size_t B, class Rounding>
struct blockwise_elements {
  ///@{
  /// The layout: the block size, elements per group, whether codes need the block's amax,
  /// whether rounding is stochastic, the block's bytes, where the codes start, a group's bytes,
  /// the format's levels and bits, a code's bit mask and type.
  static constexpr std::size_t block = B;
  static constexpr std::size_t group = B % 4 == 0 ? 4 : 2;
  static constexpr bool scaled = true;  ///< codes depend on the block's amax (a team max)
  static constexpr bool stochastic = Rounding::stochastic;
  static constexpr std::size_t stride = 4 + B * Format::bits / 8;
  static constexpr std::size_t values_offset = 4;
  static constexpr std::size_t group_bytes = group * Format::bits / 8;
  static constexpr float levels = Format::levels;
  static constexpr int bits = Format::bits;
  static constexpr unsigned mask = (1u << Format::bits) - 1u;
  using code = unsigned;
  ///@}
  static_assert(group * Format::bits % 8 == 0, "a group's codes must fill whole bytes");
  static_assert(stride % group_bytes == 0 && values_offset % group_bytes == 0,
                "every group's codes must be aligned to their size");

  ///@{
  /// The block's factor (its amax), read and written.
  DILOCO_HD static float factor(const std::byte* blk) { return kernels::load_float<stride % 4 == 0>(blk); }
  DILOCO_HD static void put_factor(std::byte* blk, float amax) { kernels::store_float<stride % 4 == 0>(blk, amax); }
  ///@}

  /// What encode and decode need of a block's factor (kernels::quant_terms).
  using factor_terms = kernels::quant_terms;
  /// The terms of a block whose amax is `amax`.
  DILOCO_HD static factor_terms terms(float amax) { return kernels::quant_terms_of(amax, kernels::grid<Format>()); }

  /// q and dq of one element against its block's terms (kernels::quantize_element);
  /// u is the element's draw (stochastic rounding).
  DILOCO_HD static void encode(float v, const factor_terms& f, float u, code& q, float& dq) {
    constexpr auto g = kernels::grid<Format>();
    q = g.code(kernels::quantize_element<stochastic>(v, f, g, u, dq));
  }
  /// Whether every element of the block takes the common case (a positive
  /// finite amax, L / amax finite, amax / L normal): then encode_normal gives
  /// encode's results without its branches.
  DILOCO_HD static bool normal(const factor_terms& f) { return !f.zero && f.normal; }
  /// encode for a block that is normal().
  DILOCO_HD static void encode_normal(float v, const factor_terms& f, float u, code& q, float& dq) {
    constexpr auto g = kernels::grid<Format>();
    q = g.code(kernels::quantize_normal<stochastic>(v, f, g, u, dq));
  }
  /// encode against the block's amax (terms made for this one call).
  DILOCO_HD static void encode(float v, float amax, float u, code& q, float& dq) { encode(v, terms(amax), u, q, dq); }

  /// The value of code q against its block's terms (kernels::dequantize_element).
  DILOCO_HD static float decode(code q, const factor_terms& f) {
    constexpr auto g = kernels::grid<Format>();
    return kernels::dequantize_element(g.value(q), f, levels);
  }
  /// Whether decode is value(q) * scale for every code of the block.
  DILOCO_HD static bool plain(const factor_terms& f) { return f.plain; }
  /// decode for a block that is plain().
  DILOCO_HD static float decode_plain(code q, const factor_terms& f) {
    constexpr auto g = kernels::grid<Format>();
    return g.value(q) * f.scale;
  }
  /// decode against the block's amax.
  DILOCO_HD static float decode(code q, float amax) { return decode(q, terms(amax)); }

  /// The codes of elements [j0, j0 + group), j0 a multiple of group.
  DILOCO_HD static void put_codes(std::byte* blk, std::size_t j0, const code (&q)[group]) {
    constexpr std::size_t per_byte = 8 / bits;
    unsigned char bytes[group_bytes];
    for (std::size_t p = 0; p < group_bytes; ++p) {
      unsigned byte = 0;
      for (std::size_t i = 0; i < per_byte; ++i) byte |= (q[p * per_byte + i] & mask) << (i * bits);
      bytes[p] = static_cast<unsigned char>(byte);
    }
    kernels::store_bytes<group_bytes>(blk + values_offset + j0 * bits / 8, bytes);
  }
  /// Reads the codes of elements [j0, j0 + group) (put_codes' inverse).
  DILOCO_HD static void codes(const std::byte* blk, std::size_t j0, code (&q)[group]) {
    constexpr std::size_t per_byte = 8 / bits;
    unsigned char bytes[group_bytes];
    kernels::load_bytes<group_bytes>(blk + values_offset + j0 * bits / 8, bytes);
    for (std::size_t i = 0; i < group; ++i)
      q[i] = (static_cast<unsigned>(bytes[i / per_byte]) >> ((i % per_byte) * bits)) & mask;
  }
};

/// Block-wise quantization: per block of B elements one fp32 factor (the
/// block's largest magnitude, amax) and B codes of Format::bits bits
/// (codec/formats.hpp; codec/grids.hpp rounds onto each format's
/// values). Sub-byte codes are packed from the low bits: element j sits at
/// bit (j % (8 / bits)) * bits of byte j / (8 / bits), e.g. int4's element
/// 2i in the low nibble. Bytes per parameter: (4 + B * bits / 8) / B, e.g.
/// 1.03 for int8/fp8, 0.53 for int4/fp4 and 0.28 for int2 at B = 128.
template <class Format, std::size_t B, class Rounding>
struct blockwise_codec {
  static_assert(Format::bits == 8 || Format::bits == 4 || Format::bits == 2,
                "blockwise: Format must be int8, int4, int2, fp8_e4m3, fp8_e5m2 or fp4_e3m0");
  static_assert(B >= 2 && B % 2 == 0 && B <= 4096, "blockwise: block size B must be even and in [2, 4096]");
  static_assert(Format::bits != 2 || B % 4 == 0, "blockwise: int2 needs a block size B that is a multiple of 4");
  ///@{
  /// The layout: elements per block, the codec's id in segment headers, bits per code, codes
  /// per byte, bytes of codes per block, the format's largest magnitude, a code's bit mask.
  static constexpr std::size_t block = B;
  static constexpr codec_id id = format_id<Format>();
  static constexpr int bits = Format::bits;
  static constexpr std::size_t per_byte = 8 / Format::bits;
  static constexpr std::size_t value_bytes = B / per_byte;
  static constexpr float levels = Format::levels;
  static constexpr unsigned mask = (1u << Format::bits) - 1u;
  ///@}
  /// The element-level form (the device team programs code through it; decode() here too).
  using elements = blockwise_elements<Format, B, Rounding>;

  /// Bytes of an encoded block: the factor, then the codes (a partial block keeps it,
  /// zero-padded).
  DILOCO_HD static constexpr std::size_t stride() { return 4 + value_bytes; }

  /// Encodes v[0, len) against its amax into out and writes what decode gives into dq;
  /// `stream` and `index0 + j` seed stochastic rounding of element j.
  DILOCO_HD void encode(const float* v, std::size_t len, std::byte* out, float* dq, std::uint64_t stream,
                        std::uint64_t index0) const {
    len = len < B ? len : B;  // blocks never exceed B; saying so bounds the padding loops for the compiler
#if !defined(__CUDA_ARCH__)
    if constexpr (!Rounding::stochastic && fused_nearest)
      if (encode_nearest(v, len, out, dq)) return;
#endif
    const float amax = kernels::block_amax(v, len);
    std::memcpy(out, &amax, 4);
    float q[B];
    constexpr auto g = kernels::grid<Format>();
    if constexpr (Rounding::stochastic)
      kernels::quantize_block<true>(v, len, amax, g, q, dq,
                                    [&](std::size_t j) { return kernels::random_unit(stream, index0 + j); });
    else
      kernels::quantize_block<false>(v, len, amax, g, q, dq, [](std::size_t) { return 0.0f; });
    auto* bytes = reinterpret_cast<unsigned char*>(out + 4);
    if constexpr (Format::bits == 8) {
      for (std::size_t j = 0; j < len; ++j) bytes[j] = static_cast<unsigned char>(g.code(q[j]));
      if (len < value_bytes) std::memset(bytes + len, 0, value_bytes - len);  // padding of a partial block
    } else {
      const std::size_t full = len / per_byte;
      for (std::size_t p = 0; p < full; ++p) {
        unsigned byte = 0;
        for (std::size_t i = 0; i < per_byte; ++i) byte |= (g.code(q[p * per_byte + i]) & mask) << (i * bits);
        bytes[p] = static_cast<unsigned char>(byte);
      }
      std::size_t used = full;
      if (const std::size_t rest = len % per_byte) {
        unsigned byte = 0;
        for (std::size_t i = 0; i < rest; ++i) byte |= (g.code(q[full * per_byte + i]) & mask) << (i * bits);
        bytes[used++] = static_cast<unsigned char>(byte);
      }
      if (used < value_bytes) std::memset(bytes + used, 0, value_bytes - used);
    }
  }

  /// Decodes a block into dq[0, len).
  DILOCO_HD void decode(const std::byte* in, std::size_t len, float* dq) const {
    len = len < B ? len : B;
    float amax;
    std::memcpy(&amax, in, 4);
    const auto t = elements::terms(amax);
    const std::byte* q = in + 4;
    // Normal scales (and NaN/inf factors, which must stay visibly
    // non-finite) multiply; tiny blocks take dequantize()'s exact path.
    if (elements::plain(t)) {
      if constexpr (Format::bits == 8) {
        if constexpr (requires(std::uint32_t c) { kernels::grid_t<Format>::value_branchless(c); }) {
          // fp8: each code's value without a branch (the grid's value() takes
          // one on the exponent field), so the loop vectorizes.
          const float scale = t.scale;
          const auto* DILOCO_RESTRICT bytes = reinterpret_cast<const unsigned char*>(q);
          float* DILOCO_RESTRICT d = dq;
          for (std::size_t j = 0; j < len; ++j) d[j] = kernels::grid_t<Format>::value_branchless(bytes[j]) * scale;
        } else {
          for (std::size_t j = 0; j < len; ++j) dq[j] = elements::decode_plain(static_cast<unsigned>(q[j]), t);
        }
      } else {
        // Whole bytes, their codes unpacked with constant shifts (so the
        // loop vectorizes), then the partial byte.
        const std::size_t full = len / per_byte;
        for (std::size_t p = 0; p < full; ++p) {
          const auto byte = static_cast<unsigned>(q[p]);
          for (std::size_t i = 0; i < per_byte; ++i) dq[p * per_byte + i] = elements::decode_plain((byte >> (i * bits)) & mask, t);
        }
        for (std::size_t j = full * per_byte; j < len; ++j) dq[j] = elements::decode_plain(code(q, j), t);
      }
    } else {
      for (std::size_t j = 0; j < len; ++j) dq[j] = elements::decode(code(q, j), t);
    }
  }

  /// Codes the format never writes (int8's -128, int4's -8, fp8 NaN and inf)
  /// are refused, and padding beyond a partial block must be zero.
  DILOCO_HD const char* check(const std::byte* in, std::size_t len) const {
    std::size_t p = 0;
    if (len >= B) p = clean_prefix(in + 4);
    for (; p < value_bytes; ++p)
      if (const char* why = byte_problem(in + 4, len, p)) return why;
    return nullptr;
  }
  /// For a whole block: how many leading value bytes are certainly valid,
  /// found a word at a time where the format allows it (the int grids, whose
  /// one code never written is the sign bit alone, and int2, which writes
  /// every code); check() looks at the rest byte by byte, so a block with a
  /// bad code still gets the message the byte loop gives.
  DILOCO_HD static std::size_t clean_prefix(const std::byte* q) {
    using grid_type = kernels::grid_t<Format>;
    constexpr std::size_t words = value_bytes / 8;
    static_assert(every_code_valid() || minifloat_pattern_holds(), "blockwise: clean_prefix's test of the codes never written");
    if constexpr (std::is_same_v<grid_type, kernels::int2_grid> || every_code_valid()) {
      return value_bytes;
    } else if constexpr (!is_int_grid && words > 0) {
      // A small float's magnitudes never written are those above max_code,
      // which are exactly the magnitudes m with m & P == P for P = max_code
      // + 1 (a run of ones from the top: e4m3's 0x7f, e5m2's 0x7c..0x7f;
      // minifloat_pattern_holds checks it): a byte is one iff (b & P) ^ P is
      // zero, which (x - ones) & ~x & 0x80.. detects exactly.
      constexpr std::uint64_t pattern = 0x0101010101010101ULL * (Format::max_code + 1u);
      std::uint64_t found = 0;
      for (std::size_t w = 0; w < words; ++w) {
        std::uint64_t x;
        std::memcpy(&x, q + 8 * w, 8);
        x = (x & pattern) ^ pattern;
        found |= (x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL;
      }
      return found == 0 ? words * 8 : 0;
    } else if constexpr (std::is_same_v<grid_type, kernels::int_grid<Format::bits>> && words > 0) {
      // Code c is the sign bit alone iff c ^ sign is zero: a zero field,
      // which (x - ones) & ~x & sign detects exactly, whatever the others.
      constexpr std::uint64_t sign = Format::bits == 8 ? 0x8080808080808080ULL : 0x8888888888888888ULL;
      constexpr std::uint64_t ones = Format::bits == 8 ? 0x0101010101010101ULL : 0x1111111111111111ULL;
      std::uint64_t found = 0;
      for (std::size_t w = 0; w < words; ++w) {
        std::uint64_t x;
        std::memcpy(&x, q + 8 * w, 8);
        x ^= sign;
        found |= (x - ones) & ~x & sign;
      }
      return found == 0 ? words * 8 : 0;
    } else {
      (void)q;
      return 0;
    }
  }
  /// Whether `count` whole blocks, one after another from `first` (stride()
  /// bytes apart), hold only codes the format writes: check() finds nothing
  /// in any of them iff this is true (a whole block has no padding). One
  /// loop over their value bytes that vectorizes at the baseline ISA, a
  /// test per byte without a branch: for the small floats a magnitude above
  /// max_code carries into bit 7 when 127 - max_code is added to it, int8's
  /// code never written is 0x80, int4's a nibble of 8; formats whose every
  /// code is a value (int2, fp4_e3m0) have nothing to find. A receiver runs
  /// it over each run of whole blocks (compress::first_bad_block) and check()
  /// only over a run it refuses, for the message.
  static bool whole_blocks_clean(const std::byte* first, std::size_t count) {
#if defined(DILOCO_HOST_SIMD_X86)
    if (kernels::host_simd::enabled()) return whole_blocks_clean_avx2(first, count);
#endif
    return whole_blocks_clean_loop(first, count);
  }
#if defined(DILOCO_HOST_SIMD_X86)
  /// whole_blocks_clean's loop compiled for AVX2 (chosen at run time, core/host_cpu.hpp).
  __attribute__((target("avx2"))) static bool whole_blocks_clean_avx2(const std::byte* first, std::size_t count) {
    return whole_blocks_clean_loop(first, count);
  }
#endif
  /// whole_blocks_clean's loop at the baseline ISA.
  DILOCO_FORCEINLINE static bool whole_blocks_clean_loop(const std::byte* first, std::size_t count) {
    if constexpr (every_code_valid()) {
      (void)first;
      (void)count;
      return true;
    } else {
      // Each value byte position's findings gathered over the blocks (so the
      // loop body is whole vectors, no reduction per block), then folded.
      unsigned char found[value_bytes] = {};
      for (std::size_t k = 0; k < count; ++k) {
        const auto* DILOCO_RESTRICT q = reinterpret_cast<const unsigned char*>(first + k * stride() + 4);
        for (std::size_t p = 0; p < value_bytes; ++p) found[p] = static_cast<unsigned char>(found[p] | bad_bits(q[p]));
      }
      unsigned bad = 0;
      for (std::size_t p = 0; p < value_bytes; ++p) bad |= found[p];
      return bad == 0;
    }
  }
  /// Non-zero iff value byte b (of a whole block) holds a code the format never writes.
  DILOCO_HD static constexpr unsigned char bad_bits(unsigned char b) {
    if constexpr (!is_int_grid && Format::bits == 8) {
      static_assert(minifloat_pattern_holds(), "blockwise: bad_bits' test of the small floats");
      return static_cast<unsigned char>(((b & 0x7fu) + (0x7fu - Format::max_code)) & 0x80u);
    } else if constexpr (is_int_grid && Format::bits == 8) {
      return static_cast<unsigned char>(0u - static_cast<unsigned>(b == 0x80u));
    } else if constexpr (is_int_grid && Format::bits == 4) {
      // A nibble of 8 is a zero nibble of x = b ^ 0x88; a nibble n is
      // non-zero iff bit 3 of (n & 7) + 7 or of n is set (no carry leaves
      // a nibble: 7 + 7 < 16).
      const unsigned x = b ^ 0x88u;
      return static_cast<unsigned char>(~(((x & 0x77u) + 0x77u) | x) & 0x88u);
    } else {
      constexpr auto g = kernels::grid<Format>();
      unsigned char out = 0;
      for (std::size_t i = 0; i < per_byte; ++i) out |= static_cast<unsigned char>(!g.valid((b >> (i * bits)) & mask));
      return out;
    }
  }

  /// Thread t of `threads`' share of check(), for a team scanning one block
  /// (kernels::check_blocks): value bytes t, t + threads, ... check() finds
  /// a problem iff some share does; which one it is, check() says.
  DILOCO_HD bool share_malformed(const std::byte* in, std::size_t len, std::size_t t, std::size_t threads) const {
    for (std::size_t p = t; p < value_bytes; p += threads)
      if (byte_problem(in + 4, len, p)) return true;
    return false;
  }
  /// What is wrong with value byte p of a block of len elements, if anything:
  /// its codes must be valid below len and zero from len on. Invalid codes
  /// only sit below the partial byte and padding from it on, so the first
  /// bad byte names the problem check() has always named first.
  DILOCO_HD static const char* byte_problem(const std::byte* q, std::size_t len, std::size_t p) {
    constexpr auto g = kernels::grid<Format>();
    const auto byte = static_cast<unsigned>(q[p]);
    const std::size_t first = p * per_byte;
    if (first >= len) return byte != 0 ? "non-zero padding after a partial block" : nullptr;
    for (std::size_t i = 0; i < per_byte && first + i < len; ++i)
      if (!g.valid((byte >> (i * bits)) & mask)) return g.invalid;
    if (const std::size_t rest = len - first; rest < per_byte && (byte >> (rest * bits)) != 0)
      return "non-zero padding bits in a partial block's last byte";
    return nullptr;
  }

  /// Whether every code of the format is a value (int2, fp4_e3m0).
  DILOCO_HD static constexpr bool every_code_valid() {
    if constexpr (requires { Format::max_code; })
      return Format::max_code + 1u == 1u << (Format::bits - 1);
    else
      return false;
  }
  /// The integer grids (int8, int4), whose one code never written clean_prefix finds its own way.
  static constexpr bool is_int_grid = std::is_same_v<kernels::grid_t<Format>, kernels::int_grid<Format::bits>>;
  /// Whether the host encodes with round to nearest by encode_nearest: the
  /// small floats, whose rounding finds two neighbours per element with
  /// branches (int2's and the integer grids' already vectorize).
  static constexpr bool fused_nearest = requires(float y, unsigned c) { kernels::grid_t<Format>::round_nearest_code(y, c); };
  /// clean_prefix's test of the small floats: the magnitudes above max_code
  /// are those that have every bit of max_code + 1.
  DILOCO_HD static constexpr bool minifloat_pattern_holds() {
    if constexpr (requires { Format::max_code; }) {
      constexpr unsigned p = Format::max_code + 1u, top = 1u << (Format::bits - 1);
      for (unsigned m = 0; m < top; ++m)
        if ((m > Format::max_code) != ((m & p) == p)) return false;
    }
    return true;
  }

  /// encode() with round to nearest for a block on quantize_block's common
  /// path (a positive finite amax, L / amax finite, amax / L normal), in
  /// one loop that vectorizes: each element rounded and coded without
  /// branches (the grid's round_nearest_code), its codes packed a word at a
  /// time. The same float operations, so the same bytes and dq; any other
  /// block returns false and takes encode()'s own path.
  bool encode_nearest(const float* v, std::size_t len, std::byte* out, float* dq) const {
    const float amax = kernels::block_amax(v, len);
    const float inv = levels / amax;
    const float scale = amax / levels;
    if (!(amax > 0.0f) || !(amax - amax == 0.0f) || !(inv - inv == 0.0f) || !(scale >= 1.17549435e-38f)) return false;
    std::memcpy(out, &amax, 4);
    constexpr auto g = kernels::grid<Format>();
    alignas(16) unsigned char c[B];
    const float* DILOCO_RESTRICT x = v;
    float* DILOCO_RESTRICT d = dq;
    for (std::size_t j = 0; j < len; ++j) {
      const float y = x[j] * inv;
      unsigned cj;
      const float r = g.round_nearest_code(y, cj);
      d[j] = r * scale;
      c[j] = static_cast<unsigned char>(cj);
    }
    auto* bytes = reinterpret_cast<unsigned char*>(out + 4);
    const std::size_t used = packed_codes::pack<Format::bits>(c, len, bytes);
    if (used < value_bytes) std::memset(bytes + used, 0, value_bytes - used);
    return true;
  }
  /// The code of element j.
  DILOCO_HD static unsigned code(const std::byte* q, std::size_t j) {
    if constexpr (Format::bits == 8)
      return static_cast<unsigned>(q[j]);
    else
      return (static_cast<unsigned>(q[j / per_byte]) >> ((j % per_byte) * bits)) & mask;
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
