// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reading a received segment: the header against what is expected, the
// checksum, then the structure of every codec block, before anything is
// decoded (codec/wire_format.hpp has the layout).

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "diloco/codec/block_layout.hpp"
#include "diloco/codec/block_codec.hpp"
#include "diloco/codec/wire_format.hpp"
#include <cstring>

#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// What a pass over a segment's codec blocks found: the first malformed
/// block and what is wrong with it, or index == the block count.
struct bad_block {
  std::size_t index;    ///< the first malformed block, or the block count when none is
  const char* problem;  ///< what is wrong with it (null when none is)
};

/// The first malformed block of a payload of `nblocks` codec blocks (their
/// lengths in `blocks`), by Codec::check: where the codec can say that a run
/// of whole blocks is clean in one pass (a static
/// whole_blocks_clean(first, count), codec/blockwise.hpp), each run of whole
/// blocks is tested at once, and check() names the problem only in a run
/// that has one; the same answer as check() block by block.
template <block_codec Codec>
bad_block first_bad_block(const Codec& codec, const std::byte* payload, const block_ref* blocks, std::size_t nblocks) {
  const std::size_t stride = codec.stride();
  std::size_t b = 0;
  if constexpr (requires(const std::byte* p) { { Codec::whole_blocks_clean(p, b) } -> std::same_as<bool>; }) {
    while (b < nblocks) {
      std::size_t end = b;
      while (end < nblocks && blocks[end].len == Codec::block) ++end;
      if (end > b && !Codec::whole_blocks_clean(payload + b * stride, end - b)) break;  // check() finds which
      b = end;
      if (b < nblocks) {
        if (const char* bad = codec.check(payload + b * stride, blocks[b].len)) return {b, bad};
        ++b;
      }
    }
  }
  for (; b < nblocks; ++b)
    if (const char* bad = codec.check(payload + b * stride, blocks[b].len)) return {b, bad};
  return {nblocks, nullptr};
}

/// What one pass over a payload of codec blocks found: payload_words_sum of
/// its bytes and its first malformed block (when the pass looked for one).
struct payload_scan {
  std::uint64_t sum = 0;                 ///< wire::detail::payload_words_sum of the payload
  bad_block bad{0, nullptr};             ///< the first malformed block, or index == the block count
};

namespace detail_segment {

/// Piece p of a payload of nblocks codec blocks (`stride` bytes each): its
/// blocks [p K, min((p + 1) K, nblocks)), K a multiple of 8 so that every
/// piece starts on a whole 64-bit word of the checksum; its words summed
/// and, with `check`, its blocks tested, while its bytes are in cache.
template <class Codec>
struct scan_piece {
  /// For exec::host's threshold: a piece (about 64 KiB) weighs as 2^13
  /// elements, so that four or more pieces run in parallel.
  static constexpr std::size_t elements_per_call = std::size_t{1} << 13;
  const Codec* codec;
  const std::byte* payload;
  const block_ref* blocks;
  std::size_t nblocks, piece_blocks;
  bool check;
  payload_scan* out;  ///< one per piece
  void operator()(std::size_t p) const {
    const std::size_t stride = codec->stride();
    const std::size_t first = p * piece_blocks;
    const std::size_t count = nblocks - first < piece_blocks ? nblocks - first : piece_blocks;
    const std::byte* at = payload + first * stride;
    payload_scan r;
    r.sum = checksum_words(at, count * stride, wire::header_bytes / 8 + first * stride / 8);
    r.bad = {nblocks, nullptr};
    if (check)
      if (const bad_block b = first_bad_block(*codec, at, blocks + first, count); b.index < count)
        r.bad = {first + b.index, b.problem};
    out[p] = r;
  }
};

/// Piece p (64 KiB, a whole number of 64-bit words) of a payload of n bytes: its words summed.
struct sum_piece {
  static constexpr std::size_t piece = std::size_t{1} << 16;
  /// For exec::host's threshold, as scan_piece's.
  static constexpr std::size_t elements_per_call = std::size_t{1} << 13;
  const std::byte* payload;
  std::size_t n;
  std::uint64_t* out;  ///< one per piece
  void operator()(std::size_t p) const {
    const std::size_t at = p * piece;
    out[p] = checksum_words(payload + at, n - at < piece ? n - at : piece, wire::header_bytes / 8 + at / 8);
  }
};

}  // namespace detail_segment

/// wire::detail::payload_words_sum of `bytes` bytes at `payload` in pieces of
/// 64 KiB spread over exec's threads (exec::host's for_each): the same sum.
template <class Exec>
std::uint64_t payload_words_sum(Exec& exec, const std::byte* payload, std::uint64_t bytes) {
  constexpr std::size_t piece = detail_segment::sum_piece::piece;
  const std::size_t n = static_cast<std::size_t>(bytes);
  const std::size_t pieces = (n + piece - 1) / piece;
  if (pieces <= 1) return wire::detail::payload_words_sum(payload, bytes);
  std::vector<std::uint64_t> sums(pieces);
  exec.for_each(pieces, detail_segment::sum_piece{payload, n, sums.data()});
  std::uint64_t total = 0;
  for (const std::uint64_t x : sums) total += x;
  return total;
}

/// payload_words_sum of a payload of nblocks codec blocks (nblocks * stride
/// bytes) and, with `check`, its first_bad_block, in one pass: the payload
/// is cut into pieces of whole blocks (about 64 KiB each), each read once
/// for both while it is in cache, the pieces spread over exec's threads
/// (exec::host's for_each). The same sum (a wrapping sum is the same in any
/// order) and the same first bad block as the two passes one after the other.
template <block_codec Codec, class Exec>
payload_scan scan_payload(Exec& exec, const Codec& codec, const std::byte* payload, const block_ref* blocks,
                          std::size_t nblocks, bool check) {
  const std::size_t stride = codec.stride();
  const std::size_t piece_blocks = 8 * (((std::size_t{1} << 16) / stride + 7) / 8);
  const std::size_t pieces = (nblocks + piece_blocks - 1) / piece_blocks;
  std::vector<payload_scan> found(pieces);
  const detail_segment::scan_piece<Codec> piece{&codec, payload, blocks, nblocks, piece_blocks, check, found.data()};
  exec.for_each(pieces, piece);  // on this thread below four pieces (scan_piece::elements_per_call)
  payload_scan total;
  total.bad = {nblocks, nullptr};
  for (const payload_scan& f : found) {
    total.sum += f.sum;
    if (total.bad.index == nblocks && f.bad.index < nblocks) total.bad = f.bad;
  }
  return total;
}

/// The checks of validate_segment for a segment whose header was copied to
/// `head` (from a slot of `slot_bytes` bytes) and whose payload may live
/// elsewhere: payload_sum(n) gives wire::detail::payload_words_sum of its
/// first n bytes, first_bad() the first malformed block (only called for a
/// segment that carries data). The device path computes both on the GPU.
template <class PayloadSum, class FirstBad>
wire::header validate_segment_parts(const std::byte* head, std::size_t slot_bytes, wire::expectation want,
                                    std::size_t nblocks, const char* where, bool allow_status, int world,
                                    PayloadSum&& payload_sum, FirstBad&& first_bad) {
  if (allow_status && slot_bytes >= wire::header_bytes) {
    // A status segment is expected to carry no payload; the checksum, which
    // covers the status field, still has the last word.
    std::uint32_t status;
    std::memcpy(&status, head + 44, 4);
    if (status != 0) want.payload_bytes = 0;
  }
  const auto h = wire::read_header(head, slot_bytes, want, where, payload_sum);
  if (h.status != 0) {
    if (!allow_status) diloco::detail::raise<format_error>(where, ": unexpected status ", h.status);
    if (h.status > static_cast<std::uint32_t>(world)) diloco::detail::raise<format_error>(where, ": status ", h.status, " names no rank");
    return h;
  }
  if (const bad_block bad = first_bad(); bad.index < nblocks)
    diloco::detail::raise<format_error>(where, ": block ", bad.index, ": ", bad.problem);
  return h;
}

/// validate_segment_parts for a segment of plain values (no codec blocks)
/// that never carries a status: low_rank's factors. payload_sum as above.
template <class PayloadSum>
wire::header validate_plain_segment(const std::byte* head, std::size_t slot_bytes, const wire::expectation& want,
                                    const char* where, PayloadSum&& payload_sum) {
  return validate_segment_parts(head, slot_bytes, want, 0, where, false, 1, payload_sum,
                                []() { return bad_block{0, nullptr}; });
}

/// Validates `slot` as a segment of `nblocks` codec blocks (their lengths in
/// `blocks`) and returns its header; format_error otherwise. With
/// `allow_status`, a segment may carry a non-zero status and then no payload.
template <block_codec Codec>
wire::header validate_segment(const Codec& codec, std::span<const std::byte> slot, wire::expectation want,
                              const block_ref* blocks, std::size_t nblocks, const char* where, bool allow_status,
                              int world) {
  // The payload is addressed only once the header said the slot holds it.
  return validate_segment_parts(
      slot.data(), slot.size(), want, nblocks, where, allow_status, world,
      [&](std::uint64_t bytes) { return wire::detail::payload_words_sum(slot.data() + wire::header_bytes, bytes); },
      [&]() -> bad_block { return first_bad_block(codec, slot.data() + wire::header_bytes, blocks, nblocks); });
}

/// validate_segment with the payload's checksum and structure check in one
/// pass on exec's threads (scan_payload), where the header's payload length
/// is that of the nblocks blocks; the same header, the same errors in the
/// same order (a checksum mismatch before a malformed block).
template <block_codec Codec, class Exec>
wire::header validate_segment(Exec& exec, const Codec& codec, std::span<const std::byte> slot, wire::expectation want,
                              const block_ref* blocks, std::size_t nblocks, const char* where, bool allow_status,
                              int world) {
  const std::byte* payload = slot.data() + wire::header_bytes;
  bool scanned = false;
  bad_block found{nblocks, nullptr};
  return validate_segment_parts(
      slot.data(), slot.size(), want, nblocks, where, allow_status, world,
      [&](std::uint64_t bytes) -> std::uint64_t {
        if (nblocks == 0 || bytes != static_cast<std::uint64_t>(nblocks) * codec.stride())
          return wire::detail::payload_words_sum(payload, bytes);
        const payload_scan r = scan_payload(exec, codec, payload, blocks, nblocks, true);
        scanned = true;
        found = r.bad;
        return r.sum;
      },
      [&]() -> bad_block { return scanned ? found : first_bad_block(codec, payload, blocks, nblocks); });
}

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
