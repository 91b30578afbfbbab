// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco {

// Number formats a pseudo-gradient can travel in, named by what they are.
// The formats of block-wise codecs carry values relative to a per-block
// scale: `levels` is the format's largest magnitude, which the block's
// largest magnitude maps to. codec/grids.hpp rounds onto each format's
// values; docs/algorithms.md tables them.
//
// Integer formats are symmetric: `levels` is the largest |q|.

/// Eight-bit integers: q in [-127, 127] times amax / 127.
struct int8 {
  ///@{
  /// The format's traits: its name, the name of blockwise<Format>, bits per value, and the
  /// largest magnitude (levels).
  static constexpr const char* name = "int8";
  static constexpr const char* blockwise_name = "blockwise int8";
  static constexpr int bits = 8;
  static constexpr float levels = 127.0f;
  ///@}
};
/// Four-bit integers: q in [-7, 7] times amax / 7.
struct int4 {
  ///@{
  /// The format's traits: its name, the name of blockwise<Format>, bits per value, and the
  /// largest magnitude (levels).
  static constexpr const char* name = "int4";
  static constexpr const char* blockwise_name = "blockwise int4";
  static constexpr int bits = 4;
  static constexpr float levels = 7.0f;
  ///@}
};
/// Two bits, four levels: {-3, -1, +1, +3} * amax / 3, evenly spaced and
/// symmetric, with no zero (a zero rounds to +amax/3; an all-zero block
/// decodes to zeros through its zero scale). Codes 0..3 in that order.
struct int2 {
  ///@{
  /// The format's traits: its name, the name of blockwise<Format>, bits per value, and the
  /// largest magnitude (levels).
  static constexpr const char* name = "int2";
  static constexpr const char* blockwise_name = "blockwise int2";
  static constexpr int bits = 2;
  static constexpr float levels = 3.0f;
  ///@}
};
/// Small floats: sign, exponent (bias `bias`), mantissa; exponent field 0 is
/// zero and the subnormals. None has infinities; values beyond the largest
/// saturate to it.
/// OCP 8-bit E4M3FN: max 448, subnormals down to 2^-9; S.1111.111 is NaN
/// (never written, refused on receipt).
struct fp8_e4m3 {
  ///@{
  /// The format's traits: its name, the name of blockwise<Format>, bits per value, exponent
  /// and mantissa bits, the exponent bias, the largest magnitude's code, and the largest
  /// magnitude (levels).
  static constexpr const char* name = "fp8_e4m3";
  static constexpr const char* blockwise_name = "blockwise fp8_e4m3";
  static constexpr int bits = 8;
  static constexpr int exponent_bits = 4;
  static constexpr int mantissa_bits = 3;
  static constexpr int bias = 7;
  static constexpr unsigned max_code = 0x7e;  ///< magnitude code of the largest value
  static constexpr float levels = 448.0f;
  ///@}
};
/// OCP 8-bit E5M2: max 57344, subnormals down to 2^-16; S.11111.00 (inf) and
/// S.11111.xx (NaN) are never written and refused on receipt.
struct fp8_e5m2 {
  ///@{
  /// The format's traits: its name, the name of blockwise<Format>, bits per value, exponent
  /// and mantissa bits, the exponent bias, the largest magnitude's code, and the largest
  /// magnitude (levels).
  static constexpr const char* name = "fp8_e5m2";
  static constexpr const char* blockwise_name = "blockwise fp8_e5m2";
  static constexpr int bits = 8;
  static constexpr int exponent_bits = 5;
  static constexpr int mantissa_bits = 2;
  static constexpr int bias = 15;
  static constexpr unsigned max_code = 0x7b;
  static constexpr float levels = 57344.0f;
  ///@}
};
/// 4-bit E3M0 (Streaming DiLoCo's outer-gradient format): sign and 3
/// exponent bits, bias 3, no mantissa: magnitudes 0, 0.25, 0.5, 1, 2, 4, 8,
/// 16 for exponent fields 0..7 (field 0 is zero: no subnormals without a
/// mantissa). Every code is a value.
struct fp4_e3m0 {
  ///@{
  /// The format's traits: its name, the name of blockwise<Format>, bits per value, exponent
  /// and mantissa bits, the exponent bias, the largest magnitude's code, and the largest
  /// magnitude (levels).
  static constexpr const char* name = "fp4_e3m0";
  static constexpr const char* blockwise_name = "blockwise fp4_e3m0";
  static constexpr int bits = 4;
  static constexpr int exponent_bits = 3;
  static constexpr int mantissa_bits = 0;
  static constexpr int bias = 3;
  static constexpr unsigned max_code = 0x7;
  static constexpr float levels = 16.0f;
  ///@}
};

/// bfloat16, cast<bf16>'s format: the top 16 bits of an fp32, with fp32's range.
struct bf16 {
  static constexpr const char* name = "bf16";  ///< the format's name
};
/// IEEE binary16, cast<fp16>'s format: 3 more mantissa bits than bf16, a range to 65504.
struct fp16 {
  static constexpr const char* name = "fp16";  ///< the format's name
};

namespace compress {

// Rounding policies for the lossy codecs.

/// Deterministic rounding: to the nearest value of the format.
struct round_nearest {
  ///@{
  /// Whether it is stochastic, and its name in compressor names.
  static constexpr bool stochastic = false;
  static constexpr const char* name = "nearest";
  ///@}
};
/// Unbiased stochastic rounding from a counter-based hash of (options.seed,
/// round, rank, element): reproducible, and the same on any thread count.
struct stochastic_rounding {
  ///@{
  /// Whether it is stochastic, and its name in compressor names.
  static constexpr bool stochastic = true;
  static constexpr const char* name = "stochastic";
  ///@}
};

/// Codec ids on the wire (the segment header's byte 6). The values below are
/// written into segments and never change. A codec defined outside the
/// library declares its own id as `static constexpr codec_id id =
/// static_cast<codec_id>(0x80 + n)`, from user_first up: the library never
/// takes an id at or above user_first, and a receiver accepts only the id of
/// the codec it was built with (wire::read_header), so two codecs that share
/// an id are told apart by nothing but their block size and payload length.
enum class codec_id : std::uint8_t {
  none = 0,
  bf16 = 1,
  fp16 = 2,
  int8 = 3,
  int4 = 4,
  topk = 5,
  fp8_e4m3 = 6,
  fp8_e5m2 = 7,
  fp4_e3m0 = 8,
  int2 = 9,
  low_rank = 10,
  /// chunk_topk: 0x40 + the id of the format its values travel in.
  chunk_topk = 0x40,
  /// The first id left to codecs defined outside the library (0x80 to 0xff).
  user_first = 0x80,
};

/// The id of a block-wise format.
template <class Format>
constexpr codec_id format_id() {
  if constexpr (Format::bits == 8 && requires { Format::mantissa_bits; })
    return Format::exponent_bits == 4 ? codec_id::fp8_e4m3 : codec_id::fp8_e5m2;
  else if constexpr (requires { Format::mantissa_bits; })
    return codec_id::fp4_e3m0;
  else if constexpr (Format::bits == 8)
    return codec_id::int8;
  else if constexpr (Format::bits == 4)
    return codec_id::int4;
  else
    return codec_id::int2;
}

}  // namespace compress
}  // namespace diloco

DILOCO_EXACT_FP_END
