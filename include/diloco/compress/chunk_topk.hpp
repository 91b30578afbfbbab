// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "diloco/codec/chunk_topk.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The options of chunk_topk.
struct chunk_topk_options {
  std::uint64_t seed = 0;  ///< stochastic rounding of the values
  float decay = 1.0f;      ///< error feedback: r <- decay * (r + delta - sent), in (0, 1]
  /// Every field by name (core/options.hpp's visit_options customisation point).
  template <class F>
  friend void visit_options(const chunk_topk_options& o, F&& f) {
    f("seed", o.seed);
    f("decay", o.decay);
  }
};

/// The compressor policy: chunk_topk<> is SparseLoCo's 64 of every 4096 as
/// int2; wrap it in error_feedback (SparseLoCo always does).
template <std::size_t Chunk = 4096, std::size_t K = 64, class Values = int2, class Rounding = round_nearest>
struct chunk_topk {
  using options = chunk_topk_options;  ///< the rounding seed and the error-feedback decay
  /// The codec: chunks of Chunk, K entries, values in Values.
  using codec = chunk_topk_codec<Chunk, K, Values, Rounding>;
  /// The compressor's name in checkpoint headers, messages and reports.
  static constexpr const char* name = "chunk_topk";
  static constexpr bool lossless = false;  ///< values change on the way
  static constexpr bool has_error_feedback = false;  ///< no residual: wrap it in error_feedback
  static constexpr bool stochastic = Rounding::stochastic;  ///< whether the values' rounding is stochastic
  /// Sparse aggregation: all-gather the segments, sum in rank order
  /// (reduce/gathered.hpp) instead of reducing shards and re-encoding.
  static constexpr bool gathered = true;
  /// Throws config_error unless decay is in (0, 1].
  static void validate(const options& o) {
    if (!(o.decay > 0.0f && o.decay <= 1.0f))
      detail::raise<config_error>("chunk_topk: decay must lie in (0, 1], got ", o.decay);
  }
  /// The codec (it takes nothing from the options: the seed and decay are the reducer's).
  static codec make_codec(const options& o) {
    validate(o);
    return {};
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
