// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every reducer hands the engine when a reduction completes.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>

#include "diloco/compress/round_state.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"

namespace diloco::reduce {

/// accepted/corrupt/problem, this rank's norms and encoded bytes.
using verdict = compress::exchange_result;

/// The fp32 check every rank makes of the norms all ranks sent: the round is
/// refused when any is not finite or their sum overflows.
inline void check_norms(std::span<const float> norms, verdict& out) {
  double total = 0.0;
  std::string bad;
  for (std::size_t r = 0; r < norms.size(); ++r) {
    const float v = norms[r];
    if (!std::isfinite(v)) bad += detail::concat(bad.empty() ? "" : ", ", "rank ", r, " (norm ", detail::norm_text(v), ")");
    total += v;
  }
  if (bad.empty() && !(total <= std::numeric_limits<float>::max()))
    bad = detail::concat("all ranks together (sum of norms ", total, " overflows fp32)");
  if (!bad.empty()) {
    out.accepted = false;
    out.problem = detail::concat("non-finite pseudo-gradient from ", bad);
  }
}

}  // namespace diloco::reduce
