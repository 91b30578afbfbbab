#pragma once

// Reading a received segment: the header against what is expected, the
// checksum, then the structure of every codec block, before anything is
// decoded (compress/wire_format.hpp has the layout).

#include <cstddef>
#include <span>

#include "diloco/compress/block_layout.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/compress/wire_format.hpp"
#include <cstring>

#include "diloco/core/error.hpp"

namespace diloco::compress {

// Validates `slot` as a segment of `nblocks` codec blocks (their lengths in
// `blocks`) and returns its header; format_error otherwise. With
// `allow_status`, a segment may carry a non-zero status and then no payload.
template <block_codec Codec>
wire::header validate_segment(const Codec& codec, std::span<const std::byte> slot, wire::expectation want,
                              const block_ref* blocks, std::size_t nblocks, const char* where, bool allow_status,
                              int world) {
  if (allow_status && slot.size() >= wire::header_bytes) {
    // A status segment is expected to carry no payload; the checksum, which
    // covers the status field, still has the last word.
    std::uint32_t status;
    std::memcpy(&status, slot.data() + 44, 4);
    if (status != 0) want.payload_bytes = 0;
  }
  const auto h = wire::read_header(slot, want, where);
  if (h.status != 0) {
    if (!allow_status) diloco::detail::raise<format_error>(where, ": unexpected status ", h.status);
    if (h.status > static_cast<std::uint32_t>(world)) diloco::detail::raise<format_error>(where, ": status ", h.status, " names no rank");
    return h;
  }
  const std::byte* payload = slot.data() + wire::header_bytes;
  const std::size_t stride = codec.stride();
  for (std::size_t b = 0; b < nblocks; ++b)
    if (const char* bad = codec.check(payload + b * stride, blocks[b].len))
      diloco::detail::raise<format_error>(where, ": block ", b, ": ", bad);
  return h;
}

}  // namespace diloco::compress
