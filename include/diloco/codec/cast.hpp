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
#include "diloco/core/random.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// fp32 -> 16-bit float (bf16 or fp16), 2 bytes per parameter, each element
/// rounded to nearest even (error <= half an ulp of the format) or
/// stochastically. fp16 values beyond 65504 become inf, which the round's
/// finiteness checks reject; prefer bf16 (fp32's range) for pseudo-gradients.
/// Blocks of 64 elements keep the padding at a tensor's end small.
template <class Format, class Rounding, std::size_t B = 64>
struct cast_codec {
  static_assert(std::is_same_v<Format, bf16> || std::is_same_v<Format, fp16>,
                "cast: Format must be diloco::bf16 or diloco::fp16");
  /// The bit-level conversions of the format (codec/float_formats.hpp).
  using bits_format = std::conditional_t<std::is_same_v<Format, bf16>, kernels::bf16_format, kernels::fp16_format>;
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
      for (std::size_t j = 0; j < len; ++j) {
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
