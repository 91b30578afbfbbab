// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the decoder of compressed segments: arbitrary bytes
// must give a format_error or a successful decode, never a crash, a
// sanitizer report or an out-of-bounds read.
//
//   input[0]  selects the codec (fuzz/codecs.hpp); input[1] bit 0 selects
//             "fixed header" mode, bit 1 "plain" mode (low_rank's segments
//             of plain floats instead of a codec's blocks)
//   input[2..] the received slot (raw mode), or the payload under a valid,
//              freshly checksummed header (fixed mode), so the codecs'
//              structure checks and decoders see arbitrary payloads.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/codec/segment.hpp>
#include <vector>

#include "codecs.hpp"

namespace cp = diloco::compress;
namespace wire = diloco::wire;

namespace {

template <class Codec>
void run(const Codec& codec, const std::uint8_t* data, std::size_t size, bool fixed) {
  const fuzz::segment_shape<Codec> shape;
  const auto& blocks = shape.blocks;
  const std::size_t elements = shape.elements();
  const std::size_t payload = 2 * codec.stride();
  const wire::expectation want{Codec::id, 0, static_cast<std::uint32_t>(Codec::block), 1, elements, payload, 3};
  std::vector<std::byte> slot;
  if (fixed) {
    slot.assign(wire::header_bytes + payload, std::byte{0});
    std::memcpy(slot.data() + wire::header_bytes, data, std::min(size, payload));
    wire::header h;
    h.codec = Codec::id;
    h.block_size = static_cast<std::uint32_t>(Codec::block);
    h.sender = 1;
    h.elements = elements;
    h.payload_bytes = payload;
    h.round = 3;
    wire::write_header(slot.data(), h);
  } else {
    slot.resize(size);
    if (size) std::memcpy(slot.data(), data, size);
  }
  try {
    cp::validate_segment(codec, slot, want, blocks, 2, "fuzz", true, 4);
    if (slot.size() < wire::header_bytes + payload) return;  // a status segment: nothing to decode
    std::vector<float> out(Codec::block);
    for (std::size_t b = 0; b < 2; ++b)
      codec.decode(slot.data() + wire::header_bytes + b * codec.stride(), blocks[b].len, out.data());
  } catch (const diloco::format_error&) {
  }
}

// low_rank's factor segments: the header checks, then the floats summed as
// the reduction sums them.
void run_plain(const std::uint8_t* data, std::size_t size, bool fixed) {
  const wire::expectation want = fuzz::plain_expectation();
  std::vector<std::byte> slot;
  if (fixed) {
    slot.assign(wire::header_bytes + want.payload_bytes, std::byte{0});
    std::memcpy(slot.data() + wire::header_bytes, data, std::min<std::size_t>(size, want.payload_bytes));
    fuzz::write_plain_header(slot.data());
  } else {
    slot.resize(size);
    if (size) std::memcpy(slot.data(), data, size);
  }
  try {
    const auto h = cp::validate_plain_segment(slot.data(), slot.size(), want, "fuzz", [&](std::uint64_t bytes) {
      return wire::detail::payload_words_sum(slot.data() + wire::header_bytes, bytes);
    });
    std::vector<float> floats(h.payload_bytes / sizeof(float));
    if (!floats.empty()) std::memcpy(floats.data(), slot.data() + wire::header_bytes, h.payload_bytes);
    volatile float sum = 0.0f;
    for (float f : floats) sum = sum + f;
  } catch (const diloco::format_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const bool fixed = data[1] & 1, plain = data[1] & 2;
  data += 2;
  size -= 2;
  if (plain)
    run_plain(data, size, fixed);
  else
    fuzz::with_codec(data[-2], [&](const auto& codec) { run(codec, data, size, fixed); });
  return 0;
}
