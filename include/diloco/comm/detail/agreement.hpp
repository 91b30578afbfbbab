// SPDX-License-Identifier: Apache-2.0
#pragma once

// The check, shared by every communicator, that all ranks call a collective
// with matching arguments: each rank describes its call in one fixed-size
// record, the communicator brings every rank's record to every rank (threads
// through shared memory; Gloo, MPI and NCCL with one small all-gather of
// their own), and every rank judges the same records with disagreement().
// So all ranks reach the same verdict before any data moves, and none is
// left inside a collective the others never enter (which would hang, or
// pair mismatched transfers and corrupt memory).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "diloco/comm/detail/arguments.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm::detail {

/// One rank's call, as the ranks exchange it (32 bytes, the same layout on
/// every rank of a job).
struct call_record {
  std::uint32_t op = 0;        ///< collective
  std::uint32_t flags = 0;     ///< rejected | nonblocking | timed
  std::uint64_t count = 0;     ///< elements (counts_elements) or bytes; an exchange's per-rank send size
  std::int64_t arg = 0;        ///< a broadcast's root, an all-reduce's reduce_op, else 0
  std::uint64_t sequence = 0;  ///< collectives this rank has entered, this one included; 0 where not counted

  /// This rank's arguments failed its own checks (arguments.hpp).
  static constexpr std::uint32_t rejected = 1;
  /// MPI never pairs a blocking collective with a non-blocking one, nor
  /// (every call of a timed rank being non-blocking) a rank with a timeout
  /// with one without: such calls count as different collectives. Only
  /// comm::mpi sets these two.
  static constexpr std::uint32_t nonblocking = 2;
  static constexpr std::uint32_t timed = 4;
};
static_assert(sizeof(call_record) == 32 && std::is_trivially_copyable_v<call_record>);

inline call_record record_of(collective c, std::uint64_t count, std::int64_t arg = 0) {
  return {static_cast<std::uint32_t>(c), 0, count, arg, 0};
}

/// The collective and its form in one number, ordered by collective.
inline std::uint64_t form(const call_record& r) {
  return 4 * std::uint64_t{r.op} + ((r.flags & call_record::timed) ? 2 : 0) +
         ((r.flags & call_record::nonblocking) ? 1 : 0);
}

inline std::string form_text(std::uint64_t f, bool name_timeout) {
  return diloco::detail::concat(f % 2 ? "non-blocking " : "", name(static_cast<collective>(f / 4)),
                                !name_timeout ? "" : (f / 2) % 2 ? " with a timeout" : " without a timeout");
}

/// No details of the other ranks' problems (all but comm::threads).
struct no_detail {
  std::string_view operator()(int) const { return {}; }
};

/// The comm_error every rank raises for these records (one per rank, in
/// rank order), or "" when they agree. Whether it is empty does not depend
/// on `site.rank`, so all ranks raise or none does. `detail(k)`: what rank
/// k found wrong with its own arguments, where the transport can tell.
template <class Detail = no_detail>
std::string disagreement(std::span<const call_record> all, const call_site& site, Detail&& detail = {}) {
  using diloco::detail::concat;
  const call_record& mine = all[static_cast<std::size_t>(site.rank)];
  const auto op = static_cast<collective>(mine.op);
  const std::string prefix = call_prefix(site, op);
  const int m = static_cast<int>(all.size());
  auto at = [&](int k) -> const call_record& { return all[static_cast<std::size_t>(k)]; };

  for (int k = 0; k < m; ++k)
    if (at(k).flags & call_record::rejected) {
      const std::string_view why = detail(k);
      return prefix + concat("rank ", k, " passed invalid arguments", why.empty() ? "" : " (", why,
                             why.empty() ? "" : ")", ": rank ", k, " rejected its own arguments to ",
                             name(static_cast<collective>(at(k).op)),
                             " (it raised config_error); no rank ran the operation");
    }

  auto lowest = [&](auto field) {
    auto v = field(at(0));
    for (int k = 1; k < m; ++k) v = std::min(v, field(at(k)));
    return v;
  };
  auto highest = [&](auto field) {
    auto v = field(at(0));
    for (int k = 1; k < m; ++k) v = std::max(v, field(at(k)));
    return v;
  };
  auto first_other = [&](auto field) {
    int k = 0;
    while (k < m && field(at(k)) == field(mine)) ++k;
    return k;
  };

  const auto form_of = [](const call_record& r) { return form(r); };
  if (const auto lo = lowest(form_of), hi = highest(form_of); lo != hi) {
    const bool timeouts_differ = (lo / 2) % 2 != (hi / 2) % 2;
    return prefix + concat("ranks called different collectives (", form_text(lo, timeouts_differ), " and ",
                           form_text(hi, timeouts_differ), "): rank ", first_other(form_of), " entered ",
                           form_text(form(at(first_other(form_of))), timeouts_differ),
                           " instead; every rank must call the same collective in the same order",
                           timeouts_differ ? " and set comm::mpi's timeout on every rank or on none" : "");
  }
  const auto count_of = [](const call_record& r) { return r.count; };
  if (const auto lo = lowest(count_of), hi = highest(count_of); lo != hi)
    return prefix + concat("buffer sizes differ across ranks (smallest ", lo, ", largest ", hi, ", this rank ",
                           mine.count, counts_elements(op) ? " elements" : " bytes",
                           "); every rank must pass the same size; no rank ran the operation");
  const auto arg_of = [](const call_record& r) { return r.arg; };
  if (const auto lo = lowest(arg_of), hi = highest(arg_of); lo != hi) {
    if (op == collective::all_reduce)
      return prefix + concat("ranks disagree on the reduction (both sum and mean were asked for, this rank asked for ",
                             to_string(static_cast<reduce_op>(mine.arg)), "); no rank ran the operation");
    return prefix + concat("ranks disagree on the root (smallest ", lo, ", largest ", hi, ", this rank ", mine.arg,
                           "); no rank ran the operation");
  }
  const auto sequence_of = [](const call_record& r) { return r.sequence; };
  if (const int k = first_other(sequence_of); k < m)
    return prefix + concat("ranks are out of step: this is collective #", mine.sequence, " on rank ", site.rank,
                           " but #", at(k).sequence, " on rank ", k,
                           "; every rank must call the same collectives in the same order");
  return {};
}

struct no_settle {
  void operator()() const {}
};

/// Runs the check for this rank's call: `exchange(mine)` returns every
/// rank's record in rank order (the transport's part); `problem` is what is
/// wrong with this rank's own arguments ("" when nothing is). Throws on
/// every rank when the calls differ or any rank's arguments were invalid:
/// config_error on a rank with a problem, comm_error on the others. Nothing
/// has moved then, so the communicator stays usable. `settle()` runs before
/// a throw (comm::threads meets once more there, so that no rank overwrites
/// its record while another still reads it).
template <class Exchange, class Settle = no_settle, class Detail = no_detail>
void agree(const call_site& site, call_record mine, const std::string& problem, Exchange&& exchange,
           Settle&& settle = {}, Detail&& detail = {}) {
  if (!problem.empty()) mine.flags |= call_record::rejected;
  const std::span<const call_record> all = exchange(mine);
  const std::string verdict = disagreement(all, site, detail);
  if (verdict.empty()) return;
  settle();
  if (!problem.empty()) diloco::detail::raise<config_error>(problem);
  diloco::detail::raise<comm_error>(verdict);
}

}  // namespace diloco::comm::detail
