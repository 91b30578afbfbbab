// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/codec/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/device_segments.hpp"
#include "diloco/compress/round_state.hpp"
#include "diloco/codec/segment.hpp"
#include "diloco/codec/wire_format.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/exec/cuda/team_plan.hpp"
#include "diloco/kernels/codec_elements.hpp"
#include "diloco/kernels/compressed_blocks.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/core/random.hpp"
#include "diloco/kernels/vec4.hpp"
#include "diloco/kernels/wire_passes.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/tensor_traits.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

namespace detail_compressed {

// The engine's four segment areas, each a run of slots of `slot` bytes in
// the engine's memory space: M stage-1 segments to send and M received, the
// reduced shard, and the M reduced shards gathered.
struct areas {
  std::byte* send;
  std::byte* recv;
  std::byte* reduced;
  std::byte* gathered;
  std::size_t slot;
};

// The per-space operations of the compressed mean: the three fused passes
// (encode, reduce, decode-apply), writing segment headers (with, on a
// device, the payload checksums the passes' checksum runs found), copying
// within the space, and inspecting and checking received segments.
// compressed_mean holds the protocol (stages, headers, validation order,
// votes, residual) once over them.
template <class Codec, class Space>
class ops;

// Host memory: fused host passes over the replica's tensors; a segment's
// header is written and checked where the segment lies.
template <class Codec>
class ops<Codec, host_space> {
 public:
  static void require(const parameter_set<float, host_space>&, int) {}

  template <class Exec>
  void build(const parameter_set<float, host_space>& params, const block_layout&, const Codec&, int world, int,
             const areas&, std::size_t, Exec&) {
    for (std::size_t k = 0; k < params.count(); ++k) {
      local_.push_back(params[k].data());
      offset_.push_back(params.offset(k));
    }
    received_.assign(static_cast<std::size_t>(world), nullptr);
  }

  // Stage 1: every shard s into send slot s; the norm sums.
  template <class Exec>
  kernels::sums2 encode(Exec& exec, const Codec& codec, const block_layout& layout, int world, const float* global,
                        const float* residual, float* next_residual, const areas& a, std::uint64_t stream) {
    const kernels::tensor_table table{local_.data(), offset_.data()};
    kernels::sums2 sums;
    for (int s = 0; s < world; ++s) {
      std::byte* seg = a.send + static_cast<std::size_t>(s) * a.slot;
      sums += exec.transform_reduce(
          layout.blocks_in(s),
          kernels::encode_pseudo_gradient<Codec>{codec, layout.blocks() + layout.first_block(s), table, global,
                                                 residual, next_residual, seg + wire::header_bytes, codec.stride(),
                                                 stream});
    }
    return sums;
  }
  // Stages 3+4: this rank's shard of the received segments, reduced and
  // re-encoded into the reduced slot; its norm.
  template <class Exec>
  double reduce(Exec& exec, const Codec& codec, const block_layout& layout, int rank, int world, const areas& a,
                std::uint64_t stream) {
    return std::sqrt(exec.transform_reduce(
        layout.blocks_in(rank),
        kernels::reduce_shard<Codec>{codec, layout.blocks() + layout.first_block(rank), offset_.data(),
                                     received_.data(), world, a.reduced + wire::header_bytes, codec.stride(), stream}));
  }
  // Header `h` (with its payload checksum, summed on exec's threads) into slot k of `slots`.
  template <class Exec>
  void header(Exec& exec, std::byte* slots, std::size_t slot, std::size_t k, const wire::header& h) {
    std::byte* seg = slots + k * slot;
    wire::write_header(seg, h, payload_words_sum(exec, seg + wire::header_bytes, h.payload_bytes));
  }
  // The first n headers written are in place already.
  template <class Exec>
  void put_headers(Exec&, std::byte*, std::size_t) {}
  template <class Exec>
  void copy(Exec&, std::byte* dst, const std::byte* src, std::size_t bytes) {
    std::memcpy(dst, src, bytes);
  }
  // Before the received or gathered segments are checked one by one:
  // nothing to bring over.
  template <class Exec>
  void inspect_received(Exec&, std::byte*) {}
  template <class Exec>
  void inspect_gathered(Exec&, std::byte*) {}
  // validate_segment for segment k of `slots`, carrying shard `shard`: its
  // checksum and structure check in one pass on exec's threads.
  template <class Exec>
  wire::header check(Exec& exec, const Codec& codec, std::size_t k, const std::byte* slots, std::size_t slot,
                     const wire::expectation& want, const block_layout& layout, int shard, const char* where,
                     bool allow_status, int world) {
    return validate_segment(exec, codec, std::span<const std::byte>(slots + k * slot, slot), want,
                            layout.blocks() + layout.first_block(shard), layout.blocks_in(shard), where, allow_status,
                            world);
  }
  // Received segment k passed its checks: the reduce reads its payload.
  void receive(std::size_t k, const std::byte* recv, std::size_t slot) {
    received_[k] = recv + k * slot + wire::header_bytes;
  }
  // Stage 7 over the gathered reduced shards.
  template <class Exec, class Update, class Merge>
  void decode_apply(Exec& exec, const Codec& codec, const block_layout& layout, int world, const areas& a,
                    const Update& update, float* global, float* state, std::size_t state_stride, const Merge& merge) {
    const kernels::tensor_table table{local_.data(), offset_.data()};
    for (int s = 0; s < world; ++s) {
      exec.for_each(layout.blocks_in(s),
                    kernels::decode_apply<Codec, Update, Merge>{
                        codec, update, layout.blocks() + layout.first_block(s), table,
                        a.gathered + static_cast<std::size_t>(s) * a.slot + wire::header_bytes, codec.stride(), global,
                        state, state_stride, merge});
    }
  }

 private:
  std::vector<float*> local_;
  std::vector<std::size_t> offset_;
  std::vector<const std::byte*> received_;
};

// Device memory: the fused passes are team programs
// (kernels/compressed_blocks.hpp): a warp or block per codec block, the
// block max a CUB reduction. Payload checksums are computed on the device (a
// wrapping sum, so any order gives the host's value) and each block's
// structure is checked there (the first bad block per segment, found with an
// atomic min); only the 64-byte headers, the checksum sums, the first bad
// block indices and the norms' lane sums come to the host, where headers are
// written and validated as on the host (device_segments.hpp). The executor
// runs team programs (run_teams), payload checksums (checksum_segments) and
// element-wise functors (for_each): exec::cuda on a GPU, a thread-by-thread
// replay in the host tests. Device memory beyond the segments and residuals:
// 32 bytes per codec block (its descriptor and its norm sums) and a few bytes
// per rank.
template <class Codec, class Space>
  requires(!std::is_same_v<Space, host_space>)
class ops<Codec, Space> {
  template <class T>
  using device_buffer = buffer<T, Space>;

 public:
  using elements = kernels::codec_elements<Codec>;  // the codec's element-level form, for the team programs
  static_assert(elements::supported,
                "diloco: compress::topk runs on host tensors only; for device tensors use "
                "compress::blockwise<format, B>, compress::cast<bf16|fp16> or "
                "compress::chunk_topk<Chunk <= 4096, K, V>, optionally inside compress::error_feedback, "
                "or compress::low_rank; a codec of your own runs on device tensors when written as its "
                "element-level form (compress::element_codec<E>, codec/element_codec.hpp)");

  // The checks that come before any buffer is sized.
  static void require(const parameter_set<float, Space>& params, int world) {
    if (static_cast<std::size_t>(world) > diloco::exec::grid::max_checksum_segments)
      diloco::detail::raise<config_error>("the device compressed mean takes at most ",
                                          diloco::exec::grid::max_checksum_segments, " workers, got ", world);
    device_detail::require_aligned_offsets(params);
  }

  // `exec` uploads the layout's tables.
  template <class Exec>
  void build(const parameter_set<float, Space>& params, const block_layout& layout, const Codec& codec, int world,
             int rank, const areas& a, std::size_t max_payload, Exec& exec) {
    std::vector<kernels::device_tensor> tensors;
    std::uint64_t packed = 0;
    vector_ = elements::group == kernels::vec_width;
    for (std::size_t k = 0; k < params.count(); ++k) {
      tensors.push_back({params[k].data(), params.offset(k), packed});
      packed += params[k].size();
      vector_ = vector_ && kernels::aligned16(params[k].data());
    }
    const auto m = static_cast<std::size_t>(world);
    const std::size_t stride = codec.stride();
    max_payload_ = max_payload;
    block_sums_ = device_buffer<kernels::sums2>(layout.block_count());
    blocks_ = device_detail::upload<Space>(exec, layout.blocks(), layout.block_count());
    tensors_ = device_detail::upload<Space>(exec, tensors.data(), tensors.size());
    norms_ = device_detail::device_norms<Space>(exec, layout);

    std::vector<const std::byte*> received;
    std::vector<kernels::segment_ref> send, recv, gathered;
    const std::size_t mine = layout.blocks_in(rank);
    received_items_ = m * mine;
    gathered_items_ = layout.block_count();
    for (std::size_t k = 0; k < m; ++k) {
      const int s = static_cast<int>(k);
      const std::size_t payload = layout.blocks_in(s) * stride;
      received.push_back(a.recv + k * a.slot + wire::header_bytes);
      send.push_back({a.send + k * a.slot + wire::header_bytes, payload, layout.first_block(s), layout.blocks_in(s), 0});
      recv.push_back({a.recv + k * a.slot + wire::header_bytes, mine * stride, layout.first_block(rank), mine, k * mine});
      gathered.push_back({a.gathered + k * a.slot + wire::header_bytes, payload, layout.first_block(s),
                          layout.blocks_in(s), layout.first_block(s)});
    }
    const kernels::segment_ref reduced{a.reduced + wire::header_bytes, mine * stride, layout.first_block(rank), mine,
                                       0};
    received_ = device_detail::upload<Space>(exec, received.data(), m);
    send_segments_ = device_detail::upload<Space>(exec, send.data(), m);
    recv_segments_ = device_detail::upload<Space>(exec, recv.data(), m);
    gathered_segments_ = device_detail::upload<Space>(exec, gathered.data(), m);
    reduced_segment_ = device_detail::upload<Space>(exec, &reduced, 1);

    segments_ = device_detail::device_segments<Codec, Space>(codec, m, a.slot, max_payload);
  }

  // Stage 1: every shard s into send slot s, then the M payload checksums;
  // the norm sums.
  template <class Exec>
  kernels::sums2 encode(Exec& exec, const Codec&, const block_layout& layout, int world, const float* global,
                        const float* residual, float* next_residual, const areas& a, std::uint64_t stream) {
    for (int s = 0; s < world; ++s)
      exec.run_teams(layout.blocks_in(s),
                     kernels::encode_blocks<elements>{
                         blocks_.data() + layout.first_block(s), tensors_.data(), global, residual, next_residual,
                         a.send + static_cast<std::size_t>(s) * a.slot + wire::header_bytes, stream,
                         block_sums_.data() + layout.first_block(s), vector_});
    segments_.checksums(exec, send_segments_.data(), static_cast<std::size_t>(world), max_payload_);
    return norms_(exec, block_sums_.data(), 0, world);
  }
  // Stages 3+4: this rank's shard reduced and re-encoded into the reduced
  // slot, then its payload checksum; its norm.
  template <class Exec>
  double reduce(Exec& exec, const Codec& codec, const block_layout& layout, int rank, int world, const areas& a,
                std::uint64_t stream) {
    const std::size_t mine = layout.blocks_in(rank);
    exec.run_teams(mine, kernels::reduce_blocks<elements>{blocks_.data() + layout.first_block(rank), tensors_.data(),
                                                          received_.data(), world, a.reduced + wire::header_bytes,
                                                          stream, block_sums_.data() + layout.first_block(rank)});
    segments_.checksums(exec, reduced_segment_.data(), 1, mine * codec.stride());
    return std::sqrt(norms_(exec, block_sums_.data(), rank, rank + 1).a);
  }
  // Header `h` for slot k, written on the host with the payload checksum the
  // last checksum run found for segment k (none for a status without a
  // payload); put_headers() puts the first n into the slots.
  template <class Exec>
  void header(Exec&, std::byte*, std::size_t, std::size_t k, const wire::header& h) {
    wire::write_header(segments_.host_header(k), h, h.status != 0 ? std::uint64_t{0} : segments_.checksum(k));
  }
  template <class Exec>
  void put_headers(Exec& exec, std::byte* slots, std::size_t n) {
    segments_.put_headers(exec, slots, n);
  }
  template <class Exec>
  void copy(Exec& exec, std::byte* dst, const std::byte* src, std::size_t bytes) {
    exec.copy(dst, src, bytes);
  }
  // The headers, checksums and first malformed blocks of the received
  // (gathered) segments, to the host.
  template <class Exec>
  void inspect_received(Exec& exec, std::byte* recv) {
    segments_.inspect(exec, recv, recv_segments_.data(), received_items_, blocks_.data());
  }
  template <class Exec>
  void inspect_gathered(Exec& exec, std::byte* gathered) {
    segments_.inspect(exec, gathered, gathered_segments_.data(), gathered_items_, blocks_.data());
  }
  // validate_segment for segment k of `slots` (carrying shard `shard`), from
  // what the last inspect brought to the host.
  template <class Exec>
  wire::header check(Exec& exec, const Codec&, std::size_t k, const std::byte* slots, std::size_t,
                     const wire::expectation& want, const block_layout& layout, int shard, const char* where,
                     bool allow_status, int world) {
    return segments_.check(exec, k, slots, want, layout.blocks() + layout.first_block(shard), layout.blocks_in(shard),
                           where, allow_status, world);
  }
  // The received payloads' table was uploaded once.
  void receive(std::size_t, const std::byte*, std::size_t) {}
  template <class Exec, class Update, class Merge>
  void decode_apply(Exec& exec, const Codec&, const block_layout& layout, int world, const areas& a,
                    const Update& update, float* global, float* state, std::size_t state_stride, const Merge& merge) {
    device_detail::require_aligned16(global, "theta_global");
    device_detail::require_aligned16(state, "the outer state");
    const bool vector = vector_ && kernels::stride_keeps_alignment(state, state_stride);
    for (int s = 0; s < world; ++s)
      exec.run_teams(layout.blocks_in(s),
                     kernels::decode_apply_blocks<elements, Update, Merge>{
                         update, blocks_.data() + layout.first_block(s), tensors_.data(),
                         a.gathered + static_cast<std::size_t>(s) * a.slot + wire::header_bytes, global, state,
                         state_stride, vector, merge});
  }

 private:
  std::size_t max_payload_ = 0;
  std::size_t received_items_ = 0, gathered_items_ = 0;  // the blocks of the received and gathered segments
  bool vector_ = false;                                  // 16-byte accesses to the replica's tensors
  device_buffer<compress::block_ref> blocks_;
  device_buffer<kernels::device_tensor> tensors_;
  device_buffer<kernels::sums2> block_sums_;
  device_buffer<const std::byte*> received_;
  device_buffer<kernels::segment_ref> send_segments_, recv_segments_, gathered_segments_, reduced_segment_;
  device_detail::device_norms<Space> norms_;
  device_detail::device_segments<Codec, Space> segments_;
};

}  // namespace detail_compressed

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
///
/// Written once over memory space Space: the protocol is here, the passes,
/// header writes, copies and segment checks are
/// detail_compressed::ops<codec, Space>. Over device memory the same bytes
/// go on the wire as on the host (same layout, codes and headers, norms
/// included), the same validation runs before anything is decoded, and the
/// agreement and rejection rules are the same; segments travel through the
/// reducer's detail::wire_transport (device views to a device communicator,
/// pinned host staging for a host one). Space stays a parameter so that
/// the device buffer types stay dependent: buffer<T, device_space> is
/// defined by the CUDA backend (memory/device_buffer.hpp), which may be
/// included later.
template <class Compressor, class Space>
class compressed_mean : public diloco::detail::feedback<Compressor, Space>,
                        public device_detail::space_ballot<Space> {
  // The feedback base comes first: with the ballot (a std::conditional_t)
  // first, nvcc's front end hands GCC the two base initializers in the
  // other order (-Wreorder).
  static constexpr bool on_device = !std::is_same_v<Space, host_space>;
  using ballot_type = device_detail::space_ballot<Space>;
  using feedback_type = diloco::detail::feedback<Compressor, Space>;

 public:
  using codec_type = typename Compressor::codec;  ///< the compressor's block codec

  /// The engine of one fragment over `params` in host memory, rank `rank` of
  /// `world`; `fragment`: the sync schedule's fragment these parameters form
  /// (carried in every segment header; 0 for the whole model).
  compressed_mean(const parameter_set<float, Space>& params, int world, int rank,
                  const typename Compressor::options& opts, std::uint32_t fragment = 0)
    requires(!on_device)
      : compressed_mean(params, world, rank, opts, fragment, no_uploads{}) {}
  /// The same over device memory: `exec` uploads the layout's tables; every buffer is sized here.
  template <class Exec>
  compressed_mean(const parameter_set<float, Space>& params, int world, int rank,
                  const typename Compressor::options& opts, Exec& exec, std::uint32_t fragment = 0)
    requires(on_device)
      : compressed_mean(params, world, rank, opts, fragment, exec) {}

  /// The codec blocks of the fragment and their shards (shard k is reduced by rank k).
  const block_layout& layout() const { return layout_; }
  /// The size of one segment slot: the header and the largest shard's payload, rounded up to 64.
  std::size_t slot_bytes() const { return slot_; }
  // residual() and visit_state(): the error-feedback residual is the state
  // (diloco::detail::feedback); the rest is scratch.

  // Stages 1-6, the operations between the collectives. The protocol (which
  // collective follows which stage) is reduce::compressed's:
  //   encode -> all_to_all(send -> recv, exchange_bytes) -> reduce
  //   -> all_gather(reduced -> gathered, slot_bytes each) -> check_gathered
  //   -> all_reduce(vote_data, vote_count, sum) -> result
  // A world of one copies instead (self_all_to_all, self_all_gather). The
  // buffers (raw bytes in Space) stay untouched between the stages.

  /// 1. encode every shard (shard k is meant for rank k); `global` is the
  /// point the pseudo-gradient is taken from, in the flat layout.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    if constexpr (on_device) device_detail::require_aligned16(global, "the point the pseudo-gradient is taken from");
    this->open_round();
    round_ = round;
    auto& out = this->out_;
    const std::uint64_t stream1 = kernels::make_stream(seed_, round, static_cast<std::uint64_t>(rank_), 1);
    const kernels::sums2 sums = ops_.encode(exec, codec_, layout_, world_, global, this->committed_residual(),
                                            this->next_residual(), areas(), stream1);
    out.delta_norm = std::sqrt(sums.a);
    out.error_norm = std::sqrt(sums.b);
    for (int s = 0; s < world_; ++s) {
      const std::size_t payload = layout_.blocks_in(s) * stride_;
      ops_.header(exec, send_.data(), slot_, static_cast<std::size_t>(s),
                  {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                   static_cast<std::uint32_t>(rank_), layout_.elements_in(s), payload, round,
                   static_cast<float>(out.delta_norm), 0, fragment_});
      out.encoded_bytes += wire::header_bytes + payload;
    }
    ops_.put_headers(exec, send_.data(), static_cast<std::size_t>(world_));
  }
  ///@{
  /// 2. shard r of every rank to rank r: the M slots of send_data() to
  /// recv_data() (exchange_bytes() in all); a world of one copies.
  const std::byte* send_data() const { return send_.data(); }
  std::byte* recv_data() { return recv_.data(); }
  std::size_t exchange_bytes() const { return send_.size(); }
  template <class Exec>
  void self_all_to_all(Exec& exec) {
    ops_.copy(exec, recv_.data(), send_.data(), slot_);
  }
  ///@}

  /// 3+4. validate, reduce and re-encode this rank's shard.
  template <class Exec>
  void reduce(Exec& exec) {
    auto& found = this->found_;
    const std::size_t my_payload = layout_.blocks_in(rank_) * stride_;
    ops_.inspect_received(exec, recv_.data());
    std::uint32_t status = 0;
    for (int k = 0; k < world_ && status == 0; ++k) {
      try {
        const auto h = check_segment(exec, static_cast<std::size_t>(k), recv_.data(), expect(k, rank_, my_payload),
                                     rank_, "stage-1 segment", false);
        found.sender(h, k);
        ops_.receive(static_cast<std::size_t>(k), recv_.data(), slot_);
      } catch (const format_error& e) {
        found.local_problem = e.what();
        status = 1 + static_cast<std::uint32_t>(k);
      }
    }
    double reduced_norm = 0.0;
    if (status == 0) {
      const std::uint64_t stream2 = kernels::make_stream(seed_, round_, static_cast<std::uint64_t>(rank_), 2);
      reduced_norm = ops_.reduce(exec, codec_, layout_, rank_, world_, areas(), stream2);
    }
    ops_.header(exec, reduced_.data(), slot_, 0,
                {codec_type::id, flags(), static_cast<std::uint32_t>(codec_type::block),
                 static_cast<std::uint32_t>(rank_), layout_.elements_in(rank_), status == 0 ? my_payload : 0, round_,
                 static_cast<float>(reduced_norm), status, fragment_});
    ops_.put_headers(exec, reduced_.data(), 1);
  }
  ///@{
  /// 5. every reduced shard (slot_bytes() from reduced_data()) to every rank
  /// (gathered_data()); a world of one copies.
  const std::byte* reduced_data() const { return reduced_.data(); }
  std::byte* gathered_data() { return gathered_.data(); }
  template <class Exec>
  void self_all_gather(Exec& exec) {
    ops_.copy(exec, gathered_.data(), reduced_.data(), slot_);
  }
  ///@}

  /// Validates the gathered shards and casts this rank's vote into
  /// vote_data() (one slot per rank, in Space).
  template <class Exec>
  void check_gathered(Exec& exec) {
    auto& found = this->found_;
    ops_.inspect_gathered(exec, gathered_.data());
    for (int k = 0; k < world_ && found.local_problem.empty(); ++k) {
      try {
        // A shard whose owner reported a problem carries a status and no
        // payload.
        const auto h = check_segment(exec, static_cast<std::size_t>(k), gathered_.data(),
                                     expect(k, k, layout_.blocks_in(k) * stride_), k, "reduced segment", true);
        found.reduced(h, k);
      } catch (const format_error& e) {
        found.local_problem = e.what();
      }
    }
    this->cast(exec, rank_);
  }
  // 6. agree on the round: vote_data() summed over the ranks, then result()
  // (the ballot).

  /// What stage 7 reads once the round has completed, under `prefix`
  /// (checkpoints of a reduction in flight): the gathered reduced shards and
  /// the residual it commits, in Space.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.bytes(prefix + "gathered", gathered_.data(), gathered_.size(), on_device);
    this->visit_next_residual(v, prefix);
  }

  /// Stage 7: decode the mean, outer step, copy-back; then keep the new
  /// error-feedback residual.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    ops_.decode_apply(exec, codec_, layout_, world_, areas(), update, global, state, state_stride, merge);
    this->commit_residual();
  }

 private:
  struct no_uploads {};  // the host engine uploads nothing
  using ops_type = detail_compressed::ops<codec_type, Space>;

  template <class Exec>
  compressed_mean(const parameter_set<float, Space>& params, int world, int rank,
                  const typename Compressor::options& opts, std::uint32_t fragment, Exec&& exec)
      : feedback_type(params.total()),
        ballot_type(world),
        codec_(Compressor::make_codec(opts)),
        seed_(diloco::detail::stream_seed<Compressor>(opts, fragment)),
        world_(world),
        rank_(rank),
        fragment_(fragment) {
    ops_type::require(params, world);
    std::vector<std::size_t> sizes;
    for (std::size_t k = 0; k < params.count(); ++k) sizes.push_back(params[k].size());
    layout_ = block_layout(sizes, codec_type::block, world);
    stride_ = codec_.stride();
    std::size_t largest = 0;
    for (int s = 0; s < world; ++s) largest = std::max(largest, layout_.blocks_in(s) * stride_);
    slot_ = (wire::header_bytes + largest + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world);
    send_ = buffer<std::byte, Space>(m * slot_);
    recv_ = buffer<std::byte, Space>(m * slot_);
    reduced_ = buffer<std::byte, Space>(slot_);
    gathered_ = buffer<std::byte, Space>(m * slot_);
    ops_.build(params, layout_, codec_, world, rank, areas(), largest, exec);
  }

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
  detail_compressed::areas areas() { return {send_.data(), recv_.data(), reduced_.data(), gathered_.data(), slot_}; }

  /// validate_segment for segment k of `slots` (carrying shard `shard`).
  template <class Exec>
  wire::header check_segment(Exec& exec, std::size_t k, const std::byte* slots, const wire::expectation& want,
                             int shard, const char* what, bool allow_status) {
    const std::string where = diloco::detail::concat("compressed round ", want.round, ", ", what, " from rank ",
                                                     want.sender, " on rank ", rank_);
    return ops_.check(exec, codec_, k, slots, slot_, want, layout_, shard, where.c_str(), allow_status, world_);
  }

  codec_type codec_;
  std::uint64_t seed_;
  int world_;
  int rank_;
  std::uint32_t fragment_ = 0;
  block_layout layout_;
  std::size_t stride_ = 0;
  std::size_t slot_ = 0;
  buffer<std::byte, Space> send_, recv_, reduced_, gathered_;
  ops_type ops_;
  std::uint64_t round_ = 0;  ///< of the exchange in progress
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
