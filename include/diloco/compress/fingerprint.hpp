// SPDX-License-Identifier: Apache-2.0
#pragma once

// A compressor as checkpoint headers and the agreement across ranks name
// it: its name, and for a block codec its block size (chunk_topk: K and the
// values' format too), rounding and error feedback; adaptive<C...>: its
// rungs'. Options (low_rank's rank, adaptive's rule) are agreed as options.

#include <string>

#include "diloco/compress/adaptive.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The compressor as checkpoint headers and agreement checks name it: its name and what
/// changes its wire format (block or chunk size, k and the values' format, rounding, error
/// feedback; each rung of adaptive<C...>).
template <class Compressor>
std::string fingerprint() {
  if constexpr (Compressor::lossless || factored_compressor<Compressor>) {
    return Compressor::name;
  } else if constexpr (switching_compressor<Compressor>) {
    return []<class... C>(std::tuple<C...>*) {
      std::string out = "adaptive(";
      ((out += fingerprint<C>() + " | "), ...);
      out.resize(out.size() - 3);
      return out + ")";
    }(static_cast<typename Compressor::ladder*>(nullptr));
  } else if constexpr (requires { Compressor::codec::k; }) {
    return detail::concat(Compressor::name, ", chunk ", Compressor::codec::block, ", k ", Compressor::codec::k,
                          ", values ", Compressor::codec::values_name,
                          Compressor::stochastic ? ", stochastic rounding" : ", round to nearest",
                          Compressor::has_error_feedback ? ", error feedback" : "");
  } else {
    return detail::concat(Compressor::name, ", block ", Compressor::codec::block,
                          Compressor::stochastic ? ", stochastic rounding" : ", round to nearest",
                          Compressor::has_error_feedback ? ", error feedback" : "");
  }
}

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
