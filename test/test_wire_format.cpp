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

namespace {

// SplitMix64's output function (Steele, Lea and Flood 2014; Vigna's
// splitmix64.c), written from its published definition.
std::uint64_t splitmix_finalizer(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The checksum's word sum as its definition states it: over the 64-bit
// little-endian words w_i of `bytes` bytes (the last zero-padded), the
// wrapping sum of finalizer(w_i + (first + i + 1) * golden), one word at a time.
std::uint64_t reference_word_sum(const std::byte* data, std::size_t bytes, std::uint64_t first) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; 8 * i < bytes; ++i) {
    std::uint64_t w = 0;
    for (std::size_t b = 0; b < 8 && 8 * i + b < bytes; ++b)
      w |= static_cast<std::uint64_t>(std::to_integer<unsigned>(data[8 * i + b])) << (8 * b);
    sum += splitmix_finalizer(w + (first + i + 1) * 0x9e3779b97f4a7c15ULL);
  }
  return sum;
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::uint64_t s = seed;
  for (auto& b : v) b = static_cast<std::byte>((s = splitmix_finalizer(s + 1)) >> 56);
  return v;
}

}  // namespace

TEST_CASE("the checksum's word sum is its definition on every path this CPU runs") {
  // SplitMix64 seeded with 0 first returns 0xe220a8397b1dcdaf: the term of
  // one zero word at index 0.
  const std::vector<std::byte> zero(8, std::byte{0});
  CHECK(dc::checksum_words(zero.data(), 8) == 0xe220a8397b1dcdafULL);
  const auto data = random_bytes((std::size_t{1} << 16) + 64, 7);
  using whole_words = std::uint64_t (*)(const std::byte*, std::size_t, std::uint64_t);
  std::vector<std::pair<const char*, whole_words>> paths{{"baseline", dc::detail::checksum_whole_words_baseline}};
#if defined(DILOCO_HOST_SIMD_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    paths.emplace_back("avx2", dc::detail::checksum_whole_words_avx2);
  else
    MESSAGE("this CPU has no AVX2: its checksum path is not run");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
    paths.emplace_back("avx512", dc::detail::checksum_whole_words_avx512);
  else
    MESSAGE("this CPU has no AVX-512F/DQ: its checksum path is not run");
#endif
  const std::uint64_t firsts[] = {0, 8, (std::uint64_t{1} << 40) + 3, ~std::uint64_t{0} - 5};
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (std::size_t n : {4095, 4096, 4097, 65535, 65536, 65537}) sizes.push_back(n);
  for (const std::size_t offset : {0, 1, 3, 8, 13})
    for (const std::size_t n : sizes)
      for (const std::uint64_t first : firsts) {
        const std::byte* p = data.data() + offset;
        const std::uint64_t want = reference_word_sum(p, n, first);
        REQUIRE(dc::checksum_words(p, n, first) == want);
        const std::uint64_t whole = reference_word_sum(p, n / 8 * 8, first);
        for (const auto& path : paths) {
          INFO(path.first, ": ", n, " bytes at offset ", offset, ", first word ", first);
          REQUIRE(path.second(p, n / 8, first) == whole);
        }
      }
}

namespace {

using scan_codec = cp::blockwise_codec<dc::int8, 32, cp::round_nearest>;

// nblocks whole int8 blocks of 32 (valid encodings of varied values) and their block list.
struct block_payload {
  std::vector<std::byte> bytes;
  std::vector<cp::block_ref> blocks;
};

block_payload make_blocks(std::size_t nblocks) {
  block_payload p;
  p.bytes.resize(nblocks * scan_codec::stride());
  std::vector<float> v(32), dq(32);
  for (std::size_t b = 0; b < nblocks; ++b) {
    for (std::size_t j = 0; j < 32; ++j) v[j] = static_cast<float>((b * 37 + j * 11) % 101) - 50.0f;
    scan_codec{}.encode(v.data(), 32, p.bytes.data() + b * scan_codec::stride(), dq.data(), 0, 0);
    p.blocks.push_back({0, 32, b * 32});
  }
  return p;
}

}  // namespace

TEST_CASE("a payload's checksum and structure check in one pass on the executor's threads give the two passes' answers") {
  dc::exec::host ex(2);
  const scan_codec c{};
  const std::size_t stride = scan_codec::stride();
  // 1824 blocks of 36 bytes make a piece (about 64 KiB, a multiple of 8
  // blocks): no piece, one, one and a block, several.
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1825}, std::size_t{5 * 1824 + 3}}) {
    INFO(n, " blocks");
    auto p = make_blocks(n);
    const auto clean = cp::scan_payload(ex, c, p.bytes.data(), p.blocks.data(), n, true);
    CHECK(clean.sum == reference_word_sum(p.bytes.data(), n * stride, wire::header_bytes / 8));
    CHECK(clean.bad.index == n);
    CHECK(cp::scan_payload(ex, c, p.bytes.data(), p.blocks.data(), n, false).sum == clean.sum);
    if (n < 5 * 1824) continue;
    // Two malformed blocks in different pieces: the first is named, with
    // first_bad_block's words, and the sum counts the changed bytes.
    const std::size_t later = 4 * 1824 + 100, earlier = 1824 + 7;
    p.bytes[later * stride + 4 + 5] = std::byte{0x80};
    CHECK(cp::scan_payload(ex, c, p.bytes.data(), p.blocks.data(), n, true).bad.index == later);
    p.bytes[earlier * stride + 4 + 31] = std::byte{0x80};
    const auto bad = cp::scan_payload(ex, c, p.bytes.data(), p.blocks.data(), n, true);
    const auto serial = cp::first_bad_block(c, p.bytes.data(), p.blocks.data(), n);
    CHECK(bad.bad.index == earlier);
    CHECK(serial.index == earlier);
    CHECK(std::string(bad.bad.problem) == serial.problem);
    CHECK(bad.sum == reference_word_sum(p.bytes.data(), n * stride, wire::header_bytes / 8));
    CHECK(cp::scan_payload(ex, c, p.bytes.data(), p.blocks.data(), n, false).bad.index == n);  // not looked for
  }
  // The parallel word sum alone, over sizes around its 64 KiB pieces.
  const auto data = random_bytes(3 * 65536 + 5, 11);
  for (const std::size_t n : {0, 1, 65535, 65536, 65537, 2 * 65536, 3 * 65536 + 5})
    CHECK(cp::payload_words_sum(ex, data.data(), n) == reference_word_sum(data.data(), n, wire::header_bytes / 8));
}

TEST_CASE("validate_segment on the executor's threads gives the serial one's header and errors") {
  dc::exec::host ex(2);
  const scan_codec c{};
  const std::size_t n = 3 * 1824 + 5, stride = scan_codec::stride();
  const auto p = make_blocks(n);
  std::vector<std::byte> seg(wire::header_bytes + p.bytes.size());
  std::memcpy(seg.data() + wire::header_bytes, p.bytes.data(), p.bytes.size());
  wire::header h;
  h.codec = cp::codec_id::int8;
  h.block_size = 32;
  h.sender = 1;
  h.elements = n * 32;
  h.payload_bytes = n * stride;
  h.round = 4;
  h.norm = 2.5f;
  wire::write_header(seg.data(), h);
  const wire::expectation want = wire::expectation::of(h);
  // The error each validation gives (empty: none) and the header it read.
  auto outcome = [&](const std::vector<std::byte>& s, bool parallel) {
    try {
      const auto got = parallel ? cp::validate_segment(ex, c, s, want, p.blocks.data(), n, "test", false, 2)
                                : cp::validate_segment(c, s, want, p.blocks.data(), n, "test", false, 2);
      CHECK(got.norm == 2.5f);
      return std::string();
    } catch (const dc::format_error& e) {
      return std::string(e.what());
    }
  };
  CHECK(outcome(seg, true).empty());
  CHECK(outcome(seg, false).empty());
  // A changed payload byte: the checksum names it, before the block it makes malformed.
  auto flipped = seg;
  flipped[wire::header_bytes + 2000 * stride + 9] = std::byte{0x80};
  CHECK(outcome(flipped, true).find("checksum") != std::string::npos);
  CHECK(outcome(flipped, true) == outcome(flipped, false));
  // The same byte under a checksum that covers it: the malformed block, named the same way.
  wire::write_header(flipped.data(), h);
  CHECK(outcome(flipped, true).find("block 2000: quantized value out of range") != std::string::npos);
  CHECK(outcome(flipped, true) == outcome(flipped, false));
  // A header whose length disagrees takes the serial path's error.
  auto short_len = seg;
  wire::header h2 = h;
  h2.payload_bytes -= 8;
  wire::write_header(short_len.data(), h2);
  CHECK(outcome(short_len, true).find("payload length") != std::string::npos);
  CHECK(outcome(short_len, true) == outcome(short_len, false));
}
