// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace diloco {

/// adaptive<C...>: one fragment's last round and the rung chosen for its
/// next one, with the agreed numbers the rule compared (the means over the
/// ranks; identical on every rank).
struct compression_choice {
  std::size_t used = 0;           ///< the rung of the last applied round
  std::size_t next = 0;           ///< the rung of the next round
  std::string next_name;          ///< its compressor's name
  std::string reason;             ///< why (compress::adaptive_reason): "start", "within budget", ...
  double link_seconds = 0.0;      ///< the last round's link time
  double relative_error = 0.0;    ///< the last round's ||v - decode(encode(v))|| / ||v||
  double budget_seconds = 0.0;    ///< the budget compared with (0: none yet)
  double predicted_seconds = 0.0; ///< the next rung's predicted link time
};

/// What an algorithm instance has done so far, for logs and dashboards.
/// Byte counts are this worker's, as its communicator accounts them.
struct stats {
  std::uint64_t inner_steps = 0;      ///< inner optimizer steps taken
  std::uint64_t rounds = 0;           ///< outer rounds applied
  std::uint64_t rejected_rounds = 0;  ///< rounds refused for non-finite pseudo-gradients
  std::uint64_t bytes_sent = 0;       ///< everything sent, the initial broadcast included
  /// Sent to agree across ranks: at construction on the policies, layout
  /// and options, before each round on the ranks' step counts, at load on
  /// what each restored (not in bytes_sent, so per-round byte counts stay
  /// exact).
  std::uint64_t setup_bytes = 0;
  std::uint64_t bytes_received = 0;   ///< everything received, the initial broadcast included
  std::uint64_t last_round_bytes_sent = 0;  ///< the last applied round's reduction: sent
  std::uint64_t last_round_bytes_received = 0;  ///< the last applied round's reduction: received
  double pseudo_gradient_norm = 0.0;  ///< ||theta_global - theta_local|| of this worker, last round
  ///@{
  /// Lossy compressors, last round: ||v - decode(encode(v))|| of this worker's
  /// stage-1 encoding (v = pseudo-gradient + error-feedback residual), and
  /// the bytes of that encoding per parameter (headers and scales included).
  double compression_error_norm = 0.0;
  double encoded_bytes_per_parameter = 0.0;
  ///@}
  /// Bytes this worker sent in the last round per parameter of the model.
  double wire_bytes_per_parameter = 0.0;
  double comm_seconds = 0.0;          ///< wall time spent inside the communicator
  double last_round_comm_seconds = 0.0;  ///< the last applied round's comm_seconds
  double outer_seconds = 0.0;  ///< wall time of outer rounds, communication included
  ///@{
  /// Overlap. A round is one reduction (the whole model's, or one fragment's
  /// under sync::streaming), from the pass that begins it to the pass that
  /// applies it. blocked: wall time this worker spent on it outside its
  /// inner steps (passes, starting and finishing collectives, waiting);
  /// hidden: time it was in flight while inner steps ran (zero for
  /// schedules that do not overlap). hidden / (hidden + blocked) is the share
  /// of the exchange the schedule hid.
  double blocked_seconds = 0.0;
  double last_round_blocked_seconds = 0.0;  ///< the last applied round's blocked_seconds
  double hidden_seconds = 0.0;
  double last_round_hidden_seconds = 0.0;  ///< the last applied round's hidden_seconds
  ///@}
  /// Bytes this worker sent for each fragment's reductions (one entry per
  /// fragment; one in all for a whole-model schedule).
  std::vector<std::uint64_t> fragment_bytes_sent;
  ///@{
  /// Elastic membership (elastic_communicator): the workers in the group
  /// now, how many times the group re-formed (leaves, joins, recoveries
  /// from a dead peer) and how many reductions a failure aborted (theta_global
  /// unchanged; the local progress stays in the replica).
  int workers = 0;
  std::uint64_t membership_changes = 0;
  std::uint64_t aborted_rounds = 0;
  ///@}
  /// adaptive<C...> only: one entry per fragment.
  std::vector<compression_choice> compression_choices;
};

}  // namespace diloco
