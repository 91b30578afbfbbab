// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::event: what an algorithm reports to the user's hook
// (algorithm_options::on_event) as it trains. One struct for every kind,
// the fields each kind fills listed by kind; a hook switches on `kind`.
// Events are built only when a hook is set: an unset hook costs one test of
// an empty std::function per event point.
//
// The rule for a hook that throws: the algorithm does not stop half way.
// The exception is caught, the call that fired the event (step(),
// outer_round(), finish(), leave(), the constructor) completes its work,
// collectives included, with the state exactly as if the hook had returned,
// and the first such exception is then rethrown from that call. Events later
// in the same call are still delivered. If the call itself raises (a
// rejected round's numeric_error, a comm_error), that exception is the one
// thrown and the hook's is dropped. The instance stays usable: training
// may go on after catching it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "diloco/core/stats.hpp"

namespace diloco {

/// What an event reports (the fields each kind fills are listed by field).
enum class event_kind : std::uint8_t {
  round,       ///< a reduction was applied (an outer step on theta_global)
  rejected,    ///< a reduction was refused (non-finite pseudo-gradient, corrupt bytes); the call raises
  aborted,     ///< reductions in flight were dropped because a collective failed (elastic groups)
  membership,  ///< the group re-formed (a leave, a join, a recovery from a dead peer), or this worker left
  warning,     ///< a setting that may make training fail, used as set (sync::eager's outer lr above its bound)
};

/// The kind's name ("round", "rejected", ...), as event_json_line writes it.
inline const char* to_string(event_kind k) {
  switch (k) {
    case event_kind::round: return "round";
    case event_kind::rejected: return "rejected";
    case event_kind::aborted: return "aborted";
    case event_kind::membership: return "membership";
    case event_kind::warning: return "warning";
  }
  return "unknown";
}

/// One report to the user's hook (algorithm_options::on_event): a round applied or rejected,
/// reductions aborted, the group re-formed, or a risky setting used as set. One struct for
/// every kind; a hook switches on `kind`; each field says which kinds fill it.
struct event {
  event_kind kind = event_kind::round;  ///< what happened
  ///@{
  /// Every kind: this worker's rank and the group's size (after a membership
  /// change, the new ones; -1 and 0 once this worker has left), and the inner
  /// steps it has taken.
  int rank = 0;
  int world = 0;
  std::uint64_t inner_step = 0;
  ///@}

  ///@{
  /// round, rejected: `round` is stats().rounds once this reduction is
  /// applied (1, 2, ... over the run; a rejected one would have been that
  /// number); `fragment` the schedule's fragment (0 for whole-model
  /// schedules) and `fragment_round` its own outer step number. aborted:
  /// `round` is the round that was in progress.
  std::uint64_t round = 0;
  std::size_t fragment = 0;
  std::uint64_t fragment_round = 0;
  ///@}
  ///@{
  /// round, rejected: this reduction, as stats() accounts it.
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  ///@}
  double pseudo_gradient_norm = 0.0;    ///< this worker's ||pseudo-gradient||
  double compression_error_norm = 0.0;  ///< lossy compressors: ||v - decode(encode(v))||; 0 otherwise
  double blocked_seconds = 0.0;         ///< this worker's time on it outside inner steps
  double hidden_seconds = 0.0;          ///< time it was in flight while inner steps ran
  /// round, compress::adaptive only: the rung used and the one chosen next.
  std::optional<compression_choice> compression;

  ///@{
  /// rejected: why (the message the call raises), and whether it was for
  /// corrupt bytes (format_error) rather than non-finite numbers
  /// (numeric_error). aborted: the failure that aborted the reductions.
  /// warning: what the setting is, why it is risky and what the default
  /// would be (sync::eager: "outer lr 0.7 is above the stability bound
  /// 0.416 for 4 workers ...", at construction and when the group re-forms).
  std::string problem;
  bool corrupt = false;
  ///@}

  ///@{
  /// membership: the communicator's generation after the change; this
  /// worker's rank and the group's size before it (-1 and 0 for a worker
  /// joining now); the ranks, in this worker's previous group, of the
  /// workers that are gone; the ranks, in the new group, of the workers that
  /// joined; whether a failed collective (a dead or stalled peer) forced it.
  std::uint64_t generation = 0;
  int previous_rank = 0;
  int previous_world = 0;
  std::vector<int> left;
  std::vector<int> joined;
  bool after_failure = false;
  ///@}
};

/// The hook: called on the worker's own thread, in the order events happen.
/// With comm::threads, every worker thread calls its own algorithm's hook:
/// a hook shared between workers must be thread-safe.
using event_hook = std::function<void(const event&)>;

}  // namespace diloco
