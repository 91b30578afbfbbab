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
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/codec/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/device_segments.hpp"
#include "diloco/compress/round_state.hpp"
#include "diloco/codec/segment.hpp"
#include "diloco/codec/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/exec/cuda/team_plan.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/core/random.hpp"
#include "diloco/kernels/topk_blocks.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The header of a gathered segment: one segment per rank carrying the
/// whole fragment.
template <class Compressor>
wire::header gathered_header(std::uint64_t elements, std::uint64_t payload, std::uint64_t round,
                             std::uint32_t fragment, int sender, float norm) {
  using codec = typename Compressor::codec;
  return {codec::id, diloco::detail::segment_flags<Compressor>(), static_cast<std::uint32_t>(codec::block),
          static_cast<std::uint32_t>(sender), elements, payload, round, norm, 0, fragment};
}

namespace detail_gathered {

// The per-space operations of the gathered mean: the two fused passes
// (encode, decode-apply), sealing this rank's segment (its header, and on a
// device its checksum), copying within the space, and inspecting the M
// gathered segments. gathered_mean holds the protocol (stages, headers,
// validation order, votes, residual) once over them.
template <class Codec, class Space>
class ops;

// Host memory: fused host passes over the replica's tensors; the segments
// are validated where they lie.
template <class Codec>
class ops<Codec, host_space> {
 public:
  template <class Exec>
  void build(const parameter_set<float, host_space>& params, const block_layout&, const Codec&, int world,
             std::size_t, std::size_t, std::byte*, std::byte*, Exec&) {
    for (std::size_t k = 0; k < params.count(); ++k) {
      local_.push_back(params[k].data());
      offset_.push_back(params.offset(k));
    }
    payloads_.assign(static_cast<std::size_t>(world), nullptr);
  }

  // The encode pass into `payload`; its norm sums.
  template <class Exec>
  kernels::sums2 encode(Exec& exec, const Codec& codec, const block_layout& layout, const float* global,
                        const float* residual, float* next_residual, std::byte* payload, std::uint64_t stream,
                        float decay) {
    const kernels::tensor_table table{local_.data(), offset_.data()};
    return exec.transform_reduce(layout.block_count(),
                                 kernels::encode_pseudo_gradient<Codec>{codec, layout.blocks(), table, global, residual,
                                                                        next_residual, payload, codec.stride(), stream,
                                                                        decay});
  }
  // Writes `h` (and its payload checksum, summed on exec's threads) into the segment at `seg`.
  template <class Exec>
  void seal(Exec& exec, std::byte* seg, const wire::header& h) {
    wire::write_header(seg, h, payload_words_sum(exec, seg + wire::header_bytes, h.payload_bytes));
  }
  template <class Exec>
  void copy(Exec&, std::byte* dst, const std::byte* src, std::size_t bytes) {
    std::memcpy(dst, src, bytes);
  }
  // Before the segments are checked one by one: nothing to bring over.
  template <class Exec>
  void inspect(Exec&, std::byte*) {}
  // validate_segment for rank k's segment in `gathered` (checksum and
  // structure check in one pass on exec's threads); the decode reads its payload.
  template <class Exec>
  wire::header check(Exec& exec, const Codec& codec, std::size_t k, const std::byte* gathered, std::size_t slot,
                     const wire::expectation& want, const block_layout& layout, const char* where, int world) {
    const std::byte* seg = gathered + k * slot;
    const auto h = validate_segment(exec, codec, std::span<const std::byte>(seg, slot), want, layout.blocks(),
                                    layout.block_count(), where, false, world);
    payloads_[k] = seg + wire::header_bytes;
    return h;
  }
  // A restored round (visit_ready): the decode reads every rank's payload in `gathered`.
  void point_at(const std::byte* gathered, std::size_t slot) {
    for (std::size_t k = 0; k < payloads_.size(); ++k) payloads_[k] = gathered + k * slot + wire::header_bytes;
  }
  template <class Exec, class Update, class Merge>
  void decode_apply(Exec& exec, const Codec& codec, const block_layout& layout, int world, const Update& update,
                    float* global, float* state, std::size_t state_stride, const Merge& merge) {
    const kernels::tensor_table table{local_.data(), offset_.data()};
    exec.for_each(layout.block_count(),
                  kernels::gathered_decode_apply<Codec, Update, Merge>{codec, update, layout.blocks(), table,
                                                                       payloads_.data(), world, codec.stride(), global,
                                                                       state, state_stride, merge});
  }

 private:
  std::vector<float*> local_;
  std::vector<std::size_t> offset_;
  std::vector<const std::byte*> payloads_;
};

// Device memory: the two fused passes are team programs
// (kernels/topk_blocks.hpp): the chunk's selection as a radix select in
// shared memory, the decode a binary search of each sender's positions per
// thread. The M gathered segments are checked on the device (checksums,
// each chunk's structure) and only their headers and a few numbers come to
// the host, where they are validated as on the host (device_segments.hpp).
// Device memory beyond the M + 1 segment slots and the residuals: 32 bytes
// per chunk (its descriptor and its norm sums) and a few bytes per rank.
template <class Codec, class Space>
  requires(!std::is_same_v<Space, host_space>)
class ops<Codec, Space> {
  template <class T>
  using device_buffer = buffer<T, Space>;

 public:
  static_assert(kernels::topk_device_form<Codec>,
                "compress::chunk_topk over device tensors takes chunks of at most 4096 elements (the chunk's "
                "selection runs in shared memory); use a smaller Chunk or keep the parameters in host memory");

  // The checks that come before any buffer is sized.
  static void require(const parameter_set<float, Space>& params, int world) {
    if (static_cast<std::size_t>(world) > diloco::exec::grid::max_checksum_segments)
      diloco::detail::raise<config_error>("the device gathered mean takes at most ",
                                          diloco::exec::grid::max_checksum_segments, " workers, got ", world);
    device_detail::require_aligned_offsets(params);
  }

  // `exec` uploads the tables.
  template <class Exec>
  void build(const parameter_set<float, Space>& params, const block_layout& layout, const Codec& codec, int world,
             std::size_t slot, std::size_t payload, std::byte* send, std::byte* gathered, Exec& exec) {
    std::vector<kernels::device_tensor> tensors;
    std::uint64_t packed = 0;
    const auto m = static_cast<std::size_t>(world);
    vector_ = kernels::topk_shape<Codec>::W == kernels::vec_width;
    for (std::size_t k = 0; k < params.count(); ++k) {
      tensors.push_back({params[k].data(), params.offset(k), packed});
      packed += params[k].size();
      vector_ = vector_ && kernels::aligned16(params[k].data());
    }
    payload_ = payload;
    items_ = m * layout.block_count();
    block_sums_ = device_buffer<kernels::sums2>(layout.block_count());
    blocks_ = device_detail::upload<Space>(exec, layout.blocks(), layout.block_count());
    tensors_ = device_detail::upload<Space>(exec, tensors.data(), tensors.size());
    norms_ = device_detail::device_norms<Space>(exec, layout);
    std::vector<const std::byte*> payloads;
    std::vector<kernels::segment_ref> segments;
    for (std::size_t k = 0; k < m; ++k) {
      payloads.push_back(gathered + k * slot + wire::header_bytes);
      segments.push_back({payloads.back(), payload, 0, layout.block_count(), k * layout.block_count()});
    }
    const kernels::segment_ref own{send + wire::header_bytes, payload, 0, layout.block_count(), 0};
    payloads_ = device_detail::upload<Space>(exec, payloads.data(), m);
    gathered_segments_ = device_detail::upload<Space>(exec, segments.data(), m);
    send_segment_ = device_detail::upload<Space>(exec, &own, 1);
    segments_ = device_detail::device_segments<Codec, Space>(codec, m, slot, payload);
  }

  // The encode team program into `payload`, its checksum; its norm sums.
  template <class Exec>
  kernels::sums2 encode(Exec& exec, const Codec&, const block_layout& layout, const float* global,
                        const float* residual, float* next_residual, std::byte* payload, std::uint64_t stream,
                        float decay) {
    exec.run_teams(layout.block_count(),
                   kernels::topk_encode_blocks<Codec>{blocks_.data(), tensors_.data(), global, residual, next_residual,
                                                      payload, stream, block_sums_.data(), decay, vector_});
    segments_.checksums(exec, send_segment_.data(), 1, payload_);
    return norms_(exec, block_sums_.data(), 0, 1);
  }
  // Writes `h` with the checksum encode() found, on the host, and puts it into the segment at `seg`.
  template <class Exec>
  void seal(Exec& exec, std::byte* seg, const wire::header& h) {
    wire::write_header(segments_.host_header(0), h, segments_.checksum(0));
    segments_.put_headers(exec, seg, 1);
  }
  template <class Exec>
  void copy(Exec& exec, std::byte* dst, const std::byte* src, std::size_t bytes) {
    exec.copy(dst, src, bytes);
  }
  // The headers, checksums and first malformed chunks of the M segments in `gathered`, to the host.
  template <class Exec>
  void inspect(Exec& exec, std::byte* gathered) {
    segments_.inspect(exec, gathered, gathered_segments_.data(), items_, blocks_.data());
  }
  // validate_segment for rank k's segment, from what inspect() brought over.
  template <class Exec>
  wire::header check(Exec& exec, const Codec&, std::size_t k, const std::byte* gathered, std::size_t,
                     const wire::expectation& want, const block_layout& layout, const char* where, int world) {
    return segments_.check(exec, k, gathered, want, layout.blocks(), layout.block_count(), where, false, world);
  }
  // The payload table was uploaded once; a restored round reads the same slots.
  void point_at(const std::byte*, std::size_t) {}
  template <class Exec, class Update, class Merge>
  void decode_apply(Exec& exec, const Codec&, const block_layout& layout, int world, const Update& update,
                    float* global, float* state, std::size_t state_stride, const Merge& merge) {
    device_detail::require_aligned16(global, "theta_global");
    device_detail::require_aligned16(state, "the outer state");
    exec.run_teams(layout.block_count(),
                   kernels::topk_decode_apply_blocks<Codec, Update, Merge>{update, blocks_.data(), tensors_.data(),
                                                                           payloads_.data(), world, global, state,
                                                                           state_stride, merge});
  }

 private:
  std::size_t payload_ = 0;
  std::size_t items_ = 0;  // the blocks of the M gathered segments
  bool vector_ = false;  // 16-byte accesses to the replica's tensors
  device_buffer<compress::block_ref> blocks_;
  device_buffer<kernels::device_tensor> tensors_;
  device_buffer<kernels::sums2> block_sums_;
  device_buffer<const std::byte*> payloads_;
  device_buffer<kernels::segment_ref> gathered_segments_, send_segment_;
  device_detail::device_norms<Space> norms_;
  device_detail::device_segments<Codec, Space> segments_;
};

}  // namespace detail_gathered

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
/// codec's mean is exactly the mean of the decoded segments.
///
/// Written once over memory space Space: the protocol is here, the passes,
/// copies and segment inspection are detail_gathered::ops<codec, Space>
/// (host: fused host passes; device: team programs and device-side checks,
/// the same bytes on the wire, headers and norms included). Every buffer is
/// in Space; segments travel through the reducer's detail::wire_transport
/// (device views to a device communicator, pinned host staging for a host
/// one).
template <class Compressor, class Space>
class gathered_mean : public diloco::detail::feedback<Compressor, Space>,
                      public device_detail::space_ballot<Space> {
  // The feedback base comes first: with the ballot (a std::conditional_t)
  // first, nvcc's front end hands GCC the two base initializers in the
  // other order (-Wreorder).
  static constexpr bool on_device = !std::is_same_v<Space, host_space>;
  using ballot_type = device_detail::space_ballot<Space>;
  using feedback_type = diloco::detail::feedback<Compressor, Space>;

 public:
  using codec_type = typename Compressor::codec;  ///< the compressor's block codec

  /// The engine of one fragment over `params` in host memory, rank `rank` of `world`;
  /// `fragment` goes into every segment header.
  gathered_mean(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
                std::uint32_t fragment = 0)
    requires(!on_device)
      : gathered_mean(params, world, rank, opts, fragment, no_uploads{}) {}
  /// The same over device memory: `exec` uploads the engine's tables.
  template <class Exec>
  gathered_mean(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
                Exec& exec, std::uint32_t fragment = 0)
    requires(on_device)
      : gathered_mean(params, world, rank, opts, fragment, exec) {}

  /// The size of one segment slot: the header and the payload, rounded up to 64.
  std::size_t slot_bytes() const { return slot_; }
  // residual() and visit_state(): the error-feedback residual is the state
  // (diloco::detail::feedback); the rest is scratch.

  /// 1. encode the whole fragment into this rank's segment.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    if constexpr (on_device) device_detail::require_aligned16(global, "the point the pseudo-gradient is taken from");
    this->open_round();
    round_ = round;
    const std::uint64_t stream = kernels::make_stream(seed_, round, static_cast<std::uint64_t>(rank_), 1);
    const kernels::sums2 sums = ops_.encode(exec, codec_, layout_, global, this->committed_residual(),
                                            this->next_residual(), send_.data() + wire::header_bytes, stream, decay_);
    this->out_.delta_norm = std::sqrt(sums.a);
    this->out_.error_norm = std::sqrt(sums.b);
    ops_.seal(exec, send_.data(), expected(rank_, static_cast<float>(this->out_.delta_norm)));
    this->out_.encoded_bytes = wire::header_bytes + payload_;
  }

  ///@{
  /// 2. every rank's segment to every rank; a world of one copies.
  const std::byte* send_data() const { return send_.data(); }
  std::byte* gathered_data() { return gathered_.data(); }
  template <class Exec>
  void self_all_gather(Exec& exec) {
    ops_.copy(exec, gathered_.data(), send_.data(), slot_);
  }
  ///@}

  /// 3. validate every segment and cast this rank's vote into vote_data()
  /// (one slot per rank, in Space).
  template <class Exec>
  void check_gathered(Exec& exec) {
    auto& found = this->found_;
    ops_.inspect(exec, gathered_.data());
    double total = 0.0;
    for (int k = 0; k < world_ && found.local_problem.empty(); ++k) {
      const std::string where = diloco::detail::concat("gathered round ", round_, ", segment from rank ", k, " on rank ", rank_);
      try {
        const auto h = ops_.check(exec, codec_, static_cast<std::size_t>(k), gathered_.data(), slot_,
                                  wire::expectation::of(expected(k, 0.0f)), layout_, where.c_str(), world_);
        found.sender(h, k);
        total += h.norm;
      } catch (const format_error& e) {
        found.local_problem = e.what();
      }
    }
    // Finite norms whose sum overflows could still give a mean that does not
    // fit in fp32 (each decoded value is at most its sender's norm).
    if (found.local_problem.empty() && found.bad_senders.empty() && !(total <= std::numeric_limits<float>::max()))
      found.bad_shards = "all ranks together (sum of norms overflows fp32)";
    this->cast(exec, rank_);
  }
  // 4. agree on the round: vote_data() summed over the ranks, then result()
  // (the ballot).

  /// What step 5 reads once the round has completed, under `prefix`
  /// (checkpoints of a reduction in flight): every rank's segment and the
  /// residual it commits, in Space.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.bytes(prefix + "gathered", gathered_.data(), gathered_.size(), on_device);
    ops_.point_at(gathered_.data(), slot_);
    this->visit_next_residual(v, prefix);
  }

  /// 5. decode and sum in rank order, outer step, copy-back; keep the new
  /// residual.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    ops_.decode_apply(exec, codec_, layout_, world_, update, global, state, state_stride, merge);
    this->commit_residual();
  }

 private:
  struct no_uploads {};  // the host engine uploads nothing

  template <class Exec>
  gathered_mean(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
                std::uint32_t fragment, Exec&& exec)
      : feedback_type(params.total()),
        ballot_type(world),
        codec_(Compressor::make_codec(opts)),
        seed_(diloco::detail::stream_seed<Compressor>(opts, fragment)),
        decay_(feedback_decay(opts)),
        world_(world),
        rank_(rank),
        fragment_(fragment) {
    if constexpr (on_device) ops_type::require(params, world);
    std::vector<std::size_t> sizes;
    for (std::size_t k = 0; k < params.count(); ++k) sizes.push_back(params[k].size());
    layout_ = block_layout(sizes, codec_type::block, 1);
    payload_ = layout_.block_count() * codec_.stride();
    slot_ = (wire::header_bytes + payload_ + 63) / 64 * 64;
    send_ = buffer<std::byte, Space>(slot_);
    gathered_ = buffer<std::byte, Space>(static_cast<std::size_t>(world) * slot_);
    ops_.build(params, layout_, codec_, world, slot_, payload_, send_.data(), gathered_.data(), exec);
  }

  wire::header expected(int sender, float norm) const {
    return gathered_header<Compressor>(layout_.total(), payload_, round_, fragment_, sender, norm);
  }

  using ops_type = detail_gathered::ops<codec_type, Space>;

  codec_type codec_;
  std::uint64_t seed_;
  float decay_;
  int world_;
  int rank_;
  std::uint32_t fragment_;
  block_layout layout_;
  std::size_t payload_ = 0, slot_ = 0;
  buffer<std::byte, Space> send_, gathered_;
  ops_type ops_;
  std::uint64_t round_ = 0;
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
