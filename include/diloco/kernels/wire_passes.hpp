// SPDX-License-Identifier: Apache-2.0
#pragma once

// The small device passes around the compressed round's fused ones: the
// payload checksum, the codec's structure check, moving 64-byte headers
// between segments and a contiguous staging area, and the norms' chunked
// sums. Plain DILOCO_HD code: exec::cuda runs it on the GPU, the host tests
// replay it (test/cuda_grid_sim.hpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/codec/block_layout.hpp"
#include "diloco/codec/wire_format.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/kernels/codec_elements.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/core/random.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// One segment's payload in device memory, and its codec blocks.
struct segment_ref {
  const std::byte* payload;     ///< 16-byte aligned
  std::uint64_t payload_bytes;  ///< the length the receiver expects
  std::uint64_t first_block;    ///< its first block in the layout
  std::uint64_t blocks;         ///< its codec blocks
  std::uint64_t item_begin;     ///< its first item in a pass over several segments' blocks
};

/// Thread `thread` of `threads`' share of a payload's checksum sum
/// (wire::detail::payload_words_sum): a wrapping sum of one term per 8-byte
/// word, so shares add up in any order to the same value. Threads take the
/// words two at a time (one 16-byte load; payloads are 16-byte aligned);
/// thread 0 also takes the last word, and the zero-padded tail, if any.
DILOCO_HD DILOCO_FORCEINLINE std::uint64_t checksum_share(const segment_ref& s, std::size_t thread,
                                                          std::size_t threads) {
  constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ULL;
  constexpr std::uint64_t first_word = wire::header_bytes / 8;  // payload words follow the header's
  auto term = [&](std::uint64_t w, std::size_t i) { return mix64(w + (first_word + i + 1) * golden); };
  const std::size_t bytes = static_cast<std::size_t>(s.payload_bytes);
  const std::size_t pairs = bytes / 16;
  std::uint64_t sum = 0;
  for (std::size_t p = thread; p < pairs; p += threads) {
    std::uint64_t w[2];
#if defined(__CUDA_ARCH__)
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(s.payload + 16 * p));
    w[0] = static_cast<std::uint64_t>(v.x) | static_cast<std::uint64_t>(v.y) << 32;
    w[1] = static_cast<std::uint64_t>(v.z) | static_cast<std::uint64_t>(v.w) << 32;
#else
    std::memcpy(w, s.payload + 16 * p, 16);
#endif
    sum += term(w[0], 2 * p) + term(w[1], 2 * p + 1);
  }
  if (thread == 0) {
    for (std::size_t i = 2 * pairs; 8 * i < bytes; ++i) {
      std::uint64_t w = 0;
      std::memcpy(&w, s.payload + 8 * i, bytes - 8 * i < 8 ? bytes - 8 * i : 8);
      sum += term(w, i);
    }
  }
  return sum;
}

/// *p = min(*p, v), atomically.
DILOCO_HD DILOCO_FORCEINLINE void atomic_min(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  atomicMin(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  std::atomic_ref<std::uint64_t> a(*p);
  std::uint64_t cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
#endif
}

/// The segment that owns item i: the last with item_begin <= i (segments
/// are sorted by item_begin; empty ones own nothing).
DILOCO_HD DILOCO_FORCEINLINE std::size_t segment_of(const segment_ref* segs, std::size_t count, std::size_t i) {
  std::size_t lo = 0, hi = count;
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (segs[mid].item_begin <= i)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/// codec.check of every block of several segments, a team of `team`
/// consecutive items per block (so a team is part of one warp: the
/// launcher's threads take items in order): thread t of block i's team
/// checks its share (codec.share_malformed: bytes or entries t, t + team,
/// ..., so a warp's loads are contiguous), or, for a codec without shares,
/// thread 0 runs codec.check. first_bad[k] becomes the lowest malformed block
/// index of segment k (initialized to ~0 by the caller), which the host then
/// names with codec.check. Launch it over items(blocks) items.
template <class Codec>
struct check_blocks {
  Codec codec;                        ///< the codec the segments were written with
  const segment_ref* segments;        ///< the segments, in item order
  std::size_t count;                  ///< how many
  const compress::block_ref* blocks;  ///< the layout's blocks
  std::uint64_t* first_bad;           ///< first_bad[k]: segment k's lowest malformed block (~0 when none)

  /// Whether the codec splits check() among a team (share_malformed).
  static constexpr bool shared_scan = requires(const Codec& c, const std::byte* in, std::size_t n) {
    c.share_malformed(in, n, n, n);
  };
  /// Threads per block: a power of two, about one per 4 bytes of the
  /// encoded block, at most a warp.
  static constexpr std::size_t team = [] {
    std::size_t t = 1;
    while (shared_scan && t < 32 && 4 * t < Codec::stride()) t *= 2;
    return t;
  }();
  /// The items of a launch over `nblocks` blocks (`team` per block).
  static constexpr std::size_t items(std::size_t nblocks) { return nblocks * team; }

  /// Item i: thread i % team of block i / team's team.
  DILOCO_HD void operator()(std::size_t i) const {
    const std::size_t item = i / team, t = i % team;
    const std::size_t k = segment_of(segments, count, item);
    const segment_ref s = segments[k];
    const std::size_t b = item - static_cast<std::size_t>(s.item_begin);
    if (b >= s.blocks) return;
    const std::byte* in = s.payload + b * Codec::stride();
    const std::size_t len = blocks[s.first_block + b].len;
    bool bad;
    if constexpr (shared_scan)
      bad = codec.share_malformed(in, len, t, team);
    else
      bad = codec.check(in, len) != nullptr;
    if (bad) atomic_min(first_bad + k, b);
  }
};

/// Copies 64-byte headers: header k from src + k * src_stride to
/// dst + k * dst_stride, one 4-byte word per item (16 per header).
struct copy_headers {
  const std::byte* src;    ///< the first header
  std::size_t src_stride;  ///< bytes between consecutive headers in src
  std::byte* dst;          ///< where the first goes
  std::size_t dst_stride;  ///< bytes between consecutive headers in dst

  /// Item i: word i % 16 of header i / 16.
  DILOCO_HD void operator()(std::size_t i) const {
    constexpr std::size_t words = wire::header_bytes / 4;
    const std::size_t k = i / words, w = i % words;
    unsigned char b[4];
    load_bytes<4>(src + k * src_stride + 4 * w, b);
    store_bytes<4>(dst + k * dst_stride + 4 * w, b);
  }
};

/// p[i] = value: 8-byte words set (the first_bad slots before a check).
struct fill_words {
  std::uint64_t* p;     ///< the words written
  std::uint64_t value;  ///< the value written
  /// Item i.
  DILOCO_HD void operator()(std::size_t i) const { p[i] = value; }
};

/// A run of at most exec::host::reduce_chunk consecutive blocks of one
/// shard: the host executor's reduction chunk over that shard's blocks.
struct chunk_ref {
  std::uint64_t begin;  ///< its first block
  std::uint64_t end;    ///< one past its last block
};

/// Lane l of chunk c (item 8c + l): the sum of the block sums of blocks
/// begin + l, begin + l + 8, ... in order, as exec::host::chunk_sum's lanes
/// accumulate them. The host adds the 8 lanes pairwise and the chunks in
/// order, which gives exec::host::transform_reduce's bits.
struct chunk_lane_sums {
  const sums2* block_sums;  ///< by layout block index
  const chunk_ref* chunks;  ///< chunks[c]: chunk c's blocks
  sums2* lanes;             ///< lanes[8c + l]: lane l of chunk c

  static constexpr std::size_t lanes_per_chunk = 8;  ///< lanes per chunk, as exec::host::reduce_lanes

  /// Item i: lane i % 8 of chunk i / 8.
  DILOCO_HD void operator()(std::size_t i) const {
    const chunk_ref c = chunks[i / lanes_per_chunk];
    sums2 acc;
    for (std::uint64_t b = c.begin + i % lanes_per_chunk; b < c.end; b += lanes_per_chunk) acc += block_sums[b];
    lanes[i] = acc;
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
