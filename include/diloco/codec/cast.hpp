// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "diloco/codec/blockwise.hpp"
#include "diloco/codec/block_codec.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/codec/float_formats.hpp"
#include "diloco/codec/group_bytes.hpp"
#include "diloco/core/random.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The element-level form of cast_codec<Format, Rounding, B> (see
/// codec/element_codec.hpp for the members): 2 bytes per element, no
/// factor. The device team programs code through it
/// (kernels/codec_elements.hpp); the host block loops encode and decode
/// each element through the same functions.
template <class Format, class Rounding, std::size_t B>
struct cast_elements {
  ///@{
  /// The 16-bit format's bit conversions, and the element-level layout: the block size,
  /// elements per group, no amax, whether rounding is stochastic, the block's bytes, where the
  /// codes start, a group's bytes, and a code's type.
  using bits_format = std::conditional_t<std::is_same_v<Format, bf16>, kernels::bf16_format, kernels::fp16_format>;
  static constexpr std::size_t block = B;
  static constexpr std::size_t group = B % 4 == 0 ? 4 : 2;
  static constexpr bool scaled = false;
  static constexpr bool stochastic = Rounding::stochastic;
  static constexpr std::size_t stride = 2 * B;
  static constexpr std::size_t values_offset = 0;
  static constexpr std::size_t group_bytes = 2 * group;
  using code = std::uint16_t;
  ///@}

  ///@{
  /// No factor: reads 0, writes nothing.
  DILOCO_HD static float factor(const std::byte*) { return 0.0f; }
  DILOCO_HD static void put_factor(std::byte*, float) {}
  ///@}

  /// No factor, nothing to work out per block.
  struct factor_terms {};
  /// The (empty) terms of any block.
  DILOCO_HD static factor_terms terms(float /*amax*/) { return {}; }

  /// h and dq of one element, rounded to nearest even or, stochastic, with
  /// the element's draw u in [0, 1).
  DILOCO_HD static void encode(float v, float /*amax*/, float u, code& h, float& dq) {
    h = kernels::encode_float16<bits_format>(v, stochastic ? u : -1.0f);
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
  /// The value of code h (the factor or its terms are ignored).
  DILOCO_HD static float decode(code h, float /*amax*/) { return bits_format::decode(h); }
  DILOCO_HD static float decode(code h, factor_terms) { return bits_format::decode(h); }
  ///@}

  ///@{
  /// The codes of elements [j0, j0 + group), j0 a multiple of group, written and read.
  DILOCO_HD static void put_codes(std::byte* blk, std::size_t j0, const code (&h)[group]) {
    static_assert(B % 2 == 0, "device casts need an even block size");
    unsigned char bytes[group_bytes];
    for (std::size_t i = 0; i < group; ++i) std::memcpy(bytes + 2 * i, &h[i], 2);
    kernels::store_bytes<group_bytes>(blk + 2 * j0, bytes);
  }
  DILOCO_HD static void codes(const std::byte* blk, std::size_t j0, code (&h)[group]) {
    static_assert(B % 2 == 0, "device casts need an even block size");
    unsigned char bytes[group_bytes];
    kernels::load_bytes<group_bytes>(blk + 2 * j0, bytes);
    for (std::size_t i = 0; i < group; ++i) std::memcpy(&h[i], bytes + 2 * i, 2);
  }
  ///@}
};

/// fp32 -> 16-bit float (bf16 or fp16), 2 bytes per parameter, each element
/// rounded to nearest even (error <= half an ulp of the format) or
/// stochastically. fp16 values beyond 65504 become inf, which the round's
/// finiteness checks reject; prefer bf16 (fp32's range) for pseudo-gradients.
/// Blocks of 64 elements keep the padding at a tensor's end small.
template <class Format, class Rounding, std::size_t B = 64>
struct cast_codec {
  static_assert(std::is_same_v<Format, bf16> || std::is_same_v<Format, fp16>,
                "cast: Format must be diloco::bf16 or diloco::fp16");
  /// The element-level form (the device team programs code through it): the same
  /// encode_float16 and decode per element as encode() and decode() here.
  using elements = cast_elements<Format, Rounding, B>;
  /// The bit-level conversions of the format (codec/float_formats.hpp).
  using bits_format = typename elements::bits_format;
  static constexpr std::size_t block = B;  ///< elements per block
  /// The codec's id in segment headers.
  static constexpr codec_id id = std::is_same_v<Format, bf16> ? codec_id::bf16 : codec_id::fp16;

  /// Bytes of an encoded block: 2 per element (a partial block keeps it, zero-padded).
  DILOCO_HD static constexpr std::size_t stride() { return 2 * B; }

  /// Encodes v[0, len) into out (zero padding after a partial block) and writes what decode
  /// gives into dq; `stream` and `index0 + j` seed stochastic rounding of element j.
  DILOCO_HD void encode(const float* v, std::size_t len, std::byte* out, float* dq, std::uint64_t stream,
                        std::uint64_t index0) const {
    if constexpr (std::is_same_v<Format, bf16> && !Rounding::stochastic) {
      for (std::size_t j = 0; j < len; ++j) {  // the vectorizing form of the same rounding
        const std::uint16_t h = kernels::bf16_round_nearest(v[j]);
        std::memcpy(out + 2 * j, &h, 2);
        dq[j] = bits_format::decode(h);
      }
    } else {
      for (std::size_t j = 0; j < len; ++j) {  // elements::encode, inline
        const float u = Rounding::stochastic ? kernels::random_unit(stream, index0 + j) : -1.0f;
        const std::uint16_t h = kernels::encode_float16<bits_format>(v[j], u);
        std::memcpy(out + 2 * j, &h, 2);
        dq[j] = bits_format::decode(h);
      }
    }
    if (len < B) std::memset(out + 2 * len, 0, 2 * (B - len));
  }

  /// Decodes a block into dq[0, len).
  DILOCO_HD void decode(const std::byte* in, std::size_t len, float* dq) const {
    for (std::size_t j = 0; j < len; ++j) {
      std::uint16_t h;
      std::memcpy(&h, in + 2 * j, 2);
      dq[j] = bits_format::decode(h);
    }
  }

  /// nullptr when the block's bytes are well formed (zero padding), else what is wrong.
  DILOCO_HD const char* check(const std::byte* in, std::size_t len) const {
    for (std::size_t b = 2 * len; b < stride(); ++b)
      if (in[b] != std::byte{0}) return "non-zero padding after a partial block";
    return nullptr;
  }
  /// Thread t of `threads`' share of check() (kernels::check_blocks): padding
  /// bytes 2 len + t, 2 len + t + threads, ...
  DILOCO_HD bool share_malformed(const std::byte* in, std::size_t len, std::size_t t, std::size_t threads) const {
    for (std::size_t b = 2 * len + t; b < stride(); b += threads)
      if (in[b] != std::byte{0}) return true;
    return false;
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
