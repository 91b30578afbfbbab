// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/compress/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/compressed_mean.hpp"
#include "diloco/compress/device_segments.hpp"
#include "diloco/compress/segment.hpp"
#include "diloco/compress/wire_format.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/exec/cuda/team_plan.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/codec_elements.hpp"
#include "diloco/kernels/compressed_blocks.hpp"
#include "diloco/kernels/random.hpp"
#include "diloco/kernels/vec4.hpp"
#include "diloco/kernels/wire_passes.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_traits.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The compressed mean for device tensors: the protocol of
/// compressed_mean.hpp, stage for stage, with every buffer in device memory.
/// The same bytes go on the wire as on the host (same layout, same codes,
/// same headers, norms included), the same validation runs before anything
/// is decoded, and the agreement and rejection rules are the host's. What
/// differs is only where the work runs:
///   - the fused passes are team programs (kernels/compressed_blocks.hpp):
///     a warp or block per codec block, the block max a CUB reduction;
///   - payload checksums are computed on the device (a wrapping sum, so any
///     order gives the host's value) and each block's structure is checked
///     there (the first bad block per segment, found with an atomic min);
///     only the 64-byte headers, the checksum sums, the first bad block
///     indices and the norms' lane sums come to the host, where headers are
///     written and validated (wire_format.hpp, segment.hpp);
///   - segments travel through detail::wire_transport: device views to a
///     device communicator, pinned host staging for a host one.
/// The executor runs team programs (run_teams), payload checksums
/// (checksum_segments) and element-wise functors (for_each): exec::cuda on a
/// GPU, a thread-by-thread replay in the host tests.
///
/// Device memory beyond the segments and residuals: 32 bytes per codec block
/// (its descriptor and its norm sums) and a few bytes per rank.
///
/// Space is a parameter (constrained to device_space) so that the device
/// buffer types stay dependent: buffer<T, device_space> is defined by the
/// CUDA backend (tensor/device_buffer.hpp), which may be included later.
template <class Compressor, class Space>
  requires std::same_as<Space, device_space>
class compressed_mean<Compressor, Space> : public device_detail::device_ballot<Space> {
  template <class T>
  using device_buffer = buffer<T, Space>;

 public:
  using codec_type = typename Compressor::codec;         ///< the compressor's block codec
  using elements = kernels::codec_elements<codec_type>;  ///< the codec's element-level form, for the team programs
  static_assert(elements::supported,
                "diloco: compress::topk runs on host tensors only; for device tensors use "
                "compress::blockwise<format, B>, compress::cast<bf16|fp16> or "
                "compress::chunk_topk<Chunk <= 4096, K, V>, optionally inside compress::error_feedback, "
                "or compress::low_rank");

  /// Uploads the layout's tables with `exec`; every buffer is sized here.
  template <class Exec>
  compressed_mean(const parameter_set<float, device_space>& params, int world, int rank,
                  const typename Compressor::options& opts, Exec& exec, std::uint32_t fragment = 0)
      : device_detail::device_ballot<Space>(world),
        codec_(Compressor::make_codec(opts)), seed_(diloco::detail::stream_seed<Compressor>(opts, fragment)), world_(world), rank_(rank), fragment_(fragment) {
    if (static_cast<std::size_t>(world) > diloco::exec::grid::max_checksum_segments)
      diloco::detail::raise<config_error>("the device compressed mean takes at most ",
                                          diloco::exec::grid::max_checksum_segments, " workers, got ", world);
    std::vector<std::size_t> sizes;
    std::vector<kernels::device_tensor> tensors;
    std::uint64_t packed = 0;
    vector_ = elements::group == kernels::vec_width;
    for (std::size_t k = 0; k < params.count(); ++k) {
      sizes.push_back(params[k].size());
      tensors.push_back({params[k].data(), params.offset(k), packed});
      packed += params[k].size();
      vector_ = vector_ && kernels::aligned16(params[k].data());
    }
    device_detail::require_aligned_offsets(params);
    layout_ = block_layout(sizes, codec_type::block, world);
    stride_ = codec_.stride();
    std::size_t largest = 0;
    for (int s = 0; s < world; ++s) largest = std::max(largest, layout_.blocks_in(s) * stride_);
    max_payload_ = largest;
    slot_ = (wire::header_bytes + largest + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world);

    send_ = device_bytes(m * slot_);
    recv_ = device_bytes(m * slot_);
    reduced_ = device_bytes(slot_);
    gathered_ = device_bytes(m * slot_);
    if constexpr (Compressor::has_error_feedback) {
      residual_ = device_buffer<float>(params.total());
      next_residual_ = device_buffer<float>(params.total());
    }
    block_sums_ = device_buffer<kernels::sums2>(layout_.block_count());
    blocks_ = device_detail::upload<Space>(exec, layout_.blocks(), layout_.block_count());
    tensors_ = device_detail::upload<Space>(exec, tensors.data(), tensors.size());
    norms_ = device_detail::device_norms<Space>(exec, layout_);

    std::vector<const std::byte*> received;
    std::vector<kernels::segment_ref> send, recv, gathered;
    const std::size_t mine = layout_.blocks_in(rank);
    for (std::size_t k = 0; k < m; ++k) {
      const int s = static_cast<int>(k);
      const std::size_t payload = layout_.blocks_in(s) * stride_;
      received.push_back(recv_.data() + k * slot_ + wire::header_bytes);
      send.push_back({send_.data() + k * slot_ + wire::header_bytes, payload, layout_.first_block(s),
                      layout_.blocks_in(s), 0});
      recv.push_back({recv_.data() + k * slot_ + wire::header_bytes, mine * stride_, layout_.first_block(rank), mine,
                      k * mine});
      gathered.push_back({gathered_.data() + k * slot_ + wire::header_bytes, payload, layout_.first_block(s),
                          layout_.blocks_in(s), layout_.first_block(s)});
    }
    const kernels::segment_ref reduced{reduced_.data() + wire::header_bytes, mine * stride_,
                                       layout_.first_block(rank), mine, 0};
    received_ = device_detail::upload<Space>(exec, received.data(), m);
    send_segments_ = device_detail::upload<Space>(exec, send.data(), m);
    recv_segments_ = device_detail::upload<Space>(exec, recv.data(), m);
    gathered_segments_ = device_detail::upload<Space>(exec, gathered.data(), m);
    reduced_segment_ = device_detail::upload<Space>(exec, &reduced, 1);

    segments_ = device_detail::device_segments<codec_type, Space>(codec_, m, slot_, max_payload_);
  }

  /// The codec blocks of the fragment and their shards (shard k is reduced by rank k).
  const block_layout& layout() const { return layout_; }
  /// The size of one segment slot: the header and the largest shard's payload, rounded up to 64.
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

  // Stages 1-6 as the host engine offers them (compressed_mean.hpp): the
  // protocol, which collective follows which stage, is reduce::compressed's,
  // for both spaces; here are the device operations between collectives.
  // Segments move as raw device bytes (send_data()/recv_data() etc.)
  // through the engine's detail::wire_transport, with
  // reserve_bytes(world * slot_bytes()) done.

  /// 1. encode every shard, then its checksum and the norms; `global` is the
  /// point the pseudo-gradient is taken from, in the flat device layout.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    device_detail::require_aligned16(global, "the point the pseudo-gradient is taken from");
    this->open_round();
    round_ = round;
    const auto m = static_cast<std::size_t>(world_);
    const std::uint64_t stream1 = kernels::make_stream(seed_, round, static_cast<std::uint64_t>(rank_), 1);
    for (int s = 0; s < world_; ++s)
      exec.run_teams(layout_.blocks_in(s),
                     kernels::encode_blocks<elements>{
                         blocks_.data() + layout_.first_block(s), tensors_.data(), global,
                         Compressor::has_error_feedback ? residual_.data() : nullptr,
                         Compressor::has_error_feedback ? next_residual_.data() : nullptr,
                         segment(send_, static_cast<std::size_t>(s)) + wire::header_bytes, stream1,
                         block_sums_.data() + layout_.first_block(s), vector_});
    segments_.checksums(exec, send_segments_.data(), m, max_payload_);
    const kernels::sums2 sums = norms_(exec, block_sums_.data(), 0, world_);
    out_.delta_norm = std::sqrt(sums.a);
    out_.error_norm = std::sqrt(sums.b);
    for (int s = 0; s < world_; ++s) {
      const std::size_t payload = layout_.blocks_in(s) * stride_;
      wire::write_header(segments_.host_header(static_cast<std::size_t>(s)),
                         {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                          static_cast<std::uint32_t>(rank_), layout_.elements_in(s), payload, round,
                          static_cast<float>(out_.delta_norm), 0, fragment_},
                         segments_.checksum(static_cast<std::size_t>(s)));
      out_.encoded_bytes += wire::header_bytes + payload;
    }
    segments_.put_headers(exec, send_.data(), m);
  }

  ///@{
  /// 2. shard r of every rank to rank r: the M slots of send_data() to
  /// recv_data() (exchange_bytes() in all); a world of one copies.
  const std::byte* send_data() const { return send_.data(); }
  std::byte* recv_data() { return recv_.data(); }
  std::size_t exchange_bytes() const { return static_cast<std::size_t>(world_) * slot_; }
  template <class Exec>
  void self_all_to_all(Exec& exec) {
    exec.copy(recv_.data(), send_.data(), slot_);
  }
  ///@}

  /// 3+4. validate, reduce and re-encode this rank's shard.
  template <class Exec>
  void reduce(Exec& exec) {
    const auto m = static_cast<std::size_t>(world_);
    const std::size_t mine = layout_.blocks_in(rank_);
    segments_.inspect(exec, recv_.data(), recv_segments_.data(), m * mine, blocks_.data());
    std::uint32_t status = 0;
    const std::size_t my_payload = mine * stride_;
    for (int k = 0; k < world_ && status == 0; ++k) {
      try {
        const auto h = check_segment(exec, static_cast<std::size_t>(k), recv_, expect(k, rank_, my_payload), rank_,
                                     "stage-1 segment", false);
        found_.sender(h, k);
      } catch (const format_error& e) {
        found_.local_problem = e.what();
        status = 1 + static_cast<std::uint32_t>(k);
      }
    }
    double reduced_norm = 0.0;
    std::uint64_t reduced_sum = 0;
    if (status == 0) {
      const std::uint64_t stream2 = kernels::make_stream(seed_, round_, static_cast<std::uint64_t>(rank_), 2);
      exec.run_teams(mine, kernels::reduce_blocks<elements>{blocks_.data() + layout_.first_block(rank_), tensors_.data(),
                                                            received_.data(), world_,
                                                            reduced_.data() + wire::header_bytes, stream2,
                                                            block_sums_.data() + layout_.first_block(rank_)});
      segments_.checksums(exec, reduced_segment_.data(), 1, my_payload);
      reduced_norm = std::sqrt(norms_(exec, block_sums_.data(), rank_, rank_ + 1).a);
      reduced_sum = segments_.checksum(0);
    }
    wire::write_header(segments_.host_header(0),
                       {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                        static_cast<std::uint32_t>(rank_), layout_.elements_in(rank_), status == 0 ? my_payload : 0,
                        round_, static_cast<float>(reduced_norm), status, fragment_},
                       reduced_sum);
    segments_.put_headers(exec, reduced_.data(), 1);
  }

  ///@{
  /// 5. every reduced shard (slot_bytes() from reduced_data()) to every rank
  /// (gathered_data()); a world of one copies.
  const std::byte* reduced_data() const { return reduced_.data(); }
  std::byte* gathered_data() { return gathered_.data(); }
  template <class Exec>
  void self_all_gather(Exec& exec) {
    exec.copy(gathered_.data(), reduced_.data(), slot_);
  }
  ///@}

  /// Validates the gathered shards and casts this rank's vote into
  /// vote_data() (device memory, one slot per rank).
  template <class Exec>
  void check_gathered(Exec& exec) {
    segments_.inspect(exec, gathered_.data(), gathered_segments_.data(), layout_.block_count(), blocks_.data());
    for (int k = 0; k < world_ && found_.local_problem.empty(); ++k) {
      try {
        // A shard whose owner reported a problem carries a status and no
        // payload.
        const auto h = check_segment(exec, static_cast<std::size_t>(k), gathered_,
                                     expect(k, k, layout_.blocks_in(k) * stride_), k, "reduced segment", true);
        found_.reduced(h, k);
      } catch (const format_error& e) {
        found_.local_problem = e.what();
      }
    }
    this->cast(exec, rank_);
  }

  // 6. the votes, summed over the ranks (an fp32 all-reduce of vote_count(),
  // device_ballot), then result().

  /// Stage 7: decode the mean, outer step, copy-back; then keep the new
  /// error-feedback residual.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    device_detail::require_aligned16(global, "theta_global");
    device_detail::require_aligned16(state, "the outer state");
    const bool vector = vector_ && kernels::stride_keeps_alignment(state, state_stride);
    for (int s = 0; s < world_; ++s)
      exec.run_teams(layout_.blocks_in(s),
                     kernels::decode_apply_blocks<elements, Update, Merge>{
                         update, blocks_.data() + layout_.first_block(s), tensors_.data(),
                         segment(gathered_, static_cast<std::size_t>(s)) + wire::header_bytes, global, state,
                         state_stride, vector, merge});
    if constexpr (Compressor::has_error_feedback) std::swap(residual_, next_residual_);
  }

 private:
  static constexpr std::uint8_t flags() { return diloco::detail::segment_flags<Compressor>(); }
  wire::expectation expect(int sender, int shard, std::uint64_t payload) const {
    return {codec_type::id,
            flags(),
            static_cast<std::uint32_t>(codec_type::block),
            static_cast<std::uint32_t>(sender),
            layout_.elements_in(shard),
            payload,
            round_,
            fragment_};
  }

  static device_buffer<std::byte> device_bytes(std::size_t n) { return device_buffer<std::byte>(n); }

  std::byte* segment(device_buffer<std::byte>& slots, std::size_t k) const { return slots.data() + k * slot_; }

  /// validate_segment for segment k of `slots` (carrying shard `shard`),
  /// from what segments_.inspect() brought to the host.
  template <class Exec>
  wire::header check_segment(Exec& exec, std::size_t k, device_buffer<std::byte>& slots,
                             const wire::expectation& want, int shard, const char* what, bool allow_status) {
    const std::string where = diloco::detail::concat("compressed round ", want.round, ", ", what, " from rank ",
                                                     want.sender, " on rank ", rank_);
    return segments_.check(exec, k, slots.data(), want, layout_.blocks() + layout_.first_block(shard),
                           layout_.blocks_in(shard), where.c_str(), allow_status, world_);
  }

  codec_type codec_;
  std::uint64_t seed_;
  int world_;
  int rank_;
  std::uint32_t fragment_ = 0;
  block_layout layout_;
  std::size_t stride_ = 0;
  std::size_t slot_ = 0;
  std::size_t max_payload_ = 0;
  bool vector_ = false;  ///< 16-byte accesses to the replica's tensors
  device_buffer<std::byte> send_, recv_, reduced_, gathered_;
  device_buffer<float> residual_, next_residual_;
  device_buffer<compress::block_ref> blocks_;
  device_buffer<kernels::device_tensor> tensors_;
  device_buffer<kernels::sums2> block_sums_;
  device_buffer<const std::byte*> received_;
  device_buffer<kernels::segment_ref> send_segments_, recv_segments_, gathered_segments_, reduced_segment_;
  device_detail::device_norms<Space> norms_;
  device_detail::device_segments<codec_type, Space> segments_;
  /// The exchange in progress.
  std::uint64_t round_ = 0;
  using device_detail::device_ballot<Space>::out_;
  using device_detail::device_ballot<Space>::found_;
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
