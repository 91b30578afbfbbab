// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diloco/compress/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/compressed_mean.hpp"
#include "diloco/compress/device_segments.hpp"
#include "diloco/compress/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/exec/cuda/team_plan.hpp"
#include "diloco/kernels/random.hpp"
#include "diloco/kernels/topk_blocks.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The gathered mean for device tensors: the protocol of
/// gathered_mean.hpp, stage for stage, with every buffer in device memory and
/// the same bytes on the wire (headers and norms included):
///   - the two fused passes are team programs (kernels/topk_blocks.hpp): the
///     chunk's selection as a radix select in shared memory, the decode a
///     binary search of each sender's positions per thread;
///   - the M gathered segments are checked on the device (checksums, each
///     chunk's structure) and only their headers and a few numbers come to
///     the host, where they are validated as on the host
///     (device_segments.hpp);
///   - segments travel through the reducer's detail::wire_transport: device
///     views to a device communicator, pinned host staging for a host one.
/// Device memory beyond the M + 1 segment slots and the residuals: 32 bytes
/// per chunk (its descriptor and its norm sums) and a few bytes per rank.
template <class Compressor, class Space>
  requires std::same_as<Space, device_space>
class gathered_mean<Compressor, Space> : public device_detail::device_ballot<Space> {
  template <class T>
  using device_buffer = buffer<T, Space>;

 public:
  using codec_type = typename Compressor::codec;  ///< the compressor's block codec
  static_assert(kernels::topk_device_form<codec_type>,
                "compress::chunk_topk over device tensors takes chunks of at most 4096 elements (the chunk's "
                "selection runs in shared memory); use a smaller Chunk or keep the parameters in host memory");

  /// The engine of one fragment over `params` (device memory), rank `rank` of `world`; `exec`
  /// uploads its tables, `fragment` goes into every segment header.
  template <class Exec>
  gathered_mean(const parameter_set<float, device_space>& params, int world, int rank,
                const typename Compressor::options& opts, Exec& exec, std::uint32_t fragment = 0)
      : device_detail::device_ballot<Space>(world),
        codec_(Compressor::make_codec(opts)),
        seed_(diloco::detail::stream_seed<Compressor>(opts, fragment)),
        decay_(feedback_decay(opts)),
        world_(world),
        rank_(rank),
        fragment_(fragment) {
    if (static_cast<std::size_t>(world) > diloco::exec::grid::max_checksum_segments)
      diloco::detail::raise<config_error>("the device gathered mean takes at most ",
                                          diloco::exec::grid::max_checksum_segments, " workers, got ", world);
    std::vector<std::size_t> sizes;
    std::vector<kernels::device_tensor> tensors;
    std::uint64_t packed = 0;
    vector_ = kernels::topk_shape<codec_type>::W == kernels::vec_width;
    for (std::size_t k = 0; k < params.count(); ++k) {
      sizes.push_back(params[k].size());
      tensors.push_back({params[k].data(), params.offset(k), packed});
      packed += params[k].size();
      vector_ = vector_ && kernels::aligned16(params[k].data());
    }
    device_detail::require_aligned_offsets(params);
    layout_ = block_layout(sizes, codec_type::block, 1);
    payload_ = layout_.block_count() * codec_type::stride();
    slot_ = (wire::header_bytes + payload_ + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world);
    send_ = device_buffer<std::byte>(slot_);
    gathered_ = device_buffer<std::byte>(m * slot_);
    if constexpr (Compressor::has_error_feedback) {
      residual_ = device_buffer<float>(params.total());
      next_residual_ = device_buffer<float>(params.total());
    }
    block_sums_ = device_buffer<kernels::sums2>(layout_.block_count());
    blocks_ = device_detail::upload<Space>(exec, layout_.blocks(), layout_.block_count());
    tensors_ = device_detail::upload<Space>(exec, tensors.data(), tensors.size());
    norms_ = device_detail::device_norms<Space>(exec, layout_);
    std::vector<const std::byte*> payloads;
    std::vector<kernels::segment_ref> gathered;
    for (std::size_t k = 0; k < m; ++k) {
      payloads.push_back(gathered_.data() + k * slot_ + wire::header_bytes);
      gathered.push_back({payloads.back(), payload_, 0, layout_.block_count(), k * layout_.block_count()});
    }
    const kernels::segment_ref send{send_.data() + wire::header_bytes, payload_, 0, layout_.block_count(), 0};
    payloads_ = device_detail::upload<Space>(exec, payloads.data(), m);
    gathered_segments_ = device_detail::upload<Space>(exec, gathered.data(), m);
    send_segment_ = device_detail::upload<Space>(exec, &send, 1);
    segments_ = device_detail::device_segments<codec_type, Space>(codec_, m, slot_, payload_);
  }

  /// The size of one segment slot: the header and the payload, rounded up to 64.
  std::size_t slot_bytes() const { return slot_; }
  /// The error-feedback residual in the flat (padded) layout, in device
  /// memory; empty without error feedback.
  tensor_view<const float, device_space> residual() const { return {residual_.data(), residual_.size()}; }
  /// The error-feedback residual is state (the rest is scratch).
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    diloco::detail::visit_residual<Compressor>(v, prefix, residual_, true);
  }
  /// What the decode-apply reads once the round has completed, under
  /// `prefix` (checkpoints of a reduction in flight): the gathered segments
  /// and the residual it commits, in device memory.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.bytes(prefix + "gathered", gathered_.data(), gathered_.size(), true);
    if constexpr (Compressor::has_error_feedback)
      v.floats(prefix + "next_residual", next_residual_.data(), next_residual_.size(), true);
  }

  /// 1. encode the whole fragment into this rank's segment, its checksum and
  /// header.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    device_detail::require_aligned16(global, "the point the pseudo-gradient is taken from");
    this->open_round();
    round_ = round;
    const std::uint64_t stream = kernels::make_stream(seed_, round, static_cast<std::uint64_t>(rank_), 1);
    exec.run_teams(layout_.block_count(),
                   kernels::topk_encode_blocks<codec_type>{
                       blocks_.data(), tensors_.data(), global, Compressor::has_error_feedback ? residual_.data() : nullptr,
                       Compressor::has_error_feedback ? next_residual_.data() : nullptr,
                       send_.data() + wire::header_bytes, stream, block_sums_.data(), decay_, vector_});
    segments_.checksums(exec, send_segment_.data(), 1, payload_);
    const kernels::sums2 sums = norms_(exec, block_sums_.data(), 0, 1);
    out_.delta_norm = std::sqrt(sums.a);
    out_.error_norm = std::sqrt(sums.b);
    wire::write_header(segments_.host_header(0), expected(rank_, static_cast<float>(out_.delta_norm)),
                       segments_.checksum(0));
    segments_.put_headers(exec, send_.data(), 1);
    out_.encoded_bytes = wire::header_bytes + payload_;
  }

  ///@{
  /// 2. every rank's segment to every rank; a world of one copies.
  const std::byte* send_data() const { return send_.data(); }
  std::byte* gathered_data() { return gathered_.data(); }
  template <class Exec>
  void self_all_gather(Exec& exec) {
    exec.copy(gathered_.data(), send_.data(), slot_);
  }
  ///@}

  /// 3. validate every segment and cast this rank's vote into vote_data()
  /// (device memory, one slot per rank).
  template <class Exec>
  void check_gathered(Exec& exec) {
    const auto m = static_cast<std::size_t>(world_);
    segments_.inspect(exec, gathered_.data(), gathered_segments_.data(), m * layout_.block_count(), blocks_.data());
    double total = 0.0;
    for (int k = 0; k < world_ && found_.local_problem.empty(); ++k) {
      const std::string where = diloco::detail::concat("gathered round ", round_, ", segment from rank ", k, " on rank ", rank_);
      try {
        const auto h = segments_.check(exec, static_cast<std::size_t>(k), gathered_.data(),
                                       wire::expectation::of(expected(k, 0.0f)), layout_.blocks(),
                                       layout_.block_count(), where.c_str(), false, world_);
        found_.sender(h, k);
        total += h.norm;
      } catch (const format_error& e) {
        found_.local_problem = e.what();
      }
    }
    if (found_.local_problem.empty() && found_.bad_senders.empty() && !(total <= std::numeric_limits<float>::max()))
      found_.bad_shards = "all ranks together (sum of norms overflows fp32)";
    this->cast(exec, rank_);
  }

  // 4. the votes, summed over the ranks (an fp32 all-reduce of vote_count(),
  // device_ballot), then result().

  /// 5. decode and sum in rank order, outer step, copy-back; keep the new
  /// residual.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    device_detail::require_aligned16(global, "theta_global");
    device_detail::require_aligned16(state, "the outer state");
    exec.run_teams(layout_.block_count(),
                   kernels::topk_decode_apply_blocks<codec_type, Update, Merge>{
                       update, blocks_.data(), tensors_.data(), payloads_.data(), world_, global, state, state_stride,
                       merge});
    if constexpr (Compressor::has_error_feedback) std::swap(residual_, next_residual_);
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
  std::size_t payload_ = 0, slot_ = 0;
  bool vector_ = false;  ///< 16-byte accesses to the replica's tensors
  device_buffer<std::byte> send_, gathered_;
  device_buffer<float> residual_, next_residual_;
  device_buffer<compress::block_ref> blocks_;
  device_buffer<kernels::device_tensor> tensors_;
  device_buffer<kernels::sums2> block_sums_;
  device_buffer<const std::byte*> payloads_;
  device_buffer<kernels::segment_ref> gathered_segments_, send_segment_;
  device_detail::device_norms<Space> norms_;
  device_detail::device_segments<codec_type, Space> segments_;
  std::uint64_t round_ = 0;
  using device_detail::device_ballot<Space>::out_;
  using device_detail::device_ballot<Space>::found_;
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
