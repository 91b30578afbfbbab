// SPDX-License-Identifier: Apache-2.0
#pragma once

// Element-level access to a block codec's bytes, for the device passes
// (kernels/compressed_blocks.hpp), which give the elements of a codec block
// to the threads of a team instead of the whole block to one call. Each
// function performs exactly the float operations the codec's own
// encode/decode performs for that element (codec/blockwise.hpp,
// codec/cast.hpp), so a block coded element by element has the same
// bytes, bit for bit.
//
// Elements go in groups of `group` consecutive elements (4, or 2 when B is
// not a multiple of 4) whose codes fill `group_bytes` consecutive bytes of
// the block; the layouts below keep every group's bytes aligned to their
// size, so a thread moves them with one access.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/codec/blockwise.hpp"
#include "diloco/codec/cast.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/codec/float_formats.hpp"
#include "diloco/codec/quantize.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

namespace detail {

template <std::size_t N>
struct word_of;
template <>
struct word_of<1> {
  using type = std::uint8_t;
};
template <>
struct word_of<2> {
  using type = std::uint16_t;
};
template <>
struct word_of<4> {
  using type = std::uint32_t;
};
template <>
struct word_of<8> {
  using type = std::uint64_t;
};

}  // namespace detail

/// N bytes (N = 1, 2, 4, 8) as one access on the device, where `p` must be
/// N-byte aligned; byte copies on the host (same bytes, no alignment rules).
template <std::size_t N>
DILOCO_HD DILOCO_FORCEINLINE void store_bytes(std::byte* p, const unsigned char (&bytes)[N]) {
#if defined(__CUDA_ARCH__)
  typename detail::word_of<N>::type w;
  std::memcpy(&w, bytes, N);
  *reinterpret_cast<typename detail::word_of<N>::type*>(p) = w;
#else
  std::memcpy(p, bytes, N);
#endif
}

/// The load of store_bytes: N bytes as one access on the device (p N-byte aligned there).
template <std::size_t N>
DILOCO_HD DILOCO_FORCEINLINE void load_bytes(const std::byte* p, unsigned char (&bytes)[N]) {
#if defined(__CUDA_ARCH__)
  const typename detail::word_of<N>::type w = *reinterpret_cast<const typename detail::word_of<N>::type*>(p);
  std::memcpy(bytes, &w, N);
#else
  std::memcpy(bytes, p, N);
#endif
}

/// An fp32 at `p`, which is 4-byte aligned when Aligned (else read bytewise).
template <bool Aligned>
DILOCO_HD DILOCO_FORCEINLINE float load_float(const std::byte* p) {
  float x;
  if constexpr (Aligned) {
    unsigned char b[4];
    load_bytes<4>(p, b);
    std::memcpy(&x, b, 4);
  } else {
    std::memcpy(&x, p, 4);
  }
  return x;
}
/// The store of load_float: an fp32 to `p`, 4-byte aligned when Aligned.
template <bool Aligned>
DILOCO_HD DILOCO_FORCEINLINE void store_float(std::byte* p, float x) {
  if constexpr (Aligned) {
    unsigned char b[4];
    std::memcpy(b, &x, 4);
    store_bytes<4>(p, b);
  } else {
    std::memcpy(p, &x, 4);
  }
}

/// Codecs without an element-level form (top-k selects per block) have
/// supported == false; the device compressed mean refuses them.
template <class Codec>
struct codec_elements {
  /// No element-level form.
  static constexpr bool supported = false;
};

/// A codec that carries its element-level form as `Codec::elements` (a codec
/// written once as elements: codec/element_codec.hpp) serves the team
/// programs through it; the form has the members the specialisations below
/// have (block, group, scaled, stochastic, stride, code, factor, put_factor,
/// factor_terms, terms, normal, encode_normal, encode, plain, decode_plain,
/// decode, put_codes, codes).
template <class Codec>
  requires requires { typename Codec::elements; }
struct codec_elements<Codec> : Codec::elements {
  using codec = Codec;  ///< the codec
  static constexpr bool supported = true;  ///< it has an element-level form
};

/// blockwise<Format, B>: a 4-byte factor (the block's amax), then the codes
/// (Format::bits each, packed from the low bits of each byte).
template <class Format, std::size_t B, class Rounding>
struct codec_elements<compress::blockwise_codec<Format, B, Rounding>> {
  ///@{
  /// The codec, and its element-level layout: that it has one, the block size, elements per
  /// group, whether codes need the block's amax, whether rounding is stochastic, the block's
  /// bytes, where the codes start, a group's bytes, the format's levels and bits, and a code's
  /// type.
  using codec = compress::blockwise_codec<Format, B, Rounding>;
  static constexpr bool supported = true;
  static constexpr std::size_t block = B;
  static constexpr std::size_t group = B % 4 == 0 ? 4 : 2;
  static constexpr bool scaled = true;  ///< codes depend on the block's amax (a team max)
  static constexpr bool stochastic = Rounding::stochastic;
  static constexpr std::size_t stride = codec::stride();
  static constexpr std::size_t values_offset = 4;
  static constexpr std::size_t group_bytes = group * Format::bits / 8;
  static constexpr float levels = Format::levels;
  static constexpr int bits = Format::bits;
  using code = unsigned;
  ///@}
  static_assert(group * Format::bits % 8 == 0, "a group's codes must fill whole bytes");
  static_assert(stride % group_bytes == 0 && values_offset % group_bytes == 0,
                "every group's codes must be aligned to their size");

  ///@{
  /// The block's factor (its amax), read and written.
  DILOCO_HD static float factor(const std::byte* blk) { return load_float<stride % 4 == 0>(blk); }
  DILOCO_HD static void put_factor(std::byte* blk, float amax) { store_float<stride % 4 == 0>(blk, amax); }
  ///@}

  /// What encode and decode need of a block's factor, worked out once per
  /// block: the two divisions quantize_block and decode make (L / amax and
  /// amax / L) and the case they select. Each is an IEEE division, about ten
  /// instructions on the device; made per element they were most of the
  /// int8 encode's and the shard reduce's instructions.
  struct factor_terms {
    float amax;   ///< the block's amax
    float inv;    ///< L / amax
    float scale;  ///< amax / L
    bool zero;    ///< amax is 0, infinite or NaN: every code 0, dq = zero_dq
    bool normal;  ///< inv finite and scale normal: q = round(v * inv), dq = q * scale
    bool plain;   ///< decode as value(q) * scale (a normal scale, or a non-finite amax)
    float zero_dq;  ///< dq of a zero block: 0, or NaN/inf
  };
  /// The terms of a block whose amax is `amax`.
  DILOCO_HD static factor_terms terms(float amax) {
    constexpr auto g = grid<Format>();
    factor_terms f{};
    f.amax = amax;
    f.inv = levels / amax;
    f.scale = amax / levels;
    const bool finite = amax - amax == 0.0f;
    f.zero = !(amax > 0.0f) || !finite;
    f.normal = f.inv - f.inv == 0.0f && f.scale >= 1.17549435e-38f;
    f.plain = f.scale >= 1.17549435e-38f || !finite;
    f.zero_dq = g.value(g.code(0.0f)) * f.scale;
    return f;
  }

  /// q and dq of one element against its block's terms, as quantize_block
  /// computes them for it (the same float operations, the divisions made
  /// once in terms()); u is the element's draw (stochastic rounding).
  DILOCO_HD static void encode(float v, const factor_terms& f, float u, code& q, float& dq) {
    if (normal(f)) return encode_normal(v, f, u, q, dq);
    constexpr auto g = grid<Format>();
    float r;
    if (f.zero) {
      r = 0.0f;
      dq = f.zero_dq;
    } else {  // tiny blocks: see quantize_block
      r = g.template round<stochastic>(f.inv - f.inv == 0.0f ? v * f.inv : (v / f.amax) * levels, u);
      dq = dequantize(r, f.amax, levels);
    }
    q = g.code(r);
  }
  /// Whether every element of the block takes quantize_block's common
  /// case (a positive finite amax, L / amax finite, amax / L normal): then
  /// encode_normal gives encode's results without its branches.
  DILOCO_HD static bool normal(const factor_terms& f) { return !f.zero && f.normal; }
  /// encode for a block that is normal().
  DILOCO_HD static void encode_normal(float v, const factor_terms& f, float u, code& q, float& dq) {
    constexpr auto g = grid<Format>();
    const float r = g.template round<stochastic>(v * f.inv, u);
    dq = r * f.scale;
    q = g.code(r);
  }
  /// encode against the block's amax (terms made for this one call).
  DILOCO_HD static void encode(float v, float amax, float u, code& q, float& dq) { encode(v, terms(amax), u, q, dq); }

  /// blockwise_codec::decode for one element, against its block's terms.
  DILOCO_HD static float decode(code q, const factor_terms& f) {
    constexpr auto g = grid<Format>();
    return f.plain ? decode_plain(q, f) : dequantize(g.value(q), f.amax, levels);
  }
  /// Whether decode is value(q) * scale for every code of the block.
  DILOCO_HD static bool plain(const factor_terms& f) { return f.plain; }
  /// decode for a block that is plain().
  DILOCO_HD static float decode_plain(code q, const factor_terms& f) {
    constexpr auto g = grid<Format>();
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
      for (std::size_t i = 0; i < per_byte; ++i) byte |= (q[p * per_byte + i] & codec::mask) << (i * bits);
      bytes[p] = static_cast<unsigned char>(byte);
    }
    store_bytes<group_bytes>(blk + values_offset + j0 * bits / 8, bytes);
  }
  /// Reads the codes of elements [j0, j0 + group) (put_codes' inverse).
  DILOCO_HD static void codes(const std::byte* blk, std::size_t j0, code (&q)[group]) {
    constexpr std::size_t per_byte = 8 / bits;
    unsigned char bytes[group_bytes];
    load_bytes<group_bytes>(blk + values_offset + j0 * bits / 8, bytes);
    for (std::size_t i = 0; i < group; ++i)
      q[i] = (static_cast<unsigned>(bytes[i / per_byte]) >> ((i % per_byte) * bits)) & codec::mask;
  }
};

/// cast<bf16|fp16>: 2 bytes per element, no factor.
template <class Format, class Rounding, std::size_t B>
struct codec_elements<compress::cast_codec<Format, Rounding, B>> {
  ///@{
  /// The codec, and its element-level layout: the 16-bit format's bit conversions, that it has
  /// one, the block size, elements per group, no amax, whether rounding is stochastic, the
  /// block's bytes, where the codes start, a group's bytes, and a code's type.
  using codec = compress::cast_codec<Format, Rounding, B>;
  using bits_format = typename codec::bits_format;
  static constexpr bool supported = true;
  static constexpr std::size_t block = B;
  static constexpr std::size_t group = B % 4 == 0 ? 4 : 2;
  static constexpr bool scaled = false;
  static constexpr bool stochastic = Rounding::stochastic;
  static constexpr std::size_t stride = codec::stride();
  static constexpr std::size_t values_offset = 0;
  static constexpr std::size_t group_bytes = 2 * group;
  using code = std::uint16_t;
  ///@}
  static_assert(B % 2 == 0, "device casts need an even block size");

  ///@{
  /// No factor: reads 0, writes nothing.
  DILOCO_HD static float factor(const std::byte*) { return 0.0f; }
  DILOCO_HD static void put_factor(std::byte*, float) {}
  ///@}

  /// No factor, nothing to work out per block.
  struct factor_terms {};
  /// The (empty) terms of any block.
  DILOCO_HD static factor_terms terms(float /*amax*/) { return {}; }

  /// h and dq of one element, as cast_codec::encode rounds it; u is the element's draw
  /// (stochastic rounding).
  DILOCO_HD static void encode(float v, float /*amax*/, float u, code& h, float& dq) {
    h = encode_float16<bits_format>(v, stochastic ? u : -1.0f);
    dq = bits_format::decode(h);
  }
  /// encode, with the (empty) terms of the block.
  DILOCO_HD static void encode(float v, factor_terms, float u, code& h, float& dq) { encode(v, 0.0f, u, h, dq); }
  ///@{
  /// No factor: every block is normal() and plain(), and the fast forms are encode and decode.
  DILOCO_HD static bool normal(factor_terms) { return true; }
  DILOCO_HD static void encode_normal(float v, factor_terms, float u, code& h, float& dq) { encode(v, 0.0f, u, h, dq); }
  DILOCO_HD static bool plain(factor_terms) { return true; }
  DILOCO_HD static float decode_plain(code h, factor_terms) { return bits_format::decode(h); }
  ///@}
  ///@{
  /// cast_codec::decode for one element (the factor or its terms are ignored).
  DILOCO_HD static float decode(code h, float /*amax*/) { return bits_format::decode(h); }
  DILOCO_HD static float decode(code h, factor_terms) { return bits_format::decode(h); }
  ///@}

  ///@{
  /// The codes of elements [j0, j0 + group), j0 a multiple of group, written and read.
  DILOCO_HD static void put_codes(std::byte* blk, std::size_t j0, const code (&h)[group]) {
    unsigned char bytes[group_bytes];
    for (std::size_t i = 0; i < group; ++i) std::memcpy(bytes + 2 * i, &h[i], 2);
    store_bytes<group_bytes>(blk + 2 * j0, bytes);
  }
  DILOCO_HD static void codes(const std::byte* blk, std::size_t j0, code (&h)[group]) {
    unsigned char bytes[group_bytes];
    load_bytes<group_bytes>(blk + 2 * j0, bytes);
    for (std::size_t i = 0; i < group; ++i) std::memcpy(&h[i], bytes + 2 * i, 2);
  }
  ///@}
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
