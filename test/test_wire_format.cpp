// SPDX-License-Identifier: Apache-2.0
// Every corruption of a compressed segment is a format_error: each header
// field, the checksum, the payload, truncation at every length.
#include <doctest/doctest.h>

#include <cstring>
#include <diloco/diloco.hpp>
#include <string>
#include <vector>

namespace dc = diloco;
namespace cp = diloco::compress;
namespace wire = diloco::wire;

namespace {

// A valid segment: 3 int8 blocks of 16 (the last one partial) and its header.
struct segment {
  std::vector<std::byte> bytes;
  wire::expectation want;
};

segment make_segment() {
  using codec = cp::blockwise_codec<dc::int8, 16, cp::round_nearest>;
  const std::size_t lens[] = {16, 16, 5};
  segment s;
  s.bytes.resize(wire::header_bytes + 3 * codec::stride());
  std::vector<float> v(16), dq(16);
  for (std::size_t b = 0; b < 3; ++b) {
    for (std::size_t j = 0; j < 16; ++j) v[j] = static_cast<float>(b * 16 + j) * 0.25f - 3.0f;
    codec{}.encode(v.data(), lens[b], s.bytes.data() + wire::header_bytes + b * codec::stride(), dq.data(), 0, 0);
  }
  wire::header h;
  h.codec = cp::codec_id::int8;
  h.flags = wire::flag_error_feedback;
  h.block_size = 16;
  h.sender = 2;
  h.elements = 37;
  h.payload_bytes = 3 * codec::stride();
  h.round = 9;
  h.norm = 1.5f;
  wire::write_header(s.bytes.data(), h);
  s.want = {cp::codec_id::int8, wire::flag_error_feedback, 16, 2, 37, 3 * codec::stride(), 9};
  return s;
}

}  // namespace

TEST_CASE("a valid segment reads back its header") {
  const auto s = make_segment();
  const auto h = wire::read_header(s.bytes, s.want, "test");
  CHECK(h.norm == 1.5f);
  CHECK(h.status == 0);
  CHECK(h.round == 9);
  // Padding after the segment in a larger slot is fine.
  auto padded = s.bytes;
  padded.resize(padded.size() + 40, std::byte{0});
  CHECK_NOTHROW(wire::read_header(padded, s.want, "test"));
}

TEST_CASE("flipping any bit of the header or payload is a format_error") {
  const auto s = make_segment();
  for (std::size_t byte = 0; byte < s.bytes.size(); ++byte) {
    for (int bit = 0; bit < 8; bit += 3) {
      auto bad = s.bytes;
      bad[byte] ^= static_cast<std::byte>(1u << bit);
      CAPTURE(byte);
      CAPTURE(bit);
      CHECK_THROWS_AS(wire::read_header(bad, s.want, "test"), dc::format_error);
    }
  }
}

TEST_CASE("each header field names itself when wrong") {
  const auto s = make_segment();
  struct field_case {
    std::size_t offset;
    std::size_t size;
    const char* message;
  };
  const field_case fields[] = {{0, 4, "bad magic"},          {4, 2, "unsupported version"}, {6, 1, "codec id"},
                               {7, 1, "flags"},              {8, 4, "block size"},          {12, 4, "sender rank"},
                               {16, 8, "element count"},     {24, 8, "payload length"},     {32, 8, "round"},
                               {40, 4, "checksum mismatch"}, {44, 4, "payload length"},     {48, 8, "checksum mismatch"},
                               {56, 4, "fragment 1 (expected 0)"}, {60, 4, "reserved header byte"}};
  for (const auto& f : fields) {
    CAPTURE(f.offset);
    auto bad = s.bytes;
    bad[f.offset] ^= std::byte{0x01};  // the field's lowest byte changes by one
    CHECK_THROWS_WITH_AS(wire::read_header(bad, s.want, "test"), doctest::Contains(f.message), dc::format_error);
  }
}

TEST_CASE("a segment truncated at any length is a format_error") {
  const auto s = make_segment();
  for (std::size_t len = 0; len < s.bytes.size(); ++len) {
    CAPTURE(len);
    const std::span<const std::byte> cut(s.bytes.data(), len);
    CHECK_THROWS_WITH_AS(wire::read_header(cut, s.want, "test"), doctest::Contains("truncated"), dc::format_error);
  }
}

TEST_CASE("a segment that is valid but not the expected one is a format_error") {
  const auto s = make_segment();
  auto want = s.want;
  want.round = 10;
  CHECK_THROWS_WITH_AS(wire::read_header(s.bytes, want, "test"), doctest::Contains("stale or future"), dc::format_error);
  want = s.want;
  want.sender = 1;
  CHECK_THROWS_WITH_AS(wire::read_header(s.bytes, want, "test"), doctest::Contains("sender rank 2 (expected 1)"),
                       dc::format_error);
  want = s.want;
  want.fragment = 3;
  CHECK_THROWS_WITH_AS(wire::read_header(s.bytes, want, "test"),
                       doctest::Contains("fragment 0 (expected 3): a segment of another fragment's reduction"),
                       dc::format_error);
  want = s.want;
  want.codec = cp::codec_id::int4;
  CHECK_THROWS_AS(wire::read_header(s.bytes, want, "test"), dc::format_error);
}

// check() on a whole block against the definition, code by code: a block
// is refused iff one of its codes is one the format never writes (int8's
// -128, int4's -8; int2 writes all four). Whole blocks are scanned a word at
// a time, so every position of the bad code, alone and beside others, and
// blocks of every other code, are tried.
template <class Format, std::size_t B>
void check_whole_blocks_against_codes() {
  using codec = cp::blockwise_codec<Format, B, cp::round_nearest>;
  constexpr auto g = dc::kernels::grid<Format>();
  constexpr unsigned codes = 1u << Format::bits;
  const float one = 1.0f;
  std::vector<std::byte> block(codec::stride(), std::byte{0});
  std::memcpy(block.data(), &one, 4);
  auto put = [&](std::size_t j, unsigned c) {
    auto& byte = block[4 + j / codec::per_byte];
    const unsigned shift = static_cast<unsigned>((j % codec::per_byte) * codec::bits);
    byte = static_cast<std::byte>((static_cast<unsigned>(byte) & ~(codec::mask << shift)) | (c << shift));
  };
  auto fill = [&](unsigned c) {
    for (std::size_t j = 0; j < B; ++j) put(j, c);
  };
  for (unsigned c = 0; c < codes; ++c) {
    fill(c);
    CAPTURE(c);
    CHECK((codec{}.check(block.data(), B) == nullptr) == g.valid(c));
  }
  for (unsigned bad = 0; bad < codes; ++bad) {
    if (g.valid(bad)) continue;
    for (unsigned filler = 0; filler < codes; ++filler) {
      if (!g.valid(filler)) continue;
      for (std::size_t j = 0; j < B; ++j) {
        fill(filler);
        put(j, bad);
        CAPTURE(filler);
        CAPTURE(j);
        const char* why = codec{}.check(block.data(), B);
        REQUIRE(why != nullptr);
        CHECK(std::string(why) == g.invalid);
      }
    }
  }
}

TEST_CASE("a whole block's codes are checked one by one, whatever the scan's width") {
  check_whole_blocks_against_codes<dc::int4, 128>();
  check_whole_blocks_against_codes<dc::int8, 128>();
  check_whole_blocks_against_codes<dc::int4, 20>();  // 10 value bytes: a word and a byte tail
  check_whole_blocks_against_codes<dc::int8, 12>();
  check_whole_blocks_against_codes<dc::int2, 64>();
}

TEST_CASE("codec structure checks catch what a re-checksummed payload could hide") {
  using i8 = cp::blockwise_codec<dc::int8, 16, cp::round_nearest>;
  std::vector<std::byte> block(i8::stride(), std::byte{0});
  CHECK(i8{}.check(block.data(), 16) == nullptr);
  block[4 + 3] = std::byte{0x80};  // -128 is never written
  CHECK(std::string(i8{}.check(block.data(), 16)) == "quantized value out of range");
  block[4 + 3] = std::byte{0};
  block[4 + 10] = std::byte{1};  // beyond a partial block of 5
  CHECK(i8{}.check(block.data(), 5) != nullptr);

  auto tk = cp::topk<8>::make_codec({.fraction = 0.5f});
  std::vector<std::byte> t(tk.stride(), std::byte{0});
  std::vector<float> v{1, 2, 3, 4, 5, 6, 7, 8}, dq(8);
  tk.encode(v.data(), 8, t.data(), dq.data(), 0, 0);
  CHECK(tk.check(t.data(), 8) == nullptr);
  auto swapped = t;
  std::swap(swapped[0], swapped[2]);  // indices out of order
  CHECK(tk.check(swapped.data(), 8) != nullptr);
  auto beyond = t;
  beyond[0] = std::byte{9};  // index beyond the block
  CHECK(tk.check(beyond.data(), 8) != nullptr);
}
