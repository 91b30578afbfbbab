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
//    non-finite and saturating blocks;
//  - the fused block loops of the compressed round (kernels/host_simd.hpp's
//    block_loops and bf16_loops: the shard reduction's block and the encode
//    pass's block, every blockwise format and cast<bf16>) against the same element definitions, each
//    dispatch path this machine runs (the baseline ISA and AVX2, and
//    host_simd's AVX2 intrinsics for the codecs it supports) forced in
//    turn, and the branch-free code values against value() for every code;
//  - host_simd's AVX2 element operations (each format's rounding of every
//    grid value, midpoint and their neighbours, its packing, its decoding
//    of every code under normal, zero, large and non-finite factors)
//    against the grids' definitions;
//  - decode-apply, the gathered aggregate-apply and the encode pass's
//    portable code compiled for AVX2 against their baseline compilation
//    (every merge; chunk_topk, fp16, stochastic codecs);
//  - chunk_topk's selection (its shortcuts for crowded bins included)
//    against a full sort;
//  - the receiver's structure check of a payload (compress::first_bad_block,
//    whole blocks a run at a time, on each path) against check() block by
//    block.
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
    // Binades and their midpoints (amax = L): L * 2^-k and L * 0.75 * 2^-k,
    // both signs, k = 0, 1, ... (for fp4, the tie at half its smallest
    // normal and the values between it and the normal; for fp8, the tie at
    // the top of each binade).
    std::vector<float> binades(n);
    for (std::size_t j = 0; j < n; ++j)
      binades[j] = (j % 2 ? -1.0f : 1.0f) * levels * std::ldexp(j % 4 < 2 ? 0.5f : 0.75f, -static_cast<int>(j / 4));
    binades[0] = levels;
    out.push_back(binades);
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

namespace {

// Every code's branch-free value is value()'s, the codes never written too.
template <class Format>
void values_everywhere() {
  using G = dk::minifloat_grid<Format>;
  for (unsigned c = 0; c < (1u << Format::bits); ++c) {
    CAPTURE(c);
    REQUIRE(bits_of(G::value_branchless(c)) == bits_of(G::value(c)));
  }
}

}  // namespace

TEST_CASE("small floats: the branch-free code values equal value() for every code") {
  values_everywhere<dc::fp8_e4m3>();
  values_everywhere<dc::fp8_e5m2>();
  values_everywhere<dc::fp4_e3m0>();
}

#if defined(DILOCO_HOST_SIMD_X86)
namespace {

// host_simd's AVX2 element operations, eight at a time, called from a
// function compiled for AVX2 (they are inlined only into such code).
template <class Format>
__attribute__((target("avx2"))) void round8_avx2(const float* y, float* r, std::int32_t* c) {
  __m256i code;
  const __m256 v = dk::host_simd::detail::ops<Format>::round8(_mm256_loadu_ps(y), code);
  _mm256_storeu_ps(r, v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c), code);
}
template <class Format>
__attribute__((target("avx2"))) bool decode32_avx2(const unsigned char* codes, float amax, float* out) {
  using O = dk::host_simd::detail::ops<Format>;
  typename O::rank rank;
  if (!O::make_rank(amax, amax / Format::levels, rank)) return false;
  __m256 v[4];
  O::decode32(codes, rank, v);
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + 8 * k, v[k]);
  return true;
}
template <class Format>
__attribute__((target("avx2"))) void put32_avx2(const std::int32_t* c, unsigned char* out) {
  __m256i v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 8 * k));
  dk::host_simd::detail::ops<Format>::put32(out, v);
}

// The grid's rounding (round<false>, then code()) of y: the definition.
template <class Format>
void round_by_definition(float y, float& r, unsigned& c) {
  constexpr auto g = dk::grid<Format>();
  r = g.template round<false>(y, 0.0f);
  c = g.code(r);
}

// Every input the rounding test of the small floats uses, and for the
// integer grids their every value, midpoint and fp32 neighbours.
template <class Format>
std::vector<float> rounding_inputs() {
  std::vector<float> ys = {0.0f, -0.0f, Format::levels, -Format::levels, std::nextafter(Format::levels, 1e30f),
                           2.0f * Format::levels, 1e38f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), 1e-30f};
  std::vector<float> grid_values;
  if constexpr (requires { Format::mantissa_bits; }) {
    for (unsigned m = 0; m <= Format::max_code; ++m) grid_values.push_back(dk::minifloat_grid<Format>::magnitude(m));
  } else {
    for (float q = 0.0f; q <= Format::levels; q += 1.0f) grid_values.push_back(q);
  }
  for (std::size_t i = 0; i < grid_values.size(); ++i) {
    const float a = grid_values[i];
    ys.push_back(a);
    for (float t : {a, i + 1 < grid_values.size() ? (a + grid_values[i + 1]) / 2.0f : a}) {
      ys.push_back(t);
      ys.push_back(std::nextafter(t, 0.0f));
      ys.push_back(std::nextafter(t, 1e30f));
    }
  }
  const auto spread = random_values(4000, 47, -24.0f, 18.0f);
  ys.insert(ys.end(), spread.begin(), spread.end());
  const std::size_t n = ys.size();
  for (std::size_t i = 0; i < n; ++i) ys.push_back(-ys[i]);
  while (ys.size() % 8 != 0) ys.push_back(0.5f);
  return ys;
}

template <class Format>
void intrinsics_against_grid() {
  // Rounding: every input against round<false> and code(). The roundings
  // of the integer grids and the small floats take only what the passes
  // can hand them, unclamped (test_host_simd: |y| is at most L's upper
  // neighbour, and finite), so their inputs here are those within L + 1/2
  // for the integer grids (the grid points, the ties between them, their
  // neighbours) and within L's upper neighbour for the small floats; int2's
  // comparisons take every input.
  auto ys = rounding_inputs<Format>();
  if constexpr (!std::is_same_v<Format, dc::int2>) {
    constexpr bool integer = std::is_same_v<Format, dc::int8> || std::is_same_v<Format, dc::int4>;
    const float bound = integer ? Format::levels + 0.5f : std::nextafter(Format::levels, 1e30f);
    std::vector<float> within;
    for (const float y : ys)
      if (integer ? std::fabs(y) < bound : std::fabs(y) <= bound) within.push_back(y);
    while (within.size() % 8 != 0) within.push_back(0.5f);
    REQUIRE(within.size() > ys.size() / 2);
    ys = within;
  }
  for (std::size_t i = 0; i < ys.size(); i += 8) {
    float r[8];
    std::int32_t c[8];
    round8_avx2<Format>(ys.data() + i, r, c);
    for (std::size_t k = 0; k < 8; ++k) {
      float wr;
      unsigned wc;
      round_by_definition<Format>(ys[i + k], wr, wc);
      CAPTURE(ys[i + k]);
      REQUIRE(bits_of(r[k]) == bits_of(wr));
      REQUIRE((static_cast<unsigned>(c[k]) & ((1u << Format::bits) - 1u)) == wc);
    }
  }
  // Packing: 32 codes at random, against the layout's definition.
  std::mt19937 rng(48);
  for (int trial = 0; trial < 64; ++trial) {
    std::int32_t c[32];
    std::vector<unsigned char> codes(32);
    for (int j = 0; j < 32; ++j) {
      codes[static_cast<std::size_t>(j)] = static_cast<unsigned char>(rng() & ((1u << Format::bits) - 1u));
      // The integer grids hand put32 their values (two's complement), the others their codes.
      c[j] = codes[static_cast<std::size_t>(j)];
      if constexpr (std::is_same_v<Format, dc::int8> || std::is_same_v<Format, dc::int4>)
        c[j] = static_cast<std::int32_t>(dk::grid<Format>().value(codes[static_cast<std::size_t>(j)]));
    }
    if constexpr (std::is_same_v<Format, dc::int8> || std::is_same_v<Format, dc::int4>)
      for (int j = 0; j < 32; ++j)  // the code -L - 1 is never written: keep to the values
        if (c[j] < -static_cast<std::int32_t>(Format::levels)) c[j] = 0, codes[static_cast<std::size_t>(j)] = 0;
    unsigned char out[32 + 8];
    std::memset(out, 0xa5, sizeof out);
    put32_avx2<Format>(c, out);
    const auto want = pack_by_definition<Format::bits>(codes);
    for (std::size_t p = 0; p < want.size(); ++p) REQUIRE(out[p] == want[p]);
    REQUIRE(out[want.size()] == 0xa5);
  }
  // Decoding: every code at every lane against value(q) * scale (the
  // element's decode), for factors normal, zero, large and non-finite.
  using C = cp::blockwise_codec<Format, 32, cp::round_nearest>;
  using E = dk::codec_elements<C>;
  for (float amax : {1.0f, 3.5e-3f, 0.0f, 9.0e3f, 2.0e5f, 3.0e38f, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN()}) {
    for (unsigned first = 0; first < (1u << Format::bits); first += 32 / (8 / Format::bits) / 4 + 1) {
      std::vector<std::byte> blk(C::stride());
      std::memcpy(blk.data(), &amax, 4);
      for (std::size_t p = 4; p < blk.size(); ++p)
        blk[p] = static_cast<std::byte>(p == 4 ? first : rng());
      float got[32];
      CAPTURE(amax);
      const bool ok = decode32_avx2<Format>(reinterpret_cast<const unsigned char*>(blk.data() + 4), amax, got);
      // Where the multiplier or the table is exact, the form must take the block.
      if (std::fabs(amax) < 1e4f) REQUIRE(ok);
      if (!ok) continue;
      for (std::size_t j = 0; j < 32; ++j) {
        typename E::code q[E::group];
        E::codes(blk.data(), j - j % E::group, q);
        CAPTURE(j);
        REQUIRE(bits_of(got[j]) == bits_of(E::decode(q[j % E::group], amax)));
      }
    }
  }
}

}  // namespace

TEST_CASE("host SIMD element operations (rounding, packing, decoding) equal the grids' definitions") {
  if (!dk::host_simd::enabled()) return;  // this CPU runs only the baseline: nothing to run
  intrinsics_against_grid<dc::fp8_e4m3>();
  intrinsics_against_grid<dc::fp8_e5m2>();
  intrinsics_against_grid<dc::fp4_e3m0>();
  intrinsics_against_grid<dc::int2>();
  intrinsics_against_grid<dc::int4>();
  intrinsics_against_grid<dc::int8>();
}
#endif

#if defined(DILOCO_HOST_BLOCK_LOOPS)
namespace {

// The norm lanes' definition (kernels::lane_squares): x[j]^2 added into
// lane j % L in order, fp32, then the lanes halved as a tree.
double lanes_by_definition(const std::vector<float>& x, std::size_t L) {
  std::vector<float> acc(L, 0.0f);
  for (std::size_t j = 0; j < x.size(); ++j) {
    const float sq = x[j] * x[j];
    acc[j % L] = acc[j % L] + sq;
  }
  for (std::size_t w = L / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
  return static_cast<double>(acc[0]);
}

std::uint64_t dbits(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}

// A path of the compressed round's block passes: block_loops compiled for
// the baseline ISA or for AVX2, or (for the codecs host_simd::supports)
// host_simd's AVX2 intrinsics, which the passes run where the CPU has AVX2,
// or their AVX-512 forms (host_simd512.hpp), where it has AVX-512.
enum class path { baseline, avx2, intrinsics, intrinsics512 };

template <class Codec = void>
std::vector<path> paths_here() {
  std::vector<path> p{path::baseline};
#if defined(DILOCO_HOST_SIMD_X86)
  if (dk::host_simd::enabled()) {
    p.push_back(path::avx2);
    if constexpr (!std::is_void_v<Codec>)
      if constexpr (dk::host_simd::supports<Codec>::value && Codec::block % dk::norm_lanes(Codec::block) == 0) {
        p.push_back(path::intrinsics);
        if (dk::host_simd::avx512()) p.push_back(path::intrinsics512);
      }
  }
#endif
  return p;
}

template <class Codec, class Loops>
bool reduce_on(path p, const std::byte* const* in, int world, std::byte* out, double& norm) {
#if defined(DILOCO_HOST_SIMD_X86)
  if constexpr (dk::host_simd::supports<Codec>::value && Codec::block % dk::norm_lanes(Codec::block) == 0) {
    if (p == path::intrinsics)
      return dk::host_simd::reduce_block<typename dk::host_simd::supports<Codec>::format, Codec::block,
                                         dk::norm_lanes(Codec::block)>(in, world, out, norm);
    if (p == path::intrinsics512)
      return dk::host_simd::reduce_blocks_avx512<typename dk::host_simd::supports<Codec>::format, Codec::block,
                                                 dk::norm_lanes(Codec::block), 1>(in, 0, world, 1u, out, &norm) != 0u;
  }
  if (p == path::avx2) return Loops::reduce_avx2(in, world, out, norm);
#endif
  (void)p;
  return Loops::reduce_baseline(in, world, out, norm);
}

template <class Codec, class Loops>
bool encode_on(path p, const float* g, const float* l, const float* e, float* next, float decay, std::byte* out,
               double& a, double& b) {
#if defined(DILOCO_HOST_SIMD_X86)
  if constexpr (dk::host_simd::supports<Codec>::value && Codec::block % dk::norm_lanes(Codec::block) == 0) {
    if (p == path::intrinsics)
      return dk::host_simd::encode_block<typename dk::host_simd::supports<Codec>::format, Codec::block,
                                         dk::norm_lanes(Codec::block)>(g, l, e, next, decay, out, a, b);
    if (p == path::intrinsics512)
      return dk::host_simd::encode_block_avx512<typename dk::host_simd::supports<Codec>::format, Codec::block,
                                                dk::norm_lanes(Codec::block)>(g, l, e, next, decay, out, a, b);
  }
  if (p == path::avx2) return Loops::encode_avx2(g, l, e, next, decay, out, a, b);
#endif
  (void)p;
  return Loops::encode_baseline(g, l, e, next, decay, out, a, b);
}

// Whether the intrinsics must take a block the loops take: they also refuse
// received blocks whose factor their decoding cannot use bit for bit (fp8
// with a multiplier scale * 2^(127 - bias) that overflows, fp4 with a
// non-finite factor); below 1e4 and finite, none.
bool intrinsics_must_take(path p, const std::vector<float>& received_amax) {
  if (p != path::intrinsics && p != path::intrinsics512) return true;
  for (float a : received_amax)
    if (!(std::fabs(a) < 1e4f)) return false;
  return true;
}

// Whether a block of this amax takes the loops' path: the common path
// (positive, finite, L / amax finite, amax / L normal) or zero.
bool common_amax(float amax, float levels) {
  if (amax == 0.0f) return true;
  const float inv = levels / amax, scale = amax / levels;
  return std::isfinite(amax) && std::isfinite(inv) && scale >= std::numeric_limits<float>::min();
}

// The format's largest value L (a cast has none: 1).
template <class Codec>
float levels_of() {
  if constexpr (requires { Codec::levels; })
    return Codec::levels;
  else
    return 1.0f;
}

float amax_of(const std::vector<float>& v) {
  std::uint32_t m = 0;
  for (float x : v) m = std::max(m, bits_of(x) & 0x7fffffffu);
  float a;
  std::memcpy(&a, &m, 4);
  return a;
}

template <class Codec>
void fused_encode_against_elements() {
  using Loops = typename dk::host_simd::fused<Codec>::template loops<dk::norm_lanes(Codec::block)>;
  constexpr std::size_t B = Codec::block, L = dk::norm_lanes(Codec::block);
  // Whole blocks of every kind: v = (g - l) + e with l = 0 and e chosen so
  // that v is each test block (and, without e, v = g).
  std::size_t taken = 0;
  const auto kinds = blocks_of(B, levels_of<Codec>());
  for (path p : paths_here<Codec>()) {
    for (const auto& want_v : kinds) {
      if (want_v.size() != B) continue;
      for (int with_e = 0; with_e < 2; ++with_e) {
        for (float decay : {1.0f, 0.75f}) {
          std::vector<float> g = want_v, l(B, 0.0f), e(B, 0.0f);
          if (with_e) {  // g - l = half the block, e the rest (v not exactly want_v; computed below)
            for (std::size_t j = 0; j < B; ++j) {
              g[j] = want_v[j] * 0.5f;
              e[j] = want_v[j] * 0.25f;
              l[j] = static_cast<float>(j % 3) * 1e-3f;
            }
          }
          std::vector<float> d(B), v(B);
          for (std::size_t j = 0; j < B; ++j) {
            d[j] = g[j] - l[j];
            v[j] = with_e ? d[j] + e[j] : d[j];
          }
          CAPTURE(static_cast<int>(p));
          CAPTURE(with_e);
          CAPTURE(v[0]);
          std::vector<std::byte> out(Codec::stride(), std::byte{0x5a});
          std::vector<float> next(B, -7.0f);
          double delta = -1.0, err = -1.0;
          const bool ok = encode_on<Codec, Loops>(p, g.data(), l.data(), with_e ? e.data() : nullptr, next.data(),
                                                  decay, out.data(), delta, err);
          REQUIRE(ok == (!dk::codec_elements<Codec>::scaled || common_amax(amax_of(v), levels_of<Codec>())));
          if (!ok) continue;
          ++taken;
          std::vector<float> want_dq;
          const auto want = encode_by_elements<Codec>(v, want_dq);
          for (std::size_t q = 0; q < out.size(); ++q) {
            CAPTURE(q);
            REQUIRE(static_cast<unsigned>(out[q]) == static_cast<unsigned>(want[q]));
          }
          std::vector<float> error(B);
          for (std::size_t j = 0; j < B; ++j) error[j] = v[j] - want_dq[j];
          for (std::size_t j = 0; j < B; ++j) REQUIRE(bits_of(next[j]) == bits_of(decay == 1.0f ? error[j] : decay * error[j]));
          REQUIRE(dbits(delta) == dbits(lanes_by_definition(d, L)));
          REQUIRE(dbits(err) == dbits(lanes_by_definition(error, L)));
        }
      }
    }
  }
  CHECK(taken > 0);
}

// Rank k's encoding of a block, by the element definition.
template <class Codec>
std::vector<std::byte> encoded(const std::vector<float>& v) {
  std::vector<float> dq;
  return encode_by_elements<Codec>(v, dq);
}

template <class Codec>
void fused_reduce_against_elements() {
  using E = dk::codec_elements<Codec>;
  using Loops = typename dk::host_simd::fused<Codec>::template loops<dk::norm_lanes(Codec::block)>;
  constexpr std::size_t B = Codec::block, L = dk::norm_lanes(Codec::block);
  // Sets of M received blocks: ordinary values, one rank's block zero, one
  // tiny (subnormal scale: the portable path), one with every code at random
  // (the codes never written too) under a normal factor, one infinite,
  // huge ones whose mean saturates, and means that are zero.
  std::mt19937 rng(46);
  std::vector<std::vector<std::vector<std::byte>>> sets;
  for (int world : {1, 3, 4}) {
    for (int kind = 0; kind < 8; ++kind) {
      std::vector<std::vector<std::byte>> set;
      for (int k = 0; k < world; ++k) {
        std::vector<float> v = random_values(B, static_cast<unsigned>(97 * kind + k), -8.0f, 2.0f);
        if (kind == 1 && k == 0) v.assign(B, 0.0f);
        if (kind == 2 && k == world - 1) v = random_values(B, 5u + static_cast<unsigned>(k), -140.0f, -128.0f);
        if (kind == 4 && k == 0) v[B / 2] = std::numeric_limits<float>::infinity();
        if (kind == 5) v[3] = 3e38f;
        if (kind == 6) v.assign(B, k % 2 ? -0.0f : 0.0f);
        auto blk = encoded<Codec>(v);
        if (kind == 3) {
          for (std::size_t q = 4; q < blk.size(); ++q) blk[q] = static_cast<std::byte>(rng());
          const float amax = 0.5f + static_cast<float>(k);
          std::memcpy(blk.data(), &amax, 4);
        }
        if (kind == 7) {  // ties and exact sums: every rank the same block at amax = L
          std::vector<float> t(B);
          for (std::size_t j = 0; j < B; ++j) t[j] = (j % 2 ? -1.0f : 1.0f) * (0.5f + static_cast<float>(j % 5));
          t[0] = levels_of<Codec>();
          blk = encoded<Codec>(t);
        }
        set.push_back(blk);
      }
      sets.push_back(set);
    }
  }
  std::size_t taken = 0;
  for (path p : paths_here<Codec>()) {
    for (const auto& set : sets) {
      const int world = static_cast<int>(set.size());
      // The mean by definition: each element decoded (E::decode against its
      // block's factor), summed in rank order, divided by M.
      std::vector<float> mean(B, 0.0f);
      bool received_common = true;
      std::vector<float> received_amax;
      for (int k = 0; k < world; ++k) {
        const float amax = E::factor(set[k].data());
        received_amax.push_back(amax);
        received_common =
            received_common && (std::isnormal(amax / levels_of<Codec>()) || !std::isfinite(amax) || amax == 0.0f);
        for (std::size_t j = 0; j < B; ++j) {
          typename E::code q[E::group];
          E::codes(set[k].data(), j - j % E::group, q);
          const float x = E::decode(q[j % E::group], amax);
          mean[j] = k == 0 ? x : mean[j] + x;
        }
      }
      for (auto& x : mean) x = x / static_cast<float>(world);
      std::vector<const std::byte*> in;
      for (const auto& b : set) in.push_back(b.data());
      std::vector<std::byte> out(Codec::stride(), std::byte{0x5a});
      double norm = -1.0;
      CAPTURE(static_cast<int>(p));
      CAPTURE(world);
      const bool ok = reduce_on<Codec, Loops>(p, in.data(), world, out.data(), norm);
      const bool loops_take = !E::scaled || (received_common && common_amax(amax_of(mean), levels_of<Codec>()));
      if (intrinsics_must_take(p, received_amax))
        REQUIRE(ok == loops_take);
      else
        REQUIRE((!ok || loops_take));
      if (!ok) continue;
      ++taken;
      std::vector<float> want_dq;
      const auto want = encode_by_elements<Codec>(mean, want_dq);
      for (std::size_t q = 0; q < out.size(); ++q) {
        CAPTURE(q);
        REQUIRE(static_cast<unsigned>(out[q]) == static_cast<unsigned>(want[q]));
      }
      REQUIRE(dbits(norm) == dbits(lanes_by_definition(want_dq, L)));
    }
  }
  CHECK(taken > 0);
}

}  // namespace

TEST_CASE_TEMPLATE("the fused block loops (reduce, encode) equal the element definitions on every path", Codec,
                   cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e5m2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int4, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int8, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e4m3, 40, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 24, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 40, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 40, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 1024, cp::round_nearest>,
                   cp::cast_codec<dc::bf16, cp::round_nearest>, cp::cast_codec<dc::bf16, cp::round_nearest, 16>) {
  fused_encode_against_elements<Codec>();
  fused_reduce_against_elements<Codec>();
}
#endif

namespace {

template <class Codec>
std::vector<std::byte> encoded_block(const std::vector<float>& v) {
  std::vector<float> dq;
  return encode_by_elements<Codec>(v, dq);
}

// Payloads of whole and partial blocks with bad codes (or padding) planted
// here and there: first_bad_block names the block and problem that check()
// block by block names first.
template <class Codec>
void first_bad_block_everywhere() {
  const Codec codec{};
  std::mt19937 rng(4646);
  for (int trial = 0; trial < 60; ++trial) {
    // A layout: runs of whole blocks with partial ones between.
    std::vector<cp::block_ref> blocks;
    const std::size_t n = 1 + rng() % 40;
    for (std::size_t b = 0; b < n; ++b) {
      const bool partial = rng() % 6 == 0;
      const auto len = static_cast<std::uint32_t>(partial ? 1 + rng() % (Codec::block - 1) : Codec::block);
      blocks.push_back({0, len, 0});
    }
    std::vector<std::byte> payload(n * Codec::stride());
    for (std::size_t b = 0; b < n; ++b) {
      const auto v = random_values(blocks[b].len, static_cast<unsigned>(trial * 100 + b), -6.0f, 3.0f);
      const auto blk = encoded_block<Codec>(v);
      std::memcpy(payload.data() + b * Codec::stride(), blk.data(), Codec::stride());
    }
    // Plant 0 to 2 random bytes anywhere in the values (or padding).
    const int plants = trial % 3;
    for (int k = 0; k < plants; ++k) {
      const std::size_t b = rng() % n;
      const std::size_t p = 4 + rng() % Codec::value_bytes;
      payload[b * Codec::stride() + p] = static_cast<std::byte>(rng());
    }
    cp::bad_block want{n, nullptr};
    for (std::size_t b = 0; b < n && want.problem == nullptr; ++b)
      if (const char* bad = codec.check(payload.data() + b * Codec::stride(), blocks[b].len)) want = {b, bad};
    const cp::bad_block got = cp::first_bad_block(codec, payload.data(), blocks.data(), n);
    CAPTURE(trial);
    // Each run of whole blocks on each path against check() block by block.
    for (std::size_t b = 0; b < n;) {
      std::size_t end = b;
      bool clean = true;
      for (; end < n && blocks[end].len == Codec::block; ++end)
        clean = clean && codec.check(payload.data() + end * Codec::stride(), Codec::block) == nullptr;
      if (end > b) {
        REQUIRE(Codec::whole_blocks_clean_loop(payload.data() + b * Codec::stride(), end - b) == clean);
#if defined(DILOCO_HOST_SIMD_X86)
        if (dk::host_simd::enabled())
          REQUIRE(Codec::whole_blocks_clean_avx2(payload.data() + b * Codec::stride(), end - b) == clean);
#endif
      }
      b = end + 1;
    }
    REQUIRE(got.index == want.index);
    REQUIRE((got.problem == nullptr) == (want.problem == nullptr));
    if (want.problem) CHECK(std::string(got.problem) == std::string(want.problem));
  }
  // Every byte value at every position of a whole block, alone.
  std::vector<cp::block_ref> one{{0, static_cast<std::uint32_t>(Codec::block), 0}};
  auto clean = encoded_block<Codec>(random_values(Codec::block, 3, -4.0f, 2.0f));
  for (std::size_t p = 4; p < Codec::stride(); p += 7)
    for (unsigned byte = 0; byte < 256; ++byte) {
      auto blk = clean;
      blk[p] = static_cast<std::byte>(byte);
      const bool bad = codec.check(blk.data(), Codec::block) != nullptr;
      REQUIRE(Codec::whole_blocks_clean(blk.data(), 1) == !bad);
      REQUIRE(Codec::whole_blocks_clean_loop(blk.data(), 1) == !bad);
#if defined(DILOCO_HOST_SIMD_X86)
      if (dk::host_simd::enabled()) REQUIRE(Codec::whole_blocks_clean_avx2(blk.data(), 1) == !bad);
#endif
      REQUIRE((cp::first_bad_block(codec, blk.data(), one.data(), 1).index == 0) == bad);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("the receiver's structure check of a payload equals check() block by block", Codec,
                   cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e5m2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int4, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int8, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp8_e5m2, 10, cp::round_nearest>,
                   cp::blockwise_codec<dc::int4, 6, cp::round_nearest>) {
  first_bad_block_everywhere<Codec>();
}

#if defined(DILOCO_HOST_SIMD_X86)
namespace {

// A pass's state: theta_global, momentum, the replica and the merges' buffers.
struct apply_state {
  std::vector<float> global, momentum, local, start, anchor, own, slots;
  explicit apply_state(std::size_t n)
      : global(random_values(n, 1, -6.0f, 2.0f)),
        momentum(random_values(n, 2, -8.0f, 0.0f)),
        local(random_values(n, 3, -6.0f, 2.0f)),
        start(random_values(n, 4, -6.0f, 2.0f)),
        anchor(random_values(n, 5, -6.0f, 2.0f)),
        own(random_values(n, 6, -9.0f, -2.0f)),
        slots(random_values(n, 7, -8.0f, 0.0f)),
        ptrs{local.data()} {}
  std::vector<float*> ptrs;  // the replica's one tensor
  bool same_bits(const apply_state& o) const {
    auto eq = [](const std::vector<float>& a, const std::vector<float>& b) {
      for (std::size_t i = 0; i < a.size(); ++i)
        if (bits_of(a[i]) != bits_of(b[i])) return false;
      return true;
    };
    return eq(global, o.global) && eq(momentum, o.momentum) && eq(local, o.local) && eq(start, o.start) &&
           eq(anchor, o.anchor) && eq(own, o.own) && eq(slots, o.slots);
  }
};

// Runs the pass made by make(state, merge) block by block at the baseline
// ISA on one state and for AVX2 on another, with each merge; the states must
// end the same, bit for bit.
template <class Codec, class Make>
void apply_paths_agree(std::size_t n, Make&& make) {
  const auto nesterov = dc::outer::nesterov::make_update({.lr = 0.7f, .momentum = 0.9f}, 3);
  auto merges = [&](apply_state& st, auto&& body) {
    body(dk::merge::overwrite{});
    body(dk::merge::mix{{}, 0.25f});
    body(dk::merge::rebase{{}, st.start.data()});
    body(dk::merge::eager<dk::sgd_update>{{}, nesterov, st.anchor.data(), st.own.data(), st.slots.data(), n, 0.25f});
  };
  for (int which = 0; which < 4; ++which) {
    apply_state a(n), b(n);
    int k = 0;
    merges(a, [&](auto m) {
      if (k++ != which) return;
      const auto pass = make(a, m, nesterov);
      for (std::size_t blk = 0; blk < pass.blocks_count; ++blk) pass.pass.run(blk);
    });
    k = 0;
    merges(b, [&](auto m) {
      if (k++ != which) return;
      const auto pass = make(b, m, nesterov);
      for (std::size_t blk = 0; blk < pass.blocks_count; ++blk) pass.pass.run_avx2(blk);
    });
    CAPTURE(which);
    REQUIRE(a.same_bits(b));
  }
}

template <class P>
struct counted {
  P pass;
  std::size_t blocks_count;
};

template <class Codec>
void decode_apply_paths() {
  const Codec codec{};
  const std::size_t n = 5 * Codec::block + 7;  // a partial block at the end
  const cp::block_layout layout({n}, Codec::block, 1);
  // A payload of every kind of block the codec meets, encoded by the codec.
  std::vector<std::byte> payload(layout.block_count() * Codec::stride());
  for (std::size_t b = 0; b < layout.block_count(); ++b) {
    const std::size_t len = layout.blocks()[b].len;
    auto v = random_values(len, static_cast<unsigned>(b) + 40, -7.0f, 1.0f);
    if (b == 1) v.assign(len, 0.0f);
    if (b == 2) v = random_values(len, 9, -140.0f, -128.0f);
    if (b == 3) v[0] = std::numeric_limits<float>::infinity();
    std::vector<float> dq(len);
    codec.encode(v.data(), len, payload.data() + b * Codec::stride(), dq.data(), 1, 0);
  }
  std::vector<std::size_t> offsets{0};
  apply_paths_agree<Codec>(n, [&](apply_state& st, auto m, const dk::sgd_update& u) {
    using M = decltype(m);
    return counted<dk::decode_apply<Codec, dk::sgd_update, M>>{
        {codec, u, layout.blocks(), {st.ptrs.data(), offsets.data()}, payload.data(), Codec::stride(), st.global.data(),
         st.momentum.data(), n, m},
        layout.block_count()};
  });
  // The gathered form: three ranks' payloads (the same bytes, read three times).
  std::vector<const std::byte*> three(3, payload.data());
  apply_paths_agree<Codec>(n, [&](apply_state& st, auto m, const dk::sgd_update& u) {
    using M = decltype(m);
    return counted<dk::gathered_decode_apply<Codec, dk::sgd_update, M>>{
        {codec, u, layout.blocks(), {st.ptrs.data(), offsets.data()}, three.data(), 3, Codec::stride(),
         st.global.data(), st.momentum.data(), n, m},
        layout.block_count()};
  });
}

// The encode pass's portable code compiled for AVX2 (what runs where no
// fused loop takes a block) against its baseline compilation: payload,
// residual and norm bits, with and without error feedback.
template <class Codec>
void encode_paths() {
  const Codec codec{};
  const std::size_t n = 3 * Codec::block + 5;
  const cp::block_layout layout({n}, Codec::block, 1);
  std::vector<float> global = random_values(n, 11, -7.0f, 1.0f), local = random_values(n, 12, -7.0f, 1.0f);
  std::vector<float> residual = random_values(n, 13, -9.0f, -3.0f);
  global[5] = std::numeric_limits<float>::infinity();  // a non-finite block too
  std::vector<float*> ptrs{local.data()};
  std::vector<std::size_t> offsets{0};
  for (int ef = 0; ef < 2; ++ef) {
    std::vector<std::byte> pa(layout.block_count() * Codec::stride()), pb(pa.size());
    std::vector<float> na(n, -1.0f), nb(n, -2.0f);
    auto pass = [&](std::vector<std::byte>& payload, std::vector<float>& next) {
      return dk::encode_pseudo_gradient<Codec>{codec, layout.blocks(), {ptrs.data(), offsets.data()}, global.data(),
                                               ef ? residual.data() : nullptr, ef ? next.data() : nullptr,
                                               payload.data(), Codec::stride(), 5, 0.95f};
    };
    const auto a = pass(pa, na);
    const auto b = pass(pb, nb);
    for (std::size_t blk = 0; blk < layout.block_count(); ++blk) {
      const dk::sums2 x = a.portable(blk), y = b.portable_avx2(blk);
      REQUIRE(dbits(x.a) == dbits(y.a));
      REQUIRE(dbits(x.b) == dbits(y.b));
    }
    REQUIRE(std::memcmp(pa.data(), pb.data(), pa.size()) == 0);
    if (ef)
      for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(na[i]) == bits_of(nb[i]));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("the encode pass's portable code compiled for AVX2 gives the baseline's bits", Codec,
                   cp::chunk_topk_codec<64, 8, dc::int2, cp::round_nearest>,
                   cp::chunk_topk_codec<100, 7, dc::fp8_e4m3, cp::stochastic_rounding>,
                   cp::cast_codec<dc::fp16, cp::round_nearest>,
                   cp::cast_codec<dc::bf16, cp::stochastic_rounding>,
                   cp::blockwise_codec<dc::fp8_e5m2, 128, cp::stochastic_rounding>,
                   cp::blockwise_codec<dc::int4, 128, cp::round_nearest>) {
  if (!dk::host_simd::enabled()) return;  // this CPU runs only the baseline: nothing to compare
  encode_paths<Codec>();
}

TEST_CASE_TEMPLATE("decode-apply compiled for AVX2 gives the baseline's bits with every merge", Codec,
                   cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int2, 128, cp::round_nearest>,
                   cp::blockwise_codec<dc::int8, 128, cp::round_nearest>,
                   cp::cast_codec<dc::bf16, cp::round_nearest>,
                   cp::chunk_topk_codec<64, 8, dc::int2, cp::round_nearest>) {
  if (!dk::host_simd::enabled()) return;  // this CPU runs only the baseline: nothing to compare
  decode_apply_paths<Codec>();
}
#endif
