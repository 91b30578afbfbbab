// SPDX-License-Identifier: Apache-2.0
// The host codecs' fast paths (issue 46) against the element definitions
// they stand in for, bit for bit:
//  - the small floats' branch-free rounding (minifloat_grid::
//    round_nearest_code) against round<false> and code() at every grid
//    value, every midpoint (the ties), their fp32 neighbours, zero, tiny,
//    fp32 subnormals, saturating and non-finite inputs;
//  - word-at-a-time packing against the byte-by-byte layout;
//  - blockwise encode, decode and the receiver's check against the
//    element-level forms the device team programs use
//    (kernels::codec_elements: one element's float operations, its codes
//    packed group by group), on odd sizes, partial blocks, zero, tiny,
//    non-finite and saturating blocks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/kernels/codec_elements.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
namespace dk = diloco::kernels;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// round<false> and code(), the grid's definition, against the fused form.
template <class Format>
void same_rounding(float y) {
  using G = dk::minifloat_grid<Format>;
  const float r = G::template round<false>(y, 0.0f);
  const unsigned c = G::code(r);
  unsigned fc = 0;
  const float fr = G::round_nearest_code(y, fc);
  CAPTURE(y);
  CAPTURE(bits_of(y));
  REQUIRE(bits_of(fr) == bits_of(r));
  REQUIRE(fc == c);
}

template <class Format>
void rounding_everywhere() {
  using G = dk::minifloat_grid<Format>;
  std::vector<float> ys = {0.0f, -0.0f, Format::levels, -Format::levels, std::nextafter(Format::levels, 1e30f),
                           2.0f * Format::levels, 1e38f, std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(), 1e-30f, -1e-30f};
  // Every magnitude, the midpoint to the next (a tie), and the fp32
  // neighbours of both, with both signs.
  for (unsigned m = 0; m <= Format::max_code; ++m) {
    const float a = G::magnitude(m);
    ys.push_back(a);
    if (m < Format::max_code) {
      const float mid = (a + G::magnitude(m + 1)) / 2.0f;  // exact: one more bit than the format
      ys.push_back(mid);
      ys.push_back(std::nextafter(mid, 0.0f));
      ys.push_back(std::nextafter(mid, 1e30f));
    }
    ys.push_back(std::nextafter(a, 0.0f));
    ys.push_back(std::nextafter(a, 1e30f));
  }
  const auto spread = random_values(20000, 46, -24.0f, 18.0f);
  ys.insert(ys.end(), spread.begin(), spread.end());
  for (float y : ys) {
    same_rounding<Format>(y);
    same_rounding<Format>(-y);
  }
}

// The layout's definition: element j at bit (j % per_byte) * bits of byte j / per_byte.
template <int Bits>
std::vector<unsigned char> pack_by_definition(const std::vector<unsigned char>& c) {
  constexpr std::size_t per_byte = 8 / Bits;
  std::vector<unsigned char> out((c.size() + per_byte - 1) / per_byte, 0);
  for (std::size_t j = 0; j < c.size(); ++j)
    out[j / per_byte] = static_cast<unsigned char>(out[j / per_byte] | (c[j] << ((j % per_byte) * Bits)));
  return out;
}

template <int Bits>
void packing_everywhere() {
  std::mt19937 rng(Bits);
  for (std::size_t n = 0; n <= 67; ++n) {
    std::vector<unsigned char> c(n);
    for (auto& x : c) x = static_cast<unsigned char>(rng() & ((1u << Bits) - 1u));
    std::vector<unsigned char> out(n + 8, 0xa5);
    const std::size_t used = cp::packed_codes::pack<Bits>(c.data(), n, out.data());
    const auto want = pack_by_definition<Bits>(c);
    CAPTURE(n);
    REQUIRE(used == want.size());
    for (std::size_t p = 0; p < used; ++p) REQUIRE(out[p] == want[p]);
    REQUIRE(out[used] == 0xa5);  // nothing written past the codes
  }
}

// A block encoded element by element through codec_elements (the device's
// form: the same float operations per element, codes put group by group).
template <class Codec>
std::vector<std::byte> encode_by_elements(const std::vector<float>& v, std::vector<float>& dq) {
  using E = dk::codec_elements<Codec>;
  std::vector<std::byte> out(Codec::stride(), std::byte{0});
  float amax = 0.0f;
  std::int32_t m = 0;
  for (float x : v) m = std::max(m, static_cast<std::int32_t>(bits_of(x) & 0x7fffffffu));
  std::memcpy(&amax, &m, 4);
  E::put_factor(out.data(), amax);
  dq.assign(v.size(), 0.0f);
  for (std::size_t j0 = 0; j0 < v.size(); j0 += E::group) {
    typename E::code q[E::group] = {};
    for (std::size_t i = 0; i < E::group && j0 + i < v.size(); ++i)
      E::encode(v[j0 + i], amax, E::stochastic ? dk::random_unit(0, j0 + i) : 0.0f, q[i], dq[j0 + i]);
    E::put_codes(out.data(), j0, q);
  }
  return out;
}

// Blocks of every kind the passes meet.
std::vector<std::vector<float>> blocks_of(std::size_t B, float levels) {
  std::vector<std::vector<float>> out;
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5}, B / 2 + 1, B - 1, B}) {
    if (n == 0 || n > B) continue;
    out.push_back(random_values(n, static_cast<unsigned>(n) + 3, -6.0f, 3.0f));  // spread over binades
    out.push_back(random_normals(n, static_cast<std::uint32_t>(n) + 11, 1e-3f));
    out.push_back(std::vector<float>(n, 0.0f));  // zero
    std::vector<float> neg_zero(n, -0.0f);
    out.push_back(neg_zero);
    out.push_back(random_values(n, static_cast<unsigned>(n) + 5, -140.0f, -127.0f));  // tiny: subnormal scale
    out.push_back(random_values(n, static_cast<unsigned>(n) + 6, -149.0f, -140.0f));  // L / amax overflows
    auto huge = random_values(n, static_cast<unsigned>(n) + 7, -3.0f, 0.0f);
    huge[n / 2] = 3e38f;  // saturating: amax near fp32's largest
    out.push_back(huge);
    auto inf = random_values(n, static_cast<unsigned>(n) + 8, -3.0f, 0.0f);
    inf[n - 1] = -std::numeric_limits<float>::infinity();
    out.push_back(inf);
    auto nan = random_values(n, static_cast<unsigned>(n) + 9, -3.0f, 0.0f);
    nan[0] = std::numeric_limits<float>::quiet_NaN();
    out.push_back(nan);
    // Ties: amax = L (scale 1), the others at midpoints between neighbours.
    std::vector<float> ties(n);
    for (std::size_t j = 0; j < n; ++j) ties[j] = (j % 2 ? -1.0f : 1.0f) * (0.5f + static_cast<float>(j % 7));
    ties[0] = levels;
    out.push_back(ties);
  }
  return out;
}

template <class Codec>
void codec_against_elements() {
  using E = dk::codec_elements<Codec>;
  const Codec codec{};
  for (const auto& v : blocks_of(Codec::block, Codec::levels)) {
    CAPTURE(v.size());
    CAPTURE(v[0]);
    std::vector<float> want_dq;
    const auto want = encode_by_elements<Codec>(v, want_dq);
    std::vector<std::byte> got(Codec::stride(), std::byte{0x5a});
    std::vector<float> dq(v.size(), -1.0f);
    codec.encode(v.data(), v.size(), got.data(), dq.data(), 0, 0);
    for (std::size_t p = 0; p < got.size(); ++p) {
      CAPTURE(p);
      REQUIRE(static_cast<unsigned>(got[p]) == static_cast<unsigned>(want[p]));
    }
    for (std::size_t j = 0; j < v.size(); ++j) REQUIRE(bits_of(dq[j]) == bits_of(want_dq[j]));
    // Decode: each element's definition against the block's factor.
    std::vector<float> back(v.size(), -1.0f);
    codec.decode(got.data(), v.size(), back.data());
    const float amax = E::factor(got.data());
    for (std::size_t j = 0; j < v.size(); ++j) {
      typename E::code q[E::group];
      E::codes(got.data(), j - j % E::group, q);
      REQUIRE(bits_of(back[j]) == bits_of(E::decode(q[j % E::group], amax)));
    }
    REQUIRE(codec.check(got.data(), v.size()) == nullptr);
  }
}

// Every code at every position of random whole blocks: decode against the
// element definition, and check() against the byte loop's verdict.
template <class Codec>
void decode_and_check_every_code() {
  using E = dk::codec_elements<Codec>;
  const Codec codec{};
  std::mt19937 rng(7);
  for (float amax : {1.0f, 3.5e-3f, 1e-40f, 0.0f, std::numeric_limits<float>::infinity()}) {
    for (int trial = 0; trial < 64; ++trial) {
      std::vector<std::byte> blk(Codec::stride());
      for (auto& b : blk) b = static_cast<std::byte>(rng());
      std::memcpy(blk.data(), &amax, 4);
      std::vector<float> back(Codec::block);
      codec.decode(blk.data(), Codec::block, back.data());
      for (std::size_t j = 0; j < Codec::block; ++j) {
        typename E::code q[E::group];
        E::codes(blk.data(), j - j % E::group, q);
        REQUIRE(bits_of(back[j]) == bits_of(E::decode(q[j % E::group], amax)));
      }
      const char* want = nullptr;
      for (std::size_t p = 0; p < Codec::value_bytes && want == nullptr; ++p)
        want = Codec::byte_problem(blk.data() + 4, Codec::block, p);
      const char* got = codec.check(blk.data(), Codec::block);
      REQUIRE((got == nullptr) == (want == nullptr));
      if (want) CHECK(std::string(got) == std::string(want));
    }
  }
}

template <class Codec>
void everything() {
  codec_against_elements<Codec>();
  decode_and_check_every_code<Codec>();
}

}  // namespace

TEST_CASE("small floats: the branch-free rounding equals round() and code() everywhere") {
  rounding_everywhere<dc::fp8_e4m3>();
  rounding_everywhere<dc::fp8_e5m2>();
  rounding_everywhere<dc::fp4_e3m0>();
}

TEST_CASE("word-at-a-time packing equals the byte-by-byte layout on every length") {
  packing_everywhere<8>();
  packing_everywhere<4>();
  packing_everywhere<2>();
}

TEST_CASE_TEMPLATE("blockwise encode, decode and check equal the element definitions", Codec,
                   cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e5m2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int4, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int8, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e4m3, 10, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e5m2, 66, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 34, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 36, cp::round_nearest>,
                   cp::blockwise_codec<dc::int4, 2, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e4m3, 128, cp::stochastic_rounding>) {
  everything<Codec>();
}

namespace {

// chunk_topk's selection by its definition: every key (|v| bits, then the
// lower index) sorted, the n largest taken, their positions in order.
std::vector<std::uint64_t> top_by_definition(const std::vector<float>& v, std::size_t n) {
  std::vector<std::uint64_t> keys;
  for (std::size_t j = 0; j < v.size(); ++j)
    keys.push_back((static_cast<std::uint64_t>(bits_of(v[j]) & 0x7fffffffu) << 32) |
                   (0xffffffffu - static_cast<std::uint32_t>(j)));
  std::sort(keys.begin(), keys.end(), [](std::uint64_t a, std::uint64_t b) { return a > b; });
  std::vector<std::uint64_t> idx;
  for (std::size_t e = 0; e < n && e < keys.size(); ++e) idx.push_back(0xffffffffu - (keys[e] & 0xffffffffu));
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <std::size_t Chunk, std::size_t K>
void selection_everywhere() {
  using C = cp::chunk_topk_codec<Chunk, K, dc::int2, cp::round_nearest>;
  std::vector<std::vector<float>> inputs;
  for (std::size_t len : {std::size_t{1}, K - 1, K, K + 1, Chunk / 2 + 3, Chunk - 1, Chunk}) {
    if (len == 0 || len > Chunk) continue;
    inputs.push_back(random_values(len, static_cast<unsigned>(len), -20.0f, 10.0f));
    inputs.push_back(random_normals(len, static_cast<std::uint32_t>(len) + 1, 1e-3f));
    inputs.push_back(std::vector<float>(len, 0.0f));           // every key in one bin, ties by index
    inputs.push_back(std::vector<float>(len, -0.25f));          // equal magnitudes
    std::vector<float> flat(len);  // nearly equal: one top bin, then one middle bin, spread in the low bits
    for (std::size_t j = 0; j < len; ++j) flat[j] = 0.001f + 1e-7f * static_cast<float>((j * 7) % 1000);
    inputs.push_back(flat);
    for (std::size_t j = 0; j < len; ++j) flat[j] = (j % 3 ? -1.0f : 1.0f) * (1.0f + 0x1p-23f * static_cast<float>(j % 300));
    inputs.push_back(flat);
    auto few = random_values(len, static_cast<unsigned>(len) + 2, -3.0f, -2.0f);  // one bin, many
    inputs.push_back(few);
    auto special = random_values(len, static_cast<unsigned>(len) + 3, -4.0f, 4.0f);
    special[len / 2] = std::numeric_limits<float>::quiet_NaN();
    special[len - 1] = -std::numeric_limits<float>::infinity();
    special[0] = std::numeric_limits<float>::denorm_min();
    inputs.push_back(special);
  }
  for (const auto& v : inputs) {
    CAPTURE(v.size());
    const std::size_t n = C::entries(v.size());
    std::vector<std::uint64_t> got(Chunk, ~0ULL);
    C::select(v.data(), v.size(), n, got.data());
    const auto want = top_by_definition(v, n);
    for (std::size_t e = 0; e < n; ++e) REQUIRE(got[e] == want[e]);
  }
}

}  // namespace

TEST_CASE("chunk_topk's selection equals the n largest keys by their definition") {
  selection_everywhere<4096, 64>();
  selection_everywhere<64, 8>();
  selection_everywhere<100, 99>();
  selection_everywhere<2, 1>();
}

TEST_CASE("cast<bf16> encode and decode equal the element definition (encode_float16, the top 16 bits)") {
  using C = cp::cast_codec<dc::bf16, cp::round_nearest>;
  const C codec{};
  for (std::size_t len : {std::size_t{1}, std::size_t{3}, std::size_t{33}, C::block - 1, C::block}) {
    auto v = random_values(len, static_cast<unsigned>(len), -140.0f, 127.0f);  // subnormals to near overflow
    v[0] = std::numeric_limits<float>::quiet_NaN();
    if (len > 1) v[1] = -std::numeric_limits<float>::infinity();
    if (len > 2) v[2] = -0.0f;
    if (len > 5) v[5] = 3.4028235e38f;  // rounds to inf
    CAPTURE(len);
    std::vector<std::byte> out(C::stride(), std::byte{0x5a});
    std::vector<float> dq(len), back(len);
    codec.encode(v.data(), len, out.data(), dq.data(), 0, 0);
    codec.decode(out.data(), len, back.data());
    for (std::size_t j = 0; j < len; ++j) {
      const std::uint16_t want = dk::encode_float16<dk::bf16_format>(v[j], -1.0f);
      std::uint16_t got;
      std::memcpy(&got, out.data() + 2 * j, 2);
      CAPTURE(j);
      REQUIRE(got == want);
      REQUIRE(bits_of(dq[j]) == static_cast<std::uint32_t>(want) << 16);
      REQUIRE(bits_of(back[j]) == static_cast<std::uint32_t>(want) << 16);
    }
    for (std::size_t p = 2 * len; p < C::stride(); ++p) REQUIRE(out[p] == std::byte{0});
  }
}
