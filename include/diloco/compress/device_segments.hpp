// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the engines over device memory (compressed_mean.hpp's and
// gathered_mean.hpp's device operations, low_rank.hpp) share around their
// passes: the norms of a pass summed in the host executor's order, and the
// segments' headers, payload checksums and structure checks, computed on
// the device with only headers and a few numbers coming to the host, where
// headers are written and validated as the host engines do
// (wire_format.hpp, segment.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "diloco/codec/block_layout.hpp"
#include "diloco/compress/round_state.hpp"
#include "diloco/codec/segment.hpp"
#include "diloco/codec/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/kernels/wire_passes.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress::device_detail {

// The device passes read and write the library's flat buffers (theta_global
// or the anchor, the residual, the outer state) 16 bytes at a time at every
// block start (kernels/compressed_blocks.hpp's load_group(..., true)): the
// flat layout pads every tensor to 64 bytes and cudaMalloc aligns the
// bases, so this always holds; a violation is a library bug, named here
// instead of a misaligned-address fault inside a kernel.
inline void require_aligned16(const float* p, const char* what) {
  if (p != nullptr && !kernels::aligned16(p))
    diloco::detail::raise<state_error>("device compressed round: ", what, " (address ",
                                       reinterpret_cast<std::uintptr_t>(p), ") is not 16-byte aligned; the block "
                                       "passes load it 16 bytes at a time");
}
template <class Space>
void require_aligned_offsets(const parameter_set<float, Space>& params) {
  for (std::size_t k = 0; k < params.count(); ++k)
    if (params.offset(k) % kernels::vec_width != 0)
      diloco::detail::raise<state_error>("device compressed round: tensor ", k, " starts at flat offset ",
                                         params.offset(k), ", not a multiple of ", kernels::vec_width,
                                         " floats; the block passes need 16-byte aligned blocks");
}

template <class Space, class Exec, class T>
buffer<T, Space> upload(Exec& exec, const T* host, std::size_t n) {
  buffer<T, Space> d(n);
  exec.from_host(d.data(), host, n);
  return d;
}

// The per-block sums a pass wrote (kernels::sums2 per layout block), reduced
// as exec::host::transform_reduce reduces a pass over each shard's blocks:
// in chunks of reduce_chunk blocks, 8 lanes per chunk (on the device), the
// lanes pairwise and the chunks in order (here), the shards in order.
template <class Space>
class device_norms {
 public:
  device_norms() = default;
  template <class Exec>
  device_norms(Exec& exec, const block_layout& layout) {
    std::vector<kernels::chunk_ref> chunks;
    for (int s = 0; s < layout.shards(); ++s) {
      shard_chunks_.push_back(chunks.size());
      const std::size_t end = layout.first_block(s) + layout.blocks_in(s);
      for (std::size_t b = layout.first_block(s); b < end; b += diloco::exec::host::reduce_chunk)
        chunks.push_back({b, std::min(end, b + diloco::exec::host::reduce_chunk)});
    }
    shard_chunks_.push_back(chunks.size());
    chunks_ = upload<Space>(exec, chunks.data(), chunks.size());
    lanes_ = buffer<kernels::sums2, Space>(chunks.size() * lanes);
    host_lanes_ = host_buffer<kernels::sums2>(chunks.size() * lanes);
  }

  // The sums of shards [first, last).
  template <class Exec>
  kernels::sums2 operator()(Exec& exec, const kernels::sums2* block_sums, int first, int last) {
    const std::size_t c0 = shard_chunks_[static_cast<std::size_t>(first)];
    const std::size_t c1 = shard_chunks_[static_cast<std::size_t>(last)];
    exec.for_each((c1 - c0) * lanes,
                  kernels::chunk_lane_sums{block_sums, chunks_.data() + c0, lanes_.data() + c0 * lanes});
    exec.to_host(host_lanes_.data() + c0 * lanes, lanes_.data() + c0 * lanes, (c1 - c0) * lanes);
    kernels::sums2 total;
    for (int s = first; s < last; ++s) {
      kernels::sums2 shard;
      for (std::size_t c = shard_chunks_[static_cast<std::size_t>(s)]; c < shard_chunks_[static_cast<std::size_t>(s) + 1];
           ++c) {
        kernels::sums2 lane[lanes];
        for (std::size_t l = 0; l < lanes; ++l) lane[l] = host_lanes_[c * lanes + l];
        for (std::size_t width = lanes / 2; width > 0; width /= 2)
          for (std::size_t l = 0; l < width; ++l) lane[l] += lane[l + width];
        shard += lane[0];
      }
      total += shard;
    }
    return total;
  }

 private:
  static constexpr std::size_t lanes = kernels::chunk_lane_sums::lanes_per_chunk;
  buffer<kernels::chunk_ref, Space> chunks_;
  buffer<kernels::sums2, Space> lanes_;
  host_buffer<kernels::sums2> host_lanes_;
  std::vector<std::size_t> shard_chunks_;  // first chunk of each shard, and the total
};

// Up to `count` segments at a time in slots of `slot_bytes` of device
// memory: their payload checksums and their headers (written on the host
// and copied in, or copied out and validated there). Codec-free: low_rank's
// segments of floats use it as it is (compress/low_rank.hpp),
// device_segments adds the codec's block checks.
template <class Space>
class device_headers {
 public:
  static constexpr std::size_t header_words = wire::header_bytes / 4;

  device_headers() = default;
  // `results_per_segment`: 64-bit words the device writes per segment (the
  // checksum sum first).
  device_headers(std::size_t count, std::size_t slot_bytes, std::size_t max_payload, std::size_t results_per_segment = 1)
      : count_(count),
        slot_(slot_bytes),
        max_payload_(max_payload),
        headers_(count * wire::header_bytes),
        host_headers_(count * wire::header_bytes),
        results_(results_per_segment * count),
        host_results_(results_per_segment * count) {}

  // The payload checksum sums of the first n segments of `table`, on the
  // host: checksum(k).
  template <class Exec>
  void checksums(Exec& exec, const kernels::segment_ref* table, std::size_t n, std::size_t max_payload) {
    exec.checksum_segments(table, n, max_payload, results_.data());
    exec.to_host(host_results_.data(), results_.data(), n);
  }
  std::uint64_t checksum(std::size_t k) const { return host_results_[k]; }

  // Header k, on the host, to be written (wire::write_header) and then put
  // into the first n slots at `slots` by put_headers().
  std::byte* host_header(std::size_t k) { return host_headers_.data() + k * wire::header_bytes; }
  template <class Exec>
  void put_headers(Exec& exec, std::byte* slots, std::size_t n) {
    exec.from_host(headers_.data(), host_headers_.data(), n * wire::header_bytes);
    exec.for_each(n * header_words, kernels::copy_headers{headers_.data(), wire::header_bytes, slots, slot_});
  }

  // Brings the headers of the `count` segments in the slots at `slots` (as
  // `table` describes their payloads) to the host, with their payload
  // checksum sums.
  template <class Exec>
  void inspect(Exec& exec, std::byte* slots, const kernels::segment_ref* table) {
    start_inspect(exec, slots, table);
    finish_inspect(exec, 1);
  }

  // validate_plain_segment for segment k (no codec blocks, no status:
  // low_rank's), from what inspect() brought to the host.
  wire::header check(std::size_t k, const wire::expectation& want, const char* where) const {
    return validate_plain_segment(host_headers_.data() + k * wire::header_bytes, slot_, want, where,
                                  [&](std::uint64_t bytes) { return bytes == 0 ? std::uint64_t{0} : host_results_[k]; });
  }

 protected:
  // inspect() in two parts, the codec's checks between them: the headers to
  // a contiguous device area and the checksum sums into results_[0, count);
  // then everything to the host (`results_per_segment` words per segment).
  template <class Exec>
  void start_inspect(Exec& exec, std::byte* slots, const kernels::segment_ref* table) {
    exec.for_each(count_ * header_words, kernels::copy_headers{slots, slot_, headers_.data(), wire::header_bytes});
    exec.checksum_segments(table, count_, max_payload_, results_.data());
  }
  template <class Exec>
  void finish_inspect(Exec& exec, std::size_t results_per_segment) {
    exec.to_host(host_headers_.data(), headers_.data(), count_ * wire::header_bytes);
    exec.to_host(host_results_.data(), results_.data(), results_per_segment * count_);
  }

  std::size_t count_ = 0, slot_ = 0, max_payload_ = 0;
  buffer<std::byte, Space> headers_;
  host_buffer<std::byte> host_headers_;
  buffer<std::uint64_t, Space> results_;  // checksum sums, then what a derived class adds
  host_buffer<std::uint64_t> host_results_;
};

// device_headers for segments of codec blocks: inspect() also finds the
// first malformed block of each segment (on the device with an atomic min;
// only that block comes to the host, to name its problem).
template <class Codec, class Space>
class device_segments : public device_headers<Space> {
  using base = device_headers<Space>;

 public:
  device_segments() = default;
  device_segments(const Codec& codec, std::size_t count, std::size_t slot_bytes, std::size_t max_payload)
      : base(count, slot_bytes, max_payload, 2), codec_(codec), bad_block_bytes_(Codec::stride()) {}

  // The headers, checksum sums and first malformed blocks of the `count`
  // segments in the slots at `slots` to the host (`items`: the blocks of
  // all of them together, as `table` numbers them).
  template <class Exec>
  void inspect(Exec& exec, std::byte* slots, const kernels::segment_ref* table, std::size_t items,
               const compress::block_ref* blocks) {
    this->start_inspect(exec, slots, table);
    exec.for_each(this->count_, kernels::fill_words{this->results_.data() + this->count_, ~std::uint64_t{0}});
    using check = kernels::check_blocks<Codec>;
    exec.for_each(check::items(items),
                  check{codec_, table, this->count_, blocks, this->results_.data() + this->count_});
    this->finish_inspect(exec, 2);
  }

  // validate_segment for segment k (in slots at `slots`), from what
  // inspect() brought to the host; `blocks` are the nblocks host-side block
  // refs of the shard it carries. A malformed block is copied over to name
  // its problem.
  template <class Exec>
  wire::header check(Exec& exec, std::size_t k, const std::byte* slots, const wire::expectation& want,
                     const compress::block_ref* blocks, std::size_t nblocks, const char* where, bool allow_status,
                     int world) {
    return validate_segment_parts(
        this->host_headers_.data() + k * wire::header_bytes, this->slot_, want, nblocks, where, allow_status, world,
        [&](std::uint64_t bytes) { return bytes == 0 ? std::uint64_t{0} : this->host_results_[k]; },
        [&]() -> bad_block {
          const std::uint64_t b = this->host_results_[this->count_ + k];
          if (b >= nblocks) return {nblocks, nullptr};
          exec.to_host(bad_block_bytes_.data(), slots + k * this->slot_ + wire::header_bytes + b * Codec::stride(),
                       Codec::stride());
          const char* why = codec_.check(bad_block_bytes_.data(), blocks[b].len);
          return {static_cast<std::size_t>(b), why != nullptr ? why : "malformed (found by the device check)"};
        });
  }

 private:
  Codec codec_{};
  host_buffer<std::byte> bad_block_bytes_;
};

// A device engine's part of the round's agreement (host_ballot's twin):
// what this rank found (found_), its result so far (out_), and the M vote
// slots in device memory that the reducer's all-reduce sums.
template <class Space>
class device_ballot {
 public:
  float* vote_data() { return device_votes_.data(); }
  std::size_t vote_count() const { return votes_.size(); }
  // The round's outcome, once the votes are summed.
  template <class Exec>
  exchange_result result(Exec& exec) {
    exec.to_host(votes_.data(), device_votes_.data(), votes_.size());
    exchange_result out = out_;
    found_.read(votes_, out);
    return out;
  }

 protected:
  explicit device_ballot(int world)
      : device_votes_(static_cast<std::size_t>(world)), votes_(static_cast<std::size_t>(world), 0.0f) {}
  void open_round() {
    out_ = {};
    found_ = {};
  }
  // This rank's vote in its slot, zeros elsewhere, into device memory.
  template <class Exec>
  void cast(Exec& exec, int rank) {
    std::fill(votes_.begin(), votes_.end(), 0.0f);
    votes_[static_cast<std::size_t>(rank)] = found_.vote();
    exec.from_host(device_votes_.data(), votes_.data(), votes_.size());
  }
  exchange_result out_;
  diloco::detail::round_findings found_;

 private:
  buffer<float, Space> device_votes_;
  std::vector<float> votes_;
};

// The ballot of an engine over memory space Space.
template <class Space>
using space_ballot =
    std::conditional_t<std::is_same_v<Space, host_space>, diloco::detail::host_ballot, device_ballot<Space>>;

}  // namespace diloco::compress::device_detail

DILOCO_EXACT_FP_END
