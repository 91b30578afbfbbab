// SPDX-License-Identifier: Apache-2.0
#pragma once

// The lossy compressor policies' concepts (a policy that travels as block
// codec segments, or has a reducer of its own); the block codec itself is
// the codec layer's (codec/block_codec.hpp).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "diloco/codec/block_codec.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// A lossy compressor policy: options, validation, its block codec type
/// `codec` and the codec built from the options, whether its rounding is
/// stochastic (the wire header says so), and whether it keeps an error-feedback
/// residual (error_feedback<C> sets `has_error_feedback`). This is everything
/// the compressed and gathered means use of a compressor.
template <class C>
concept lossy_compressor = requires(const typename C::options& o) {
  requires !C::lossless;
  typename C::codec;
  requires block_codec<typename C::codec>;
  { C::has_error_feedback } -> std::convertible_to<bool>;
  { C::stochastic } -> std::convertible_to<bool>;
  { C::validate(o) };
  { C::make_codec(o) } -> std::convertible_to<typename C::codec>;
};

/// Whether a compressor says it has a reducer of its own (`factored` or
/// `switching`) rather than travelling as block codec segments; one that names
/// its reducer (compress/concepts.hpp's names_reducer) has one too
/// (own_reducer_v there).
template <class C>
constexpr bool declares_own_reducer_v = [] {
  if constexpr (requires { C::factored; })
    if (C::factored) return true;
  if constexpr (requires { C::switching; })
    if (C::switching) return true;
  return false;
}();

namespace stand_in {
// A type that satisfies lossy_compressor (declared only, for the concepts
// unevaluated checks); codec/block_codec.hpp has its block codec.

/// A lossy compressor in name only (lossy_compressor's requirements, declared).
struct any_lossy_compressor {
  struct options {};
  ///@{
  /// lossy_compressor's members, declared only.
  using codec = any_block_codec;
  static constexpr bool lossless = false;
  static constexpr bool has_error_feedback = false;
  static constexpr bool stochastic = false;
  static void validate(const options&);
  static codec make_codec(const options&);
  ///@}
};
}  // namespace stand_in

/// A compressor with a reducer of its own instead of a block codec
/// (low_rank: factors exchanged over several collectives).
template <class C>
concept factored_compressor = requires(const typename C::options& o) {
  requires !C::lossless;
  requires C::factored;
  { C::validate(o) };
};

/// A compressor that runs one of several compressors per round, with a
/// reducer of its own over theirs (adaptive<C...>).
template <class C>
concept switching_compressor = requires(const typename C::options& o) {
  requires !C::lossless;
  requires C::switching;
  { C::validate(o) };
};

/// Whether a compressor's reducer all-gathers its segments (sparse
/// aggregation) rather than reducing shards.
template <class C>
constexpr bool gathered_v = [] {
  if constexpr (requires { C::gathered; })
    return C::gathered;
  else
    return false;
}();

/// The error-feedback decay of a compressor's options (1 when it has none).
template <class Options>
float feedback_decay(const Options& o) {
  if constexpr (requires { o.decay; })
    return o.decay;
  else
    return (void)o, 1.0f;
}

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
