// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every compression engine (compressed_mean.hpp, gathered_mean.hpp,
// low_rank.hpp; host and device memory alike) keeps of a round beside its
// protocol: what it found and the vote it casts (round_findings, the host
// ballot; device_segments.hpp has the device one), the flags and stream
// seeds of its segments, and the error-feedback residual.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/codec/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/random.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/core/tensor_traits.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN


namespace diloco::compress {

/// What a round's exchange found.
struct exchange_result {
  bool accepted = true;  ///< false when the round is rejected (every rank agrees)
  bool corrupt = false;        ///< rejected for bad bytes (format_error) rather than bad numbers
  std::string problem;         ///< why it was rejected
  double delta_norm = 0.0;     ///< this rank's ||pseudo-gradient||
  double error_norm = 0.0;     ///< this rank's ||v - decode(encode(v))|| in stage 1
  std::size_t encoded_bytes = 0;  ///< this rank's stage-1 segments, headers included
};

}  // namespace diloco::compress

namespace diloco::detail {

// What one rank learns while it validates a round's segments (host and
// device exchanges alike), the vote it casts in stage 6, and the outcome it
// reads from the summed votes.
struct round_findings {
  std::string local_problem;  // bytes this rank found bad itself (a format_error's message)
  std::string bad_senders;    // senders of non-finite pseudo-gradients
  std::string bad_shards;     // shards whose mean is not finite
  std::string reporters;      // shard owners that reported bad bytes

  // Stage 3: a stage-1 segment from rank k passed its checks.
  void sender(const wire::header& h, int k) {
    if (!std::isfinite(h.norm))
      bad_senders += concat(bad_senders.empty() ? "" : ", ", "rank ", k, " (norm ", detail::norm_text(h.norm), ")");
  }
  // Stage 5: shard k's reduced segment passed its checks; it may carry its
  // owner's report (a status, no payload) instead of a mean.
  void reduced(const wire::header& h, int k) {
    if (h.status != 0)
      reporters += concat(reporters.empty() ? "" : ", ", "rank ", k, " (about data from rank ", h.status - 1, ")");
    else if (!std::isfinite(h.norm))
      bad_shards += concat(bad_shards.empty() ? "" : ", ", "shard ", k);
  }

  // Stage 6: 0 = apply, 1 = non-finite numbers, 2 = corrupt bytes. A rank
  // votes "corrupt" only for bytes it found bad itself; a shard owner's
  // report is seen by all through the all-gather, and the owner votes for it.
  float vote() const {
    if (!local_problem.empty()) return 2.0f;
    return bad_senders.empty() && bad_shards.empty() ? 0.0f : 1.0f;
  }

  // The round's outcome from the summed votes, one slot per rank.
  void read(std::span<const float> verdict, compress::exchange_result& out) const {
    std::string corrupt_ranks;
    bool any = false;
    for (std::size_t k = 0; k < verdict.size(); ++k) {
      any = any || verdict[k] != 0.0f;
      if (verdict[k] == 2.0f) corrupt_ranks += concat(corrupt_ranks.empty() ? "" : ", ", k);
    }
    if (!any) return;
    out.accepted = false;
    if (!corrupt_ranks.empty()) {
      out.corrupt = true;
      out.problem = local_problem.empty()
                        ? concat("rank(s) ", corrupt_ranks, " received corrupt compressed data",
                                 reporters.empty() ? "" : " (", reporters, reporters.empty() ? "" : ")")
                        : local_problem;
    } else if (!bad_senders.empty()) {
      out.problem = concat("non-finite pseudo-gradient from ", bad_senders);
    } else {
      out.problem = concat("the compressed mean of ", bad_shards, " is not finite (values beyond the codec's range?)");
    }
  }
};

// A host engine's part of the round's agreement: what this rank found in
// the round (found_), its own result so far (out_), and the M vote slots
// the reducer's all-reduce sums (this rank's verdict in its own slot).
class host_ballot {
 public:
  float* vote_data() { return slots_.data(); }
  std::size_t vote_count() const { return slots_.size(); }
  // The round's outcome, once the votes are summed.
  template <class Exec>
  compress::exchange_result result(Exec&) const {
    compress::exchange_result out = out_;
    found_.read(slots_, out);
    return out;
  }

 protected:
  explicit host_ballot(int world) : slots_(static_cast<std::size_t>(world), 0.0f) {}
  // A round begins: nothing found yet.
  void open_round() {
    out_ = {};
    found_ = {};
  }
  // This rank's vote (round_findings::vote) in its slot, zeros elsewhere.
  void cast(int rank) {
    std::fill(slots_.begin(), slots_.end(), 0.0f);
    slots_[static_cast<std::size_t>(rank)] = found_.vote();
  }
  // The same, as device_ballot is called (engines written over the space).
  template <class Exec>
  void cast(Exec&, int rank) {
    cast(rank);
  }
  compress::exchange_result out_;
  round_findings found_;

 private:
  std::vector<float> slots_;
};

}  // namespace diloco::detail

namespace diloco::detail {

// What the host and device engines share beyond the protocol: the flags
// every segment of a compressor carries, and the residual as visited state.
template <class Compressor>
constexpr std::uint8_t segment_flags() {
  return static_cast<std::uint8_t>((Compressor::stochastic ? wire::flag_stochastic : 0) |
                                   (Compressor::has_error_feedback ? wire::flag_error_feedback : 0));
}
// The seed of a compressor's stochastic-rounding streams (0 when it rounds
// to nearest). Each fragment of a sync schedule draws its own streams;
// fragment 0 keeps the compressor's seed, so one fragment gives wave 1's bits.
template <class Compressor>
std::uint64_t stream_seed(const typename Compressor::options& o, std::uint32_t fragment) {
  if constexpr (requires { o.seed; })
    return fragment == 0 ? o.seed : kernels::mix64(o.seed ^ (0x667261676d656e74ULL + fragment));
  else
    return (void)o, (void)fragment, 0;
}
template <class Compressor, class Visitor, class Residual>
void visit_residual(Visitor& v, std::string_view prefix, Residual& residual, bool device) {
  if constexpr (Compressor::has_error_feedback)
    v.buffer(std::string(prefix) + ".residual", residual.data(), residual.size(), device);
  else
    (void)v, (void)prefix, (void)residual, (void)device;
}

// An engine's error-feedback residual (4 bytes per parameter, twice) in
// memory space Space: the committed one, read by a round's encode, and the
// one the encode writes beside it, kept by commit_residual() only when the
// round is applied. Empty without error feedback. The committed residual is
// the engine's state.
template <class Compressor, class Space>
class feedback {
  static constexpr bool ef = Compressor::has_error_feedback;
  static constexpr bool on_device = !std::is_same_v<Space, host_space>;

 public:
  /// The committed residual in the flat layout (a span on the host, a device view on a device).
  auto residual() const {
    if constexpr (on_device)
      return tensor_view<const float, Space>{residual_.data(), residual_.size()};
    else
      return std::span<const float>{residual_.data(), residual_.size()};
  }
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    visit_residual<Compressor>(v, prefix, residual_, on_device);
  }

 protected:
  explicit feedback(std::size_t elements) {
    if constexpr (ef) {
      residual_ = buffer<float, Space>(elements);
      next_residual_ = buffer<float, Space>(elements);
    }
  }
  const float* committed_residual() const { return ef ? residual_.data() : nullptr; }
  // A completed round's residual, which apply() commits (checkpoints of a
  // reduction in flight).
  template <class Visitor>
  void visit_next_residual(Visitor& v, const std::string& prefix) {
    if constexpr (ef) v.floats(prefix + "next_residual", next_residual_.data(), next_residual_.size(), on_device);
  }
  float* next_residual() { return ef ? next_residual_.data() : nullptr; }
  void commit_residual() {
    if constexpr (ef) std::swap(residual_, next_residual_);
  }

 private:
  buffer<float, Space> residual_, next_residual_;
};

}  // namespace diloco::detail

DILOCO_EXACT_FP_END
