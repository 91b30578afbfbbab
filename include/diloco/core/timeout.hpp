// SPDX-License-Identifier: Apache-2.0
#pragma once

// Timeouts of the communicators. A timeout is a positive number of
// milliseconds up to one year, or `no_timeout` (milliseconds::max()): wait
// as long as it takes. Deadlines are computed here, saturating, because
// `now() + milliseconds::max()` overflows (to a deadline in the past, so a
// wait that should never end ends at once).

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "diloco/core/error.hpp"

namespace diloco {

/// Wait without a bound.
inline constexpr std::chrono::milliseconds no_timeout = std::chrono::milliseconds::max();

/// The longest finite timeout accepted: one year (365 days). Anything longer
/// is almost certainly a unit mistake; say no_timeout (or "none") instead.
inline constexpr std::chrono::milliseconds max_finite_timeout = std::chrono::hours(24 * 365);

namespace detail {

inline bool unbounded(std::chrono::milliseconds t) { return t == no_timeout; }

// "3000 ms", or "no timeout".
inline std::string describe_timeout(std::chrono::milliseconds t) {
  return unbounded(t) ? std::string("no timeout") : concat(t.count(), " ms");
}

// Throws config_error unless `t` is no_timeout or in [1 ms, one year];
// `what` names the option.
inline void check_timeout(std::chrono::milliseconds t, std::string_view what) {
  if (unbounded(t)) return;
  if (t.count() <= 0 || t > max_finite_timeout)
    raise<config_error>(what, " is ", t.count(), " ms; expected a timeout in [1, ", max_finite_timeout.count(),
                        "] ms (one year), or no timeout (std::chrono::milliseconds::max())");
}

// now + t, or the clock's largest time point when t is no_timeout or the
// sum would not fit.
template <class Clock = std::chrono::steady_clock>
typename Clock::time_point deadline_after(std::chrono::milliseconds t,
                                          typename Clock::time_point now = Clock::now()) {
  using tp = typename Clock::time_point;
  using dur = typename Clock::duration;
  if (unbounded(t) || t.count() < 0) return unbounded(t) ? tp::max() : now;
  // Room left before the clock's end, in milliseconds (rounded down).
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(tp::max() - now);
  if (t >= room) return tp::max();
  return now + std::chrono::duration_cast<dur>(t);
}

// Whether `elapsed` is past `t`, without converting t to a finer unit
// (milliseconds::max() in nanoseconds overflows).
template <class Rep, class Period>
bool exceeded(std::chrono::duration<Rep, Period> elapsed, std::chrono::milliseconds t) {
  if (unbounded(t)) return false;
  // For a whole number of milliseconds t: elapsed > t exactly when elapsed
  // rounded up to milliseconds is.
  return std::chrono::ceil<std::chrono::milliseconds>(elapsed) > t;
}

// A timeout written as text (an environment variable, a command-line
// option): "none" for no timeout, or a decimal number of milliseconds in
// [1, one year]. `what` names the source in errors.
inline std::chrono::milliseconds parse_timeout_ms(std::string_view text, std::string_view what) {
  if (text == "none") return no_timeout;
  bool ok = !text.empty() && text.size() <= 18;  // 18 digits cannot overflow
  std::int64_t value = 0;
  for (std::size_t i = 0; ok && i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') {
      ok = false;
      break;
    }
    value = value * 10 + (text[i] - '0');
  }
  if (!ok || value < 1 || value > max_finite_timeout.count())
    raise<config_error>(what, " is '", text, "'; expected a timeout in milliseconds in [1, ",
                        max_finite_timeout.count(), "] (one year), or 'none' for no timeout");
  return std::chrono::milliseconds(value);
}

}  // namespace detail
}  // namespace diloco
