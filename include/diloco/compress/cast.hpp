// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <type_traits>

#include "diloco/codec/cast.hpp"
#include "diloco/compress/blockwise.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The compressor policy: cast<bf16> or cast<fp16, stochastic_rounding>.
template <class Format, class Rounding = round_nearest>
struct cast : stateless_codec_policy<cast_codec<Format, Rounding>, Rounding> {
  /// The compressor's name in checkpoint headers, messages and reports.
  static constexpr const char* name = std::is_same_v<Format, bf16> ? "cast bf16" : "cast fp16";
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
