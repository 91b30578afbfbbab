// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/compress/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/segment.hpp"
#include "diloco/compress/wire_format.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/kernels/random.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_traits.hpp"
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

namespace diloco::compress {

/// The mean of the workers' pseudo-gradients under a lossy codec, without
/// ever adding quantized values that have different scales:
/// ```
/// 1. each rank encodes its pseudo-gradient (plus error-feedback residual)
///    shard by shard: shard k is meant for rank k            (fused pass)
/// 2. all-to-all: rank r receives every rank's encoding of shard r
/// 3+4. rank r decodes them, sums in fp32 in rank order, divides by M, and
///    re-encodes its reduced shard                          (fused pass)
/// 5. all-gather: every rank receives every reduced shard
/// 6. agreement: a tiny all-reduce of each rank's verdict (corrupt bytes,
///    non-finite values), so all ranks apply or reject the round together
/// 7. decode + outer step + copy-back                       (fused pass)
/// ```
/// Traffic per rank: 2 (M-1)/M times the encoded size, plus headers.
template <class Compressor, class Space>
class compressed_mean : public diloco::detail::host_ballot, public diloco::detail::feedback<Compressor, Space> {
 public:
  using codec_type = typename Compressor::codec;  ///< the compressor's block codec

  /// `fragment`: the sync schedule's fragment these parameters form (carried
  /// in every segment header; 0 for the whole model).
  compressed_mean(const parameter_set<float, Space>& params, int world, int rank,
                  const typename Compressor::options& opts, std::uint32_t fragment = 0)
      : host_ballot(world),
        diloco::detail::feedback<Compressor, Space>(params.total()),
        codec_(Compressor::make_codec(opts)),
        seed_(diloco::detail::stream_seed<Compressor>(opts, fragment)),
        world_(world),
        rank_(rank),
        fragment_(fragment) {
    std::vector<std::size_t> sizes;
    for (std::size_t k = 0; k < params.count(); ++k) {
      sizes.push_back(params[k].size());
      local_.push_back(params[k].data());
      offset_.push_back(params.offset(k));
    }
    layout_ = block_layout(sizes, codec_type::block, world);
    stride_ = codec_.stride();
    std::size_t largest = 0;
    for (int s = 0; s < world; ++s) largest = std::max(largest, layout_.blocks_in(s) * stride_);
    slot_ = (wire::header_bytes + largest + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world);
    send_ = host_buffer<std::byte>(m * slot_);
    recv_ = host_buffer<std::byte>(m * slot_);
    reduced_ = host_buffer<std::byte>(slot_);
    gathered_ = host_buffer<std::byte>(m * slot_);
    received_.assign(m, nullptr);
  }

  /// The codec blocks of the fragment and their shards (shard k is reduced by rank k).
  const block_layout& layout() const { return layout_; }
  /// The size of one segment slot: the header and the largest shard's payload, rounded up to 64.
  std::size_t slot_bytes() const { return slot_; }
  // residual() and visit_state(): the error-feedback residual is the state
  // (diloco::detail::feedback); the rest is scratch.

  // Stages 1-6, the operations between the collectives. The protocol (which
  // collective follows which stage) is reduce::compressed's, for host and
  // device engines alike:
  //   encode -> all_to_all(send -> recv, exchange_bytes) -> reduce
  //   -> all_gather(reduced -> gathered, slot_bytes each) -> check_gathered
  //   -> all_reduce(vote_data, vote_count, sum) -> result
  // A world of one copies instead (self_all_to_all, self_all_gather). The
  // buffers stay untouched between the stages.

  /// 1. encode every shard (shard k is meant for rank k).
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    open_round();
    round_ = round;
    const kernels::tensor_table table{local_.data(), offset_.data()};
    const std::uint64_t stream1 = kernels::make_stream(seed_, round, static_cast<std::uint64_t>(rank_), 1);
    kernels::sums2 sums;
    for (int s = 0; s < world_; ++s) {
      std::byte* seg = send_.data() + static_cast<std::size_t>(s) * slot_;
      sums += exec.transform_reduce(
          layout_.blocks_in(s),
          kernels::encode_pseudo_gradient<codec_type>{codec_, layout_.blocks() + layout_.first_block(s), table, global,
                                                      this->committed_residual(), this->next_residual(),
                                                      seg + wire::header_bytes, stride_, stream1});
    }
    out_.delta_norm = std::sqrt(sums.a);
    out_.error_norm = std::sqrt(sums.b);
    for (int s = 0; s < world_; ++s) {
      const std::size_t payload = layout_.blocks_in(s) * stride_;
      wire::write_header(send_.data() + static_cast<std::size_t>(s) * slot_,
                         {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                          static_cast<std::uint32_t>(rank_), layout_.elements_in(s), payload, round,
                          static_cast<float>(out_.delta_norm), 0, fragment_});
      out_.encoded_bytes += wire::header_bytes + payload;
    }
  }
  ///@{
  /// 2. shard r of every rank to rank r.
  const std::byte* send_data() const { return send_.data(); }
  std::byte* recv_data() { return recv_.data(); }
  std::size_t exchange_bytes() const { return send_.size(); }
  template <class Exec>
  void self_all_to_all(Exec&) {
    std::memcpy(recv_.data(), send_.data(), slot_);
  }
  ///@}

  /// 3+4. validate, reduce and re-encode this rank's shard.
  template <class Exec>
  void reduce(Exec& exec) {
    std::uint32_t status = 0;
    const std::size_t my_payload = layout_.blocks_in(rank_) * stride_;
    for (int k = 0; k < world_ && status == 0; ++k) {
      const std::byte* seg = recv_.data() + static_cast<std::size_t>(k) * slot_;
      try {
        const auto h = check_segment(seg, {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                                           static_cast<std::uint32_t>(k), layout_.elements_in(rank_), my_payload,
                                           round_, fragment_},
                                     rank_, "stage-1 segment");
        found_.sender(h, k);
        received_[static_cast<std::size_t>(k)] = seg + wire::header_bytes;
      } catch (const format_error& e) {
        found_.local_problem = e.what();
        status = 1 + static_cast<std::uint32_t>(k);
      }
    }
    double reduced_norm = 0.0;
    if (status == 0) {
      const std::uint64_t stream2 = kernels::make_stream(seed_, round_, static_cast<std::uint64_t>(rank_), 2);
      reduced_norm = std::sqrt(exec.transform_reduce(
          layout_.blocks_in(rank_),
          kernels::reduce_shard<codec_type>{codec_, layout_.blocks() + layout_.first_block(rank_), offset_.data(),
                                            received_.data(), world_, reduced_.data() + wire::header_bytes, stride_,
                                            stream2}));
    }
    wire::write_header(reduced_.data(), {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                                         static_cast<std::uint32_t>(rank_), layout_.elements_in(rank_),
                                         status == 0 ? my_payload : 0, round_, static_cast<float>(reduced_norm),
                                         status, fragment_});
  }
  ///@{
  /// 5. every reduced shard to every rank.
  const std::byte* reduced_data() const { return reduced_.data(); }
  std::byte* gathered_data() { return gathered_.data(); }
  template <class Exec>
  void self_all_gather(Exec&) {
    std::memcpy(gathered_.data(), reduced_.data(), slot_);
  }
  ///@}

  /// Validates the gathered shards and casts this rank's vote.
  template <class Exec>
  void check_gathered(Exec&) {
    for (int k = 0; k < world_ && found_.local_problem.empty(); ++k) {
      const std::byte* seg = gathered_.data() + static_cast<std::size_t>(k) * slot_;
      try {
        // A shard whose owner reported a problem carries a status and no
        // payload.
        const std::uint64_t payload = layout_.blocks_in(k) * stride_;
        const auto h = check_segment(seg, {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                                           static_cast<std::uint32_t>(k), layout_.elements_in(k), payload, round_, fragment_},
                                     k, "reduced segment", true);
        found_.reduced(h, k);
      } catch (const format_error& e) {
        found_.local_problem = e.what();
      }
    }
    cast(rank_);
  }
  // 6. agree on the round: vote_data() summed over the ranks, then result()
  // (diloco::detail::host_ballot).

  /// What stage 7 reads once the round has completed, under `prefix`
  /// (checkpoints of a reduction in flight): the gathered reduced shards and
  /// the residual it commits.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.bytes(prefix + "gathered", gathered_.data(), gathered_.size(), false);
    this->visit_next_residual(v, prefix);
  }

  /// Stage 7: decode the mean, outer step, copy-back; then keep the new
  /// error-feedback residual.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    const kernels::tensor_table table{local_.data(), offset_.data()};
    for (int s = 0; s < world_; ++s) {
      exec.for_each(layout_.blocks_in(s),
                    kernels::decode_apply<codec_type, Update, Merge>{
                        codec_, update, layout_.blocks() + layout_.first_block(s), table,
                        gathered_.data() + static_cast<std::size_t>(s) * slot_ + wire::header_bytes, stride_, global,
                        state, state_stride, merge});
    }
    this->commit_residual();
  }

 private:
  wire::header check_segment(const std::byte* seg, const wire::expectation& want, int shard, const char* what,
                             bool allow_status = false) const {
    const std::string where = diloco::detail::concat("compressed round ", want.round, ", ", what, " from rank ",
                                                     want.sender, " on rank ", rank_);
    return validate_segment(codec_, std::span<const std::byte>(seg, slot_), want,
                            layout_.blocks() + layout_.first_block(shard), layout_.blocks_in(shard), where.c_str(),
                            allow_status, world_);
  }

  static constexpr std::uint8_t flags() { return diloco::detail::segment_flags<Compressor>(); }

  codec_type codec_;
  std::uint64_t seed_;
  int world_;
  int rank_;
  std::uint32_t fragment_ = 0;
  block_layout layout_;
  std::vector<float*> local_;
  std::vector<std::size_t> offset_;
  std::size_t stride_ = 0;
  std::size_t slot_ = 0;
  host_buffer<std::byte> send_, recv_, reduced_, gathered_;
  std::vector<const std::byte*> received_;
  std::uint64_t round_ = 0;  ///< of the exchange in progress
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END

// The device-space specialization (buffers in device memory, GPU passes).
#include "diloco/compress/compressed_mean_device.hpp"
