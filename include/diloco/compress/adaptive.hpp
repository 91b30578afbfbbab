// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "diloco/compress/codec.hpp"
#include "diloco/compress/fingerprint.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/options.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::reduce {
template <class Compressor, class Comm, class Space, class Exec>
class adaptive;
}  // namespace diloco::reduce

namespace diloco::compress {

/// The rule's numbers (agreed across ranks like every option).
struct adaptive_settings {
  ///@{
  /// The link-time budget of a round in seconds; 0: budget_share of the
  /// agreed compute time between the fragment's rounds (the inner phase), so
  /// the exchange would hide behind compute.
  double budget_seconds = 0.0;
  double budget_share = 1.0;
  ///@}
  /// Bound on the relative compression error ||v - decode(encode(v))|| / ||v||
  /// (the mean over the ranks) of a rung.
  double error_bound = 0.5;
  /// Rounds whose seconds per link byte are averaged for the prediction.
  std::uint32_t window = 3;
  /// A rung passed over for its error is tried again after this many rounds
  /// on other rungs (its error is measured again then).
  std::uint32_t retry_after = 8;
  /// The rung of the first round (before anything is measured).
  std::uint32_t start = 0;
  /// Every field by name (core/options.hpp's visit_options customisation point).
  template <class F>
  friend void visit_options(const adaptive_settings& o, F&& f) {
    f("budget_seconds", o.budget_seconds);
    f("budget_share", o.budget_share);
    f("error_bound", o.error_bound);
    f("window", o.window);
    f("retry_after", o.retry_after);
    f("start", o.start);
  }
};

/// Why a rung was chosen.
enum class adaptive_reason : std::uint8_t {
  start,          ///< nothing measured yet: the configured start rung
  within_budget,  ///< the most accurate rung that fits the budget within the error bound
  over_budget,    ///< no rung fits the budget: the most compressed one (within the error bound)
  error_bound,    ///< the rungs that fit the budget exceed the error bound: the most compressed one within it
                  ///< (or the most accurate when every rung exceeds it)
};
/// The reason's name in stats ("start", "within budget", ...).
inline const char* to_string(adaptive_reason r) {
  switch (r) {
    case adaptive_reason::start: return "start";
    case adaptive_reason::within_budget: return "within budget";
    case adaptive_reason::over_budget: return "over budget";
    case adaptive_reason::error_bound: return "error bound";
  }
  return "?";
}

/// What the ranks remember between rounds: identical on every rank, and
/// visited state (checkpoints and joiners carry it), hence every number is
/// kept as a 64-bit word (doubles as their bits).
struct adaptive_memory {
  std::uint64_t active = 0;                      ///< the rung of the next round
  std::uint64_t reason = 0;                      ///< adaptive_reason of that choice
  std::vector<std::uint64_t> error;              ///< per rung: last agreed relative error (bits; NaN: never measured)
  std::vector<std::uint64_t> age;                ///< per rung: rounds since it was last used
  std::vector<std::uint64_t> seconds_per_byte;   ///< ring of the last `window` agreed link seconds per byte (bits)
  std::uint64_t samples = 0;                     ///< samples written to the ring so far
  std::uint64_t compute_seconds = 0;             ///< the last agreed compute time between rounds (bits; 0: unknown)

  ///@{
  /// A double stored as its bits (the memory is integer state, checkpointed as such), and back.
  static double real(std::uint64_t bits) { return std::bit_cast<double>(bits); }
  static std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }
  ///@}

  /// The memory before the first round: rung `start`, nothing measured.
  void reset(std::size_t rungs, const adaptive_settings& s) {
    active = s.start;
    reason = static_cast<std::uint64_t>(adaptive_reason::start);
    error.assign(rungs, bits(std::numeric_limits<double>::quiet_NaN()));
    age.assign(rungs, 0);
    seconds_per_byte.assign(std::max<std::uint32_t>(s.window, 1), bits(0.0));
    samples = 0;
    compute_seconds = bits(0.0);
  }
  /// Why the active rung was chosen.
  adaptive_reason why() const { return static_cast<adaptive_reason>(reason); }
  /// Rung j's last agreed relative error (NaN: never measured).
  double error_of(std::size_t j) const { return real(error[j]); }
  /// The mean link seconds per byte over the samples in the ring (0 before the first).
  double mean_seconds_per_byte() const {
    const std::size_t n = std::min<std::uint64_t>(samples, seconds_per_byte.size());
    if (n == 0) return 0.0;
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += real(seconds_per_byte[i]);
    return s / static_cast<double>(n);
  }
  /// The link-time budget the rule compares with.
  double budget(const adaptive_settings& s) const {
    return s.budget_seconds > 0.0 ? s.budget_seconds : s.budget_share * real(compute_seconds);
  }
};

/// One round's agreed measurements (means over the ranks).
struct adaptive_measurement {
  double link_seconds = 0.0;     ///< begin of the exchange to its completion
  double relative_error = 0.0;   ///< of the rung used
  double compute_seconds = 0.0;  ///< since the fragment's previous round, outside it (0: first round)
};

/// The rule: records round r's measurements of rung `used` (which moved
/// link_bytes[used] bytes per rank) and picks the next round's rung.
/// link_bytes[j]: the bytes rung j's collectives carry per rank and round.
inline void adaptive_rule(adaptive_memory& m, const adaptive_settings& s, std::span<const std::size_t> link_bytes,
                          std::size_t used, const adaptive_measurement& x) {
  const std::size_t n = link_bytes.size();
  for (std::size_t j = 0; j < n; ++j) ++m.age[j];
  m.age[used] = 0;
  m.error[used] = adaptive_memory::bits(x.relative_error);
  if (link_bytes[used] > 0) {
    m.seconds_per_byte[m.samples % m.seconds_per_byte.size()] =
        adaptive_memory::bits(x.link_seconds / static_cast<double>(link_bytes[used]));
    ++m.samples;
  }
  if (x.compute_seconds > 0.0) m.compute_seconds = adaptive_memory::bits(x.compute_seconds);
  const double budget = m.budget(s);
  const double spb = m.mean_seconds_per_byte();
  // No budget yet (fixed budget 0 and no compute time measured) or no
  // bandwidth measured (a world of one moves no bytes): every rung fits.
  const auto fits = [&](std::size_t j) {
    return budget <= 0.0 || spb * static_cast<double>(link_bytes[j]) <= budget;
  };
  const auto within = [&](std::size_t j) {
    return !(m.error_of(j) > s.error_bound) || m.age[j] >= s.retry_after;  // NaN: never measured
  };
  for (std::size_t j = 0; j < n; ++j)
    if (fits(j) && within(j)) {
      m.active = j;
      m.reason = static_cast<std::uint64_t>(adaptive_reason::within_budget);
      return;
    }
  bool any_fits = false;
  for (std::size_t j = 0; j < n; ++j) any_fits = any_fits || fits(j);
  for (std::size_t j = n; j-- > 0;)
    if (within(j)) {
      m.active = j;
      m.reason = static_cast<std::uint64_t>(any_fits ? adaptive_reason::error_bound : adaptive_reason::over_budget);
      return;
    }
  m.active = 0;
  m.reason = static_cast<std::uint64_t>(adaptive_reason::error_bound);
}

/// The first of a pack of types.
template <class First, class... Rest>
struct adaptive_first {
  using type = First;  ///< First
};

/// The adaptive compressor (DiLoCoX, Qi et al. 2025, arXiv 2506.21263, adapts
/// the low-rank rank and the quantisation during training; the rule here is
/// ours, docs/algorithms.md section 7 says so): adaptive<C0, C1, ...> holds a
/// ladder of lossy compressors, listed from the most accurate (most bytes) to
/// the most compressed, and runs one of them per round (per fragment under
/// sync::streaming). After every applied round the ranks agree, with one
/// all-reduce of three numbers, on the round's link time, the relative
/// compression error ||v - decode(encode(v))|| / ||v|| of the codec used, and
/// the compute time since the fragment's previous round (each the mean over
/// the ranks), and every rank applies the same rule (adaptive_rule) to
/// the same numbers, so they all pick the same codec for the next round:
///
///   the most accurate codec whose predicted link time fits the budget and
///   whose last measured error is within the bound; when none does, the
///   error bound wins over the budget.
///
/// The rung (one index) is the single setting that covers bits and rank:
/// adaptive<error_feedback<blockwise<int8>>, error_feedback<blockwise<int4>>,
/// low_rank> with options {rank = 8} moves between 8-bit, 4-bit and rank-8.
/// All rungs have error feedback or none do; on a switch the residual moves
/// to the new rung (added to it, zeroed in the old one), so nothing is lost.
///
/// Options: each rung's options (in ladder order) and the rule's.
template <class... C>
struct adaptive {
  static_assert(sizeof...(C) >= 2, "adaptive<C...>: give at least two compressors, most accurate first");
  static_assert((!C::lossless && ...),
                "adaptive<C...>: every rung must be a lossy compressor (for full precision use cast<bf16> or "
                "blockwise<int8> as the top rung)");
  static_assert(((C::has_error_feedback == adaptive_first<C...>::type::has_error_feedback) && ...),
                "adaptive<C...>: either every rung has error feedback or none has (the residual moves between rungs)");
  static constexpr std::size_t rungs = sizeof...(C);  ///< the number of compressors in the ladder
  using ladder = std::tuple<C...>;  ///< the compressors, most accurate first
  /// The options of every rung (in ladder order) and the rule's.
  struct options {
    std::tuple<typename C::options...> codecs{};  ///< each rung's options, in ladder order
    adaptive_settings rule{};  ///< the rule's numbers
    /// Every field by name: the rungs' as `rung<j>.<name>`, the rule's as `rule.<name>`.
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      visit_rungs(o, f, std::index_sequence_for<C...>{});
      visit_options(o.rule, [&](std::string_view field, const auto& value) { f(detail::concat("rule.", field), value); });
    }

   private:
    template <class F, std::size_t... I>
    static void visit_rungs(const options& o, F& f, std::index_sequence<I...>) {
      (visit_rung<I>(o, f), ...);
    }
    template <std::size_t I, class F>
    static void visit_rung(const options& o, F& f) {
      visit_policy_options(std::get<I>(o.codecs),
                           [&](std::string_view field, const auto& value) { f(detail::concat("rung", I, ".", field), value); });
    }
  };
  /// The compressor's name in checkpoint headers, messages and reports.
  static constexpr const char* name = "adaptive";
  static constexpr bool lossless = false;  ///< values change on the way
  /// The rungs' error feedback (all have it or none does).
  static constexpr bool has_error_feedback = adaptive_first<C...>::type::has_error_feedback;
  static constexpr bool switching = true;  ///< its own reducer over the rungs' reducers
  /// Its reducer: reduce/adaptive.hpp's switch over the rungs' own reducers
  /// (declared here, defined there; reduce/select.hpp includes it).
  template <class Comm, class Space, class Exec>
  using reducer = reduce::adaptive<adaptive, Comm, Space, Exec>;
  /// Its fingerprint: "adaptive(" then each rung's, separated by " | ", then
  /// ")" (compress/fingerprint.hpp).
  static std::string fingerprint() {
    std::string out = "adaptive(";
    ((out += compress::fingerprint<C>() + " | "), ...);
    out.resize(out.size() - 3);
    return out + ")";
  }
  static constexpr const char* rung_names[] = {C::name...};  ///< the rungs' names, in ladder order

  /// Validates every rung's options and the rule's numbers (config_error naming the first out of
  /// range).
  static void validate(const options& o) {
    validate_rungs(o, std::index_sequence_for<C...>{});
    const adaptive_settings& s = o.rule;
    if (!(s.budget_seconds >= 0.0) || !std::isfinite(s.budget_seconds))
      detail::raise<config_error>("adaptive: rule.budget_seconds must be finite and >= 0 (0: the inner phase), got ",
                                  s.budget_seconds);
    if (!(s.budget_share > 0.0) || !std::isfinite(s.budget_share))
      detail::raise<config_error>("adaptive: rule.budget_share must be finite and > 0, got ", s.budget_share);
    if (!(s.error_bound > 0.0))
      detail::raise<config_error>("adaptive: rule.error_bound must be > 0 (a relative error), got ", s.error_bound);
    if (s.window < 1) detail::raise<config_error>("adaptive: rule.window must be >= 1 round, got ", s.window);
    if (s.retry_after < 1) detail::raise<config_error>("adaptive: rule.retry_after must be >= 1 round, got ", s.retry_after);
    if (s.start >= rungs)
      detail::raise<config_error>("adaptive: rule.start must name a rung in [0, ", rungs - 1, "], got ", s.start);
  }

 private:
  template <std::size_t... I>
  static void validate_rungs(const options& o, std::index_sequence<I...>) {
    (std::tuple_element_t<I, ladder>::validate(std::get<I>(o.codecs)), ...);
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
