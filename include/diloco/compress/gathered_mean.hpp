// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diloco/compress/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/compressed_mean.hpp"
#include "diloco/compress/segment.hpp"
#include "diloco/compress/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/kernels/random.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The header of a gathered segment (host and device engines): one segment
/// per rank carrying the whole fragment.
template <class Compressor>
wire::header gathered_header(std::uint64_t elements, std::uint64_t payload, std::uint64_t round,
                             std::uint32_t fragment, int sender, float norm) {
  using codec = typename Compressor::codec;
  return {codec::id, diloco::detail::segment_flags<Compressor>(), static_cast<std::uint32_t>(codec::block),
          static_cast<std::uint32_t>(sender), elements, payload, round, norm, 0, fragment};
}

/// The mean of the workers' pseudo-gradients under a sparse codec
/// (chunk_topk), aggregated sparsely:
/// ```
/// 1. each rank encodes its pseudo-gradient (plus error-feedback residual)
///    into one segment                                        (fused pass)
/// 2. all-gather: every rank receives every rank's segment
/// 3. every rank validates all M segments and casts its vote
/// 4. agreement: a tiny all-reduce of the votes (round_findings), so all
///    ranks apply or reject the round together
/// 5. decode the M segments block by block, sum in fp32 in rank order,
///    divide by M, outer step, copy-back                      (fused pass)
/// ```
/// Every rank computes the same sums in the same order: the replicas stay
/// bitwise equal. Traffic per rank: (M - 1) segments received. Unlike the
/// compressed mean (compressed_mean.hpp) nothing is re-encoded, so a sparse
/// codec's mean is exactly the mean of the decoded segments. Device tensors:
/// gathered_mean_device.hpp (the same bytes).
template <class Compressor, class Space>
class gathered_mean : public diloco::detail::host_ballot, public diloco::detail::host_feedback<Compressor> {
 public:
  using codec_type = typename Compressor::codec;  ///< the compressor's block codec

  /// The engine of one fragment over `params` (host memory), rank `rank` of `world`; `fragment`
  /// goes into every segment header.
  gathered_mean(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
                std::uint32_t fragment = 0)
      : host_ballot(world),
        diloco::detail::host_feedback<Compressor>(params.total()),
        codec_(Compressor::make_codec(opts)),
        seed_(diloco::detail::stream_seed<Compressor>(opts, fragment)),
        decay_(feedback_decay(opts)),
        world_(world),
        rank_(rank),
        fragment_(fragment) {
    std::vector<std::size_t> sizes;
    for (std::size_t k = 0; k < params.count(); ++k) {
      sizes.push_back(params[k].size());
      local_.push_back(params[k].data());
      offset_.push_back(params.offset(k));
    }
    layout_ = block_layout(sizes, codec_type::block, 1);
    stride_ = codec_.stride();
    payload_ = layout_.block_count() * stride_;
    slot_ = (wire::header_bytes + payload_ + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world);
    send_ = host_buffer<std::byte>(slot_);
    gathered_ = host_buffer<std::byte>(m * slot_);
    payloads_.assign(m, nullptr);
  }

  /// The size of one segment slot: the header and the payload, rounded up to 64.
  std::size_t slot_bytes() const { return slot_; }
  // residual() and visit_state(): diloco::detail::host_feedback.

  /// 1. encode the whole fragment into this rank's segment.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    open_round();
    round_ = round;
    const kernels::tensor_table table{local_.data(), offset_.data()};
    const std::uint64_t stream = kernels::make_stream(seed_, round, static_cast<std::uint64_t>(rank_), 1);
    const kernels::sums2 sums = exec.transform_reduce(
        layout_.block_count(),
        kernels::encode_pseudo_gradient<codec_type>{codec_, layout_.blocks(), table, global,
                                                    this->committed_residual(), this->next_residual(),
                                                    send_.data() + wire::header_bytes, stride_, stream, decay_});
    out_.delta_norm = std::sqrt(sums.a);
    out_.error_norm = std::sqrt(sums.b);
    wire::write_header(send_.data(), expected(rank_, static_cast<float>(out_.delta_norm)));
    out_.encoded_bytes = wire::header_bytes + payload_;
  }

  ///@{
  /// 2. every rank's segment to every rank.
  const std::byte* send_data() const { return send_.data(); }
  std::byte* gathered_data() { return gathered_.data(); }
  template <class Exec>
  void self_all_gather(Exec&) {
    std::memcpy(gathered_.data(), send_.data(), slot_);
  }
  ///@}

  /// 3. validate every segment and cast this rank's vote.
  template <class Exec>
  void check_gathered(Exec&) {
    double total = 0.0;
    for (int k = 0; k < world_ && found_.local_problem.empty(); ++k) {
      const std::byte* seg = gathered_.data() + static_cast<std::size_t>(k) * slot_;
      const std::string where = diloco::detail::concat("gathered round ", round_, ", segment from rank ", k, " on rank ", rank_);
      try {
        const auto h = validate_segment(codec_, std::span<const std::byte>(seg, slot_),
                                        wire::expectation::of(expected(k, 0.0f)),
                                        layout_.blocks(), layout_.block_count(), where.c_str(), false, world_);
        found_.sender(h, k);
        total += h.norm;
        payloads_[static_cast<std::size_t>(k)] = seg + wire::header_bytes;
      } catch (const format_error& e) {
        found_.local_problem = e.what();
      }
    }
    // Finite norms whose sum overflows could still give a mean that does not
    // fit in fp32 (each decoded value is at most its sender's norm).
    if (found_.local_problem.empty() && found_.bad_senders.empty() && !(total <= std::numeric_limits<float>::max()))
      found_.bad_shards = "all ranks together (sum of norms overflows fp32)";
    cast(rank_);
  }
  // 4. agree on the round: vote_data() summed over the ranks, then result().

  /// What step 5 reads once the round has completed, under `prefix`
  /// (checkpoints of a reduction in flight): every rank's segment (the
  /// decode reads their payloads, pointed at as check_gathered does) and the
  /// residual it commits.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.bytes(prefix + "gathered", gathered_.data(), gathered_.size(), false);
    for (std::size_t k = 0; k < payloads_.size(); ++k) payloads_[k] = gathered_.data() + k * slot_ + wire::header_bytes;
    this->visit_next_residual(v, prefix);
  }

  /// 5. decode and sum in rank order, outer step, copy-back; keep the new
  /// residual.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    const kernels::tensor_table table{local_.data(), offset_.data()};
    exec.for_each(layout_.block_count(),
                  kernels::gathered_decode_apply<codec_type, Update, Merge>{codec_, update, layout_.blocks(), table,
                                                                            payloads_.data(), world_, stride_, global,
                                                                            state, state_stride, merge});
    this->commit_residual();
  }

 private:
  wire::header expected(int sender, float norm) const {
    return gathered_header<Compressor>(layout_.total(), payload_, round_, fragment_, sender, norm);
  }

  codec_type codec_;
  std::uint64_t seed_;
  float decay_;
  int world_;
  int rank_;
  std::uint32_t fragment_;
  block_layout layout_;
  std::vector<float*> local_;
  std::vector<std::size_t> offset_;
  std::size_t stride_ = 0, payload_ = 0, slot_ = 0;
  host_buffer<std::byte> send_, gathered_;
  std::vector<const std::byte*> payloads_;
  std::uint64_t round_ = 0;
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END

#include "diloco/compress/gathered_mean_device.hpp"
