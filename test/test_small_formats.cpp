// SPDX-License-Identifier: Apache-2.0
// The block-wise small formats (fp8_e4m3, fp8_e5m2, fp4_e3m0, int2): their
// values against tables written from the formats' definitions, round trips
// within half the format's gap at the block's scale (round to nearest) and
// unbiased stochastic rounding, saturation, sub-byte packing and padding,
// and the receiver's refusal of codes the formats never write.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <limits>
#include <random>
#include <vector>

#include "codec_round_trip.hpp"
#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
namespace k = diloco::kernels;

namespace {

// One code of a format, from its definition alone.
struct entry {
  unsigned code;
  double value;
  bool valid;
};

// Sign, E exponent bits (bias), M mantissa bits; exponent field 0 holds
// m * 2^(1 - bias - M); `nan_inf(e, m)` says which codes are not numbers.
template <class NanInf>
std::vector<entry> float_table(int E, int M, int bias, NanInf nan_inf) {
  std::vector<entry> t;
  for (unsigned c = 0; c < (1u << (1 + E + M)); ++c) {
    const unsigned s = c >> (E + M), e = (c >> M) & ((1u << E) - 1u), m = c & ((1u << M) - 1u);
    const double mag = e == 0 ? m * std::ldexp(1.0, 1 - bias - M)
                              : (1.0 + m / std::ldexp(1.0, M)) * std::ldexp(1.0, static_cast<int>(e) - bias);
    t.push_back({c, s ? -mag : mag, !nan_inf(e, m)});
  }
  return t;
}
std::vector<entry> e4m3_table() {  // OCP E4M3FN: only S.1111.111 is NaN
  return float_table(4, 3, 7, [](unsigned e, unsigned m) { return e == 15 && m == 7; });
}
std::vector<entry> e5m2_table() {  // OCP E5M2: exponent 31 is inf (m = 0) or NaN
  return float_table(5, 2, 15, [](unsigned e, unsigned) { return e == 31; });
}
std::vector<entry> e3m0_table() {  // every code a value
  return float_table(3, 0, 3, [](unsigned, unsigned) { return false; });
}
std::vector<entry> int2_table() {  // the four documented levels
  return {{0, -3.0, true}, {1, -1.0, true}, {2, 1.0, true}, {3, 3.0, true}};
}

// The sorted distinct valid values of a table.
std::vector<double> values_of(const std::vector<entry>& t) {
  std::vector<double> v;
  for (const auto& e : t)
    if (e.valid) v.push_back(e.value);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Half the gap between the grid values around y (y within the grid's range).
double half_gap(const std::vector<double>& grid, double y) {
  auto it = std::lower_bound(grid.begin(), grid.end(), y);
  if (it == grid.end()) return 0.0;
  if (*it == y) return 0.0;
  if (it == grid.begin()) return 0.0;
  return (*it - *(it - 1)) / 2.0;
}

// Round to nearest: every element within half the grid's gap around it, at
// the block's scale amax / L, plus the fp32 rounding of y = v * (L / amax)
// and of the product q * (amax / L) (a few ulps of the value, or of the
// smallest subnormal).
template <class Codec>
std::vector<float> check_nearest(const Codec& codec, const std::vector<float>& v, const std::vector<double>& grid) {
  const auto back = round_trip(codec, v);
  float amax = 0.0f;
  for (float x : v) amax = std::max(amax, std::fabs(x));
  const double L = Codec::levels;
  for (std::size_t j = 0; j < v.size(); ++j) {
    const double y = static_cast<double>(v[j]) * L / amax;
    const double bound = amax > 0.0f ? half_gap(grid, y) * amax / L : 0.0;
    const double err = std::fabs(static_cast<double>(v[j]) - back[j]);
    const double slack = 4.0 * std::max(std::fabs(static_cast<double>(v[j])) * 0x1p-23, 0x1p-149) +
                         (amax > 0.0f ? 4.0 * std::fabs(y) * 0x1p-24 * amax / L : 0.0);
    CAPTURE(j);
    CAPTURE(v[j]);
    CAPTURE(back[j]);
    REQUIRE(err <= bound + slack);
    // The decoded value is a grid value at the block's scale.
    if (amax > 0.0f && std::isnormal(amax / static_cast<float>(L))) {
      const double g = static_cast<double>(back[j]) / (static_cast<double>(amax) / L);
      const auto it = std::lower_bound(grid.begin(), grid.end(), g - 1e-6 * std::max(1.0, std::fabs(g)));
      REQUIRE(it != grid.end());
      REQUIRE(std::fabs(*it - g) <= 1e-6 * std::max(1.0, std::fabs(g)));
    }
  }
  return back;
}

template <class Format, std::size_t B>
void nearest_everywhere(const std::vector<double>& grid) {
  using C = cp::blockwise_codec<Format, B, cp::round_nearest>;
  C codec;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, B - 1, B, std::size_t{3}, std::size_t{5}}) {
    if (n > B) continue;
    CAPTURE(n);
    check_nearest(codec, random_values(n, static_cast<unsigned>(n) + 17, -6.0f, 3.0f), grid);
  }
  SUBCASE("zeros decode to zeros") {
    for (float x : check_nearest(codec, std::vector<float>(B - 2, 0.0f), grid)) CHECK(x == 0.0f);
  }
  SUBCASE("one huge outlier is exact, the rest within the bound") {
    auto v = random_values(B, 5, -10.0f, -8.0f);
    v[B / 2 + 1] = 1e30f;
    const auto back = check_nearest(codec, v, grid);
    CHECK(back[B / 2 + 1] == doctest::Approx(1e30).epsilon(1e-6));
  }
  SUBCASE("denormals") {
    std::vector<float> v(B - 1);
    for (std::size_t j = 0; j < v.size(); ++j)
      v[j] = std::numeric_limits<float>::denorm_min() * static_cast<float>((j * 37) % 1000) * (j % 2 ? -1.0f : 1.0f);
    check_nearest(codec, v, grid);
  }
  SUBCASE("values at the grid points themselves come back exactly") {
    std::vector<float> v;
    // amax L / 8: the scale 1/8 and its inverse are exact.
    for (double g : grid) v.push_back(static_cast<float>(g / 8.0));
    v.resize(std::min(v.size(), B));
    v[0] = Format::levels / 8.0f;  // fix amax whatever was cut
    const auto back = round_trip(codec, v);
    for (std::size_t j = 0; j < v.size(); ++j) CHECK(back[j] == v[j]);
  }
}

}  // namespace

TEST_CASE("the grids' values and valid codes equal the tables from the formats' definitions") {
  auto compare = [](auto grid, const std::vector<entry>& table, std::size_t valid_count, double max, double min_pos) {
    std::size_t valid = 0;
    for (const auto& e : table) {
      CAPTURE(e.code);
      CHECK(grid.valid(e.code) == e.valid);
      if (!e.valid) continue;
      ++valid;
      CHECK(static_cast<double>(grid.value(e.code)) == e.value);
    }
    CHECK(valid == valid_count);
    const auto v = values_of(table);
    CHECK(v.back() == max);
    CHECK(grid.levels == static_cast<float>(max));
    CHECK(*std::upper_bound(v.begin(), v.end(), 0.0) == min_pos);
  };
  compare(k::grid<dc::fp8_e4m3>(), e4m3_table(), 254, 448.0, std::ldexp(1.0, -9));
  compare(k::grid<dc::fp8_e5m2>(), e5m2_table(), 248, 57344.0, std::ldexp(1.0, -16));
  compare(k::grid<dc::fp4_e3m0>(), e3m0_table(), 16, 16.0, 0.25);
  compare(k::grid<dc::int2>(), int2_table(), 4, 3.0, 1.0);
  // The E3M0 magnitudes written in docs/algorithms.md.
  CHECK(values_of(e3m0_table()) ==
        std::vector<double>{-16, -8, -4, -2, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2, 4, 8, 16});
}

TEST_CASE("encoding every value of each format gives its code (scale 1: the block's amax is the format's max)") {
  auto every_code = [](auto codec, const std::vector<entry>& table) {
    using C = decltype(codec);
    for (const auto& e : table) {
      if (!e.valid) continue;
      CAPTURE(e.code);
      // Element 0 fixes amax = L (scale 1); element 1 is the value.
      const std::vector<float> v{C::levels, static_cast<float>(e.value)};
      std::vector<std::byte> bytes;
      const auto back = round_trip(codec, v, 0, &bytes);
      CHECK(static_cast<double>(back[1]) == e.value);
      const unsigned got = C::code(bytes.data() + 4, 1);
      // Negative zero is written as +0 (the same value).
      const unsigned want = e.value == 0.0 ? 0u : e.code;
      if (e.value == 0.0 && std::is_same_v<C, cp::blockwise_codec<dc::int2, 4, cp::round_nearest>>) continue;
      CHECK(got == want);
    }
  };
  every_code(cp::blockwise_codec<dc::fp8_e4m3, 4, cp::round_nearest>{}, e4m3_table());
  every_code(cp::blockwise_codec<dc::fp8_e5m2, 4, cp::round_nearest>{}, e5m2_table());
  every_code(cp::blockwise_codec<dc::fp4_e3m0, 4, cp::round_nearest>{}, e3m0_table());
  every_code(cp::blockwise_codec<dc::int2, 4, cp::round_nearest>{}, int2_table());
}

TEST_CASE("round to nearest: ties go to the even code, beyond the largest value saturates") {
  // fp8_e4m3: 1.0625 lies halfway between 1 (0x38, even) and 1.125 (0x39).
  const auto g4 = k::grid<dc::fp8_e4m3>();
  CHECK(g4.round<false>(1.0625f, 0) == 1.0f);
  CHECK(g4.round<false>(1.1875f, 0) == 1.25f);  // between 1.125 (odd) and 1.25 (even)
  CHECK(g4.round<false>(-1.0625f, 0) == -1.0f);
  CHECK(g4.round<false>(464.0f, 0) == 448.0f);   // past max: saturates, never NaN
  CHECK(g4.round<false>(1e30f, 0) == 448.0f);
  CHECK(g4.round<true>(447.9f, 0.99f) == 448.0f);   // up when u * 32 < 31.9
  CHECK(g4.round<true>(447.9f, 0.999f) == 416.0f);
  CHECK(g4.round<false>(std::ldexp(1.0f, -10), 0) == 0.0f);       // half the smallest subnormal: tie to 0
  CHECK(g4.round<false>(std::ldexp(1.5f, -10), 0) == std::ldexp(1.0f, -9));
  const auto g5 = k::grid<dc::fp8_e5m2>();
  CHECK(g5.round<false>(60000.0f, 0) == 57344.0f);
  CHECK(g5.round<false>(-1e9f, 0) == -57344.0f);
  const auto g3 = k::grid<dc::fp4_e3m0>();
  CHECK(g3.round<false>(3.0f, 0) == 2.0f);     // 2 (code 4) and 4 (code 5): tie to even
  CHECK(g3.round<false>(6.0f, 0) == 8.0f);     // 4 (code 5) and 8 (code 6)
  CHECK(g3.round<false>(0.375f, 0) == 0.5f);   // 0.25 (code 1) and 0.5 (code 2)
  CHECK(g3.round<false>(0.125f, 0) == 0.0f);   // 0 (code 0) and 0.25 (code 1)
  CHECK(g3.round<false>(0.13f, 0) == 0.25f);
  CHECK(g3.round<false>(17.0f, 0) == 16.0f);
  const auto g2 = k::grid<dc::int2>();
  CHECK(g2.round<false>(0.0f, 0) == 1.0f);     // -1 (code 1) and +1 (code 2)
  CHECK(g2.round<false>(-1e-30f, 0) == -1.0f);
  CHECK(g2.round<false>(2.0f, 0) == 1.0f);     // +1 (code 2) and +3 (code 3)
  CHECK(g2.round<false>(-2.0f, 0) == -3.0f);   // -3 (code 0) and -1 (code 1)
  CHECK(g2.round<false>(2.01f, 0) == 3.0f);
  CHECK(g2.round<false>(3.5f, 0) == 3.0f);
  CHECK(g2.round<true>(3.0f, 0.999f) == 3.0f);
  CHECK(g2.round<true>(-3.0f, 0.0f) == -3.0f);
}

TEST_CASE("round to nearest: within half the format's gap at the block's scale (sizes 0, 1, B-1, B, odd)") {
  SUBCASE("fp8_e4m3") { nearest_everywhere<dc::fp8_e4m3, 64>(values_of(e4m3_table())); }
  SUBCASE("fp8_e5m2") { nearest_everywhere<dc::fp8_e5m2, 64>(values_of(e5m2_table())); }
  SUBCASE("fp4_e3m0") { nearest_everywhere<dc::fp4_e3m0, 64>(values_of(e3m0_table())); }
  SUBCASE("int2") { nearest_everywhere<dc::int2, 64>(values_of(int2_table())); }
}

TEST_CASE("stochastic rounding onto each grid: a neighbour every time, and unbiased") {
  // Each decode is lo or hi (the grid neighbours of x at the block's scale)
  // with P(hi) = (x - lo) / (hi - lo): mean x, variance <= gap^2 / 4, so the
  // mean of K decodes lies within 6 gap / (2 sqrt K) of x.
  constexpr int draws = 3000;
  auto check = [&](auto codec, const std::vector<double>& grid) {
    using C = decltype(codec);
    auto x = random_values(C::block, 31, -6.0f, 0.0f);  // |x| < 2
    x[0] = 2.0f;  // amax 2
    const double scale = 2.0 / C::levels;
    std::vector<double> sum(x.size(), 0.0);
    for (int d = 0; d < draws; ++d) {
      const auto back = round_trip(codec, x, dc::kernels::make_stream(3, static_cast<std::uint64_t>(d), 0, 1));
      for (std::size_t j = 0; j < x.size(); ++j) {
        const double y = x[j] / scale, g = back[j] / scale;
        auto hi = std::lower_bound(grid.begin(), grid.end(), y);
        REQUIRE(hi != grid.end());
        const double lo = *hi == y || hi == grid.begin() ? *hi : *(hi - 1);
        CAPTURE(y);
        CAPTURE(g);
        CAPTURE(*hi);
        CAPTURE(lo);
        REQUIRE((std::fabs(g - *hi) <= 1e-6 * std::fabs(*hi) || std::fabs(g - lo) <= 1e-6 * std::fabs(lo)));
        sum[j] += back[j];
      }
    }
    for (std::size_t j = 1; j < x.size(); ++j) {
      const double y = x[j] / scale;
      const double gap = 2.0 * half_gap(grid, y) * scale;
      CAPTURE(x[j]);
      REQUIRE(std::fabs(sum[j] / draws - x[j]) <= 6.0 * gap / (2.0 * std::sqrt(static_cast<double>(draws))) + 1e-12);
    }
  };
  check(cp::blockwise_codec<dc::fp8_e4m3, 32, cp::stochastic_rounding>{}, values_of(e4m3_table()));
  check(cp::blockwise_codec<dc::fp8_e5m2, 32, cp::stochastic_rounding>{}, values_of(e5m2_table()));
  check(cp::blockwise_codec<dc::fp4_e3m0, 32, cp::stochastic_rounding>{}, values_of(e3m0_table()));
  check(cp::blockwise_codec<dc::int2, 32, cp::stochastic_rounding>{}, values_of(int2_table()));
}

TEST_CASE("sub-byte packing: int2 four codes per byte from the low bits, fp4 two; padding is zero and checked") {
  cp::blockwise_codec<dc::int2, 8, cp::round_nearest> i2;
  std::vector<std::byte> bytes;
  // amax 3: scale 1, codes -3 -> 0, -1 -> 1, 1 -> 2, 3 -> 3.
  round_trip(i2, {3.0f, -3.0f, 1.0f, -1.0f, 1.0f}, 0, &bytes);
  CHECK(i2.stride() == 4 + 2);
  CHECK(static_cast<unsigned>(bytes[4]) == (3u | 0u << 2 | 2u << 4 | 1u << 6));
  CHECK(static_cast<unsigned>(bytes[5]) == 2u);  // element 4; the rest of the byte is padding
  auto forged = bytes;
  forged[5] = std::byte{0x06};  // a code in element 5's slot, beyond the block's 5 elements
  CHECK(std::string(i2.check(forged.data(), 5)) == "non-zero padding bits in a partial block's last byte");
  forged = bytes;
  round_trip(i2, {3.0f, -3.0f, 1.0f}, 0, &forged);
  forged[5] = std::byte{1};
  CHECK(std::string(i2.check(forged.data(), 3)) == "non-zero padding after a partial block");

  cp::blockwise_codec<dc::fp4_e3m0, 4, cp::round_nearest> f4;
  round_trip(f4, {16.0f, -0.25f, 2.0f}, 0, &bytes);
  CHECK(static_cast<unsigned>(bytes[4]) == (0x7u | 0x9u << 4));  // 16 = 0.111, -0.25 = 1.001
  CHECK(static_cast<unsigned>(bytes[5]) == 0x4u);                 // 2 = 0.100, padding nibble 0
}

TEST_CASE("codes the formats never write are refused before decode") {
  cp::blockwise_codec<dc::fp8_e4m3, 4, cp::round_nearest> e4;
  std::vector<std::byte> bytes;
  round_trip(e4, {1.0f, 2.0f, 3.0f, 4.0f}, 0, &bytes);
  for (unsigned nan : {0x7fu, 0xffu}) {
    auto f = bytes;
    f[6] = static_cast<std::byte>(nan);
    CHECK(std::string(e4.check(f.data(), 4)) == "NaN or infinity code (the format saturates and never writes one)");
  }
  auto f = bytes;
  f[6] = std::byte{0x7e};  // 448: a value, accepted
  CHECK(e4.check(f.data(), 4) == nullptr);
  cp::blockwise_codec<dc::fp8_e5m2, 4, cp::round_nearest> e5;
  round_trip(e5, {1.0f, 2.0f, 3.0f, 4.0f}, 0, &bytes);
  for (unsigned bad : {0x7cu, 0x7du, 0x7eu, 0x7fu, 0xfcu, 0xffu}) {
    f = bytes;
    f[5] = static_cast<std::byte>(bad);
    CAPTURE(bad);
    CHECK(e5.check(f.data(), 4) != nullptr);
  }
  f = bytes;
  f[5] = std::byte{0xfb};  // -57344
  CHECK(e5.check(f.data(), 4) == nullptr);
}

TEST_CASE("the policies carry their names, ids and bytes per parameter") {
  using E4 = cp::blockwise<dc::fp8_e4m3>;
  CHECK(std::string(E4::name) == "blockwise fp8_e4m3");
  CHECK(E4::codec::id == cp::codec_id::fp8_e4m3);
  CHECK(cp::blockwise<dc::fp8_e5m2>::codec::id == cp::codec_id::fp8_e5m2);
  CHECK(cp::blockwise<dc::fp4_e3m0>::codec::id == cp::codec_id::fp4_e3m0);
  CHECK(cp::blockwise<dc::int2>::codec::id == cp::codec_id::int2);
  // (4 + B * bits / 8) / B at B = 128.
  CHECK(E4::codec::stride() == 4 + 128);
  CHECK(cp::blockwise<dc::fp4_e3m0>::codec::stride() == 4 + 64);
  CHECK(cp::blockwise<dc::int2>::codec::stride() == 4 + 32);
}
