// SPDX-License-Identifier: Apache-2.0
// Writes the wire-decoder fuzzer's seeds into a directory: for every codec
// of fuzz/codecs.hpp, a well-formed segment (header and payload, raw mode)
// and its payload alone (fixed-header mode), encoded from ordinary values,
// so that the fuzzer starts from inputs that pass the checks and reach the
// decoders instead of having to discover the header format.
//   make_seeds DIR
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <diloco/codec/segment.hpp>

#include "codecs.hpp"

namespace wire = diloco::wire;

namespace {

void write(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (unsigned c = 0; c < fuzz::codec_count; ++c) {
    fuzz::with_codec(c, [&](const auto& codec) {
      using Codec = std::decay_t<decltype(codec)>;
      const fuzz::segment_shape<Codec> shape;
      const std::size_t payload = 2 * codec.stride();
      std::vector<std::byte> slot(wire::header_bytes + payload);
      std::vector<float> v(Codec::block), dq(Codec::block);
      for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t j = 0; j < v.size(); ++j)
          v[j] = std::sin(0.7f * static_cast<float>(j + b * 31)) * static_cast<float>(1 + j % 5);
        codec.encode(v.data(), shape.blocks[b].len, slot.data() + wire::header_bytes + b * codec.stride(), dq.data(),
                     1, 0);
      }
      wire::header h;
      h.codec = Codec::id;
      h.block_size = static_cast<std::uint32_t>(Codec::block);
      h.sender = 1;
      h.elements = shape.elements();
      h.payload_bytes = payload;
      h.round = 3;
      wire::write_header(slot.data(), h);
      // A seed that does not pass the checks would not reach the decoders.
      const wire::expectation want{Codec::id, 0, static_cast<std::uint32_t>(Codec::block), 1, shape.elements(),
                                   payload, 3};
      try {
        fuzz::cp::validate_segment(codec, slot, want, shape.blocks, 2, "seed", true, 4);
      } catch (const diloco::format_error& e) {
        std::fprintf(stderr, "make_seeds: the seed of codec %u is rejected: %s\n", c, e.what());
        std::exit(1);
      }
      // Byte 0 selects the codec, byte 1 the mode (bit 0: fixed header).
      std::vector<std::byte> raw{std::byte(c), std::byte{0}};
      raw.insert(raw.end(), slot.begin(), slot.end());
      write(dir + "/codec" + std::to_string(c) + "-segment", raw);
      std::vector<std::byte> fixed{std::byte(c), std::byte{1}};
      fixed.insert(fixed.end(), slot.begin() + static_cast<std::ptrdiff_t>(wire::header_bytes), slot.end());
      write(dir + "/codec" + std::to_string(c) + "-payload", fixed);
    });
  }
  // low_rank's plain segment (input[1] bit 1): header + floats, and the
  // floats alone.
  const wire::expectation want = fuzz::plain_expectation();
  std::vector<std::byte> slot(wire::header_bytes + want.payload_bytes);
  for (std::size_t i = 0; i < fuzz::plain_floats; ++i) {
    const float v = std::cos(0.3f * static_cast<float>(i));
    std::memcpy(slot.data() + wire::header_bytes + i * sizeof(float), &v, sizeof v);
  }
  fuzz::write_plain_header(slot.data());
  try {
    fuzz::cp::validate_plain_segment(slot.data(), slot.size(), want, "seed", [&](std::uint64_t bytes) {
      return wire::detail::payload_words_sum(slot.data() + wire::header_bytes, bytes);
    });
  } catch (const diloco::format_error& e) {
    std::fprintf(stderr, "make_seeds: the low_rank seed is rejected: %s\n", e.what());
    std::exit(1);
  }
  std::vector<std::byte> raw{std::byte{0}, std::byte{2}};
  raw.insert(raw.end(), slot.begin(), slot.end());
  write(dir + "/low_rank-segment", raw);
  std::vector<std::byte> fixed{std::byte{0}, std::byte{3}};
  fixed.insert(fixed.end(), slot.begin() + static_cast<std::ptrdiff_t>(wire::header_bytes), slot.end());
  write(dir + "/low_rank-payload", fixed);
  return 0;
}
