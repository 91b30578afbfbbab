#pragma once

// What every reducer hands the engine when a reduction completes, and the
// request type a reducer keeps while one is in flight.

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "diloco/compress/compressed_mean.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"

namespace diloco::reduce {

// accepted/corrupt/problem, this rank's norms and encoded bytes.
using verdict = compress::exchange_result;

// A pending non-blocking collective of communicator C over host memory
// (none for a communicator with blocking operations only).
template <class Comm>
struct pending {
  void wait() {}
  bool test() { return true; }
};
template <class Comm>
  requires async_host_communicator<Comm>
struct pending<Comm> {
  std::optional<typename Comm::request> req;
  void wait() {
    if (req) {
      auto r = std::move(*req);
      req.reset();
      r.wait();
    }
  }
  bool test() {
    if (!req) return true;
    if (!req->test()) return false;
    wait();
    return true;
  }
};

// The fp32 check every rank makes of the norms all ranks sent: the round is
// refused when any is not finite or their sum overflows.
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
