// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reading a received segment: the header against what is expected, the
// checksum, then the structure of every codec block, before anything is
// decoded (codec/wire_format.hpp has the layout).

#include <concepts>
#include <cstddef>
#include <span>

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

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
