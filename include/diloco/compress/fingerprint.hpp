// SPDX-License-Identifier: Apache-2.0
#pragma once

// A compressor as checkpoint headers and the agreement across ranks name
// it. A compressor says so itself where it has a static `fingerprint()`
// (adaptive<C...>: its rungs'); otherwise its name, and for a block codec
// what changes its wire format: the codec's part (the codec's static
// `fingerprint()`, chunk_topk's ", chunk C, k K, values V"; else
// ", block B"), the rounding and error feedback. Options (low_rank's rank,
// adaptive's rule) are agreed as options. These strings are written into
// checkpoint headers: a compressor's text never changes.

#include <concepts>
#include <string>

#include "diloco/compress/codec.hpp"
#include "diloco/compress/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The compressor as checkpoint headers and agreement checks name it: its own
/// `fingerprint()`, else its name, and for a block codec the codec's part (the codec's
/// `fingerprint()`, else its block size), the rounding and error feedback.
template <class Compressor>
std::string fingerprint() {
  if constexpr (requires { { Compressor::fingerprint() } -> std::convertible_to<std::string>; }) {
    return Compressor::fingerprint();
  } else if constexpr (Compressor::lossless || !requires { typename Compressor::codec; }) {
    return Compressor::name;
  } else {
    using codec = typename Compressor::codec;
    std::string part;
    if constexpr (requires { { codec::fingerprint() } -> std::convertible_to<std::string>; })
      part = codec::fingerprint();
    else
      part = detail::concat(", block ", codec::block);
    return detail::concat(Compressor::name, part, Compressor::stochastic ? ", stochastic rounding" : ", round to nearest",
                          Compressor::has_error_feedback ? ", error feedback" : "");
  }
}

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
