// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/compress/codec.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// Error feedback around any lossy compressor: each worker keeps the residual
///   e <- beta * ((delta + e) - decode(encode(delta + e)))
/// with beta = options.decay where the compressor's options have one
/// (chunk_topk; SparseLoCo uses 0.95), else 1
/// and adds it to the next round's pseudo-gradient, so what compression drops
/// is delayed, not lost (beta = 1): over R rounds the decoded transmissions sum to the
/// sum of the true deltas minus the final residual. The residual is part of
/// the algorithm's state (4 bytes per parameter, twice: a round writes the
/// new residual beside the old one and keeps it only if the round is
/// applied, so a rejected round leaves the state as it was).
template <class C>
struct error_feedback {
  static_assert(!C::lossless, "error_feedback<C>: C must be a lossy compressor; a lossless one has no error to feed back");
  static_assert(!C::has_error_feedback, "error_feedback<C>: C already has error feedback");
  using inner = C;  ///< the compressor it wraps
  using options = typename C::options;  ///< C's options
  using codec = typename C::codec;  ///< C's codec
  static constexpr const char* name = C::name;  ///< C's name (the fingerprint adds "error feedback")
  static constexpr bool lossless = false;  ///< values change on the way
  static constexpr bool has_error_feedback = true;  ///< keeps a residual (the state above)
  static constexpr bool stochastic = C::stochastic;  ///< as C's rounding
  static constexpr bool gathered = gathered_v<C>;  ///< as C's reducer: all-gather (sparse) or shard reduction
  /// Validates C's options.
  static void validate(const options& o) { C::validate(o); }
  /// C's codec.
  static codec make_codec(const options& o) { return C::make_codec(o); }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
