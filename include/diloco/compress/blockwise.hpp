// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "diloco/codec/blockwise.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The options of a stateless codec policy (blockwise, cast).
struct codec_options {
  std::uint64_t seed = 0;  ///< stochastic rounding stream
  /// Every field by name (core/options.hpp's visit_options customisation point).
  template <class F>
  friend void visit_options(const codec_options& o, F&& f) {
    f("seed", o.seed);
  }
};

/// What a lossy compressor without state of its own declares: its codec,
/// no error feedback, rounding from the codec's policy, options that need
/// no validation. blockwise and cast derive from it and add their name.
template <class Codec, class Rounding>
struct stateless_codec_policy {
  /// The rounding seed.
  using options = codec_options;
  /// The block codec.
  using codec = Codec;
  /// Values change on the way.
  static constexpr bool lossless = false;
  /// No residual: wrap it in error_feedback.
  static constexpr bool has_error_feedback = false;
  /// Whether the rounding is stochastic.
  static constexpr bool stochastic = Rounding::stochastic;
  /// Nothing to validate.
  static void validate(const options&) {}
  /// The codec (stateless: nothing from the options).
  static codec make_codec(const options&) { return {}; }
};

namespace detail_blockwise {

/// The element formats of a block codec (codec/formats.hpp).
template <class F>
inline constexpr bool is_block_format_v =
    std::is_same_v<F, int8> || std::is_same_v<F, int4> || std::is_same_v<F, int2> ||
    std::is_same_v<F, fp8_e4m3> || std::is_same_v<F, fp8_e5m2> || std::is_same_v<F, fp4_e3m0>;

/// The format blockwise<Format> builds its codec on: Format itself, or,
/// once the static_assert has named the allowed formats, int8, so that the
/// codec's members (bits, levels, the grid) do not add errors of their own
/// after the one that says what is wrong.
template <class Format>
struct checked_format {
  static_assert(is_block_format_v<Format>,
                "diloco::compress::blockwise<Format, B>: Format must be a block element format: diloco::int8, int4, "
                "int2, fp8_e4m3, fp8_e5m2 or fp4_e3m0 (fp32 travels with compress::none, bf16 and fp16 with "
                "compress::cast<bf16> and cast<fp16>)");
  using type = std::conditional_t<is_block_format_v<Format>, Format, int8>;
};

}  // namespace detail_blockwise

/// The compressor policy: blockwise<int8, 128>, blockwise<fp8_e4m3>,
/// blockwise<int4, 64, stochastic_rounding>. Format is one of the block
/// formats (anything else stops the compiler with one message naming them).
template <class Format, std::size_t B = 128, class Rounding = round_nearest>
struct blockwise
    : stateless_codec_policy<blockwise_codec<typename detail_blockwise::checked_format<Format>::type, B, Rounding>,
                             Rounding> {
  /// The compressor's name in checkpoint headers, messages and reports.
  static constexpr const char* name = detail_blockwise::checked_format<Format>::type::blockwise_name;
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
