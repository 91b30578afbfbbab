// SPDX-License-Identifier: Apache-2.0
// The lossy codecs on their own: round-trip error bounds from each format's
// definition, unbiased stochastic rounding, and the error-feedback identity.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/kernels/compressed_passes.hpp>
#include <limits>
#include <random>
#include <vector>

#include "codec_round_trip.hpp"
#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

// Every finite non-negative value of a 16-bit float format, from the
// format's definition (not from the code under test), in increasing order.
std::vector<double> fp16_grid() {
  std::vector<double> g;
  for (int m = 0; m < 1024; ++m) g.push_back(m * std::ldexp(1.0, -24));  // subnormals and 0
  for (int e = 1; e <= 30; ++e)
    for (int m = 0; m < 1024; ++m) g.push_back((1.0 + m / 1024.0) * std::ldexp(1.0, e - 15));
  g.push_back(65536.0);  // where the next binade would start: rounding up to it means overflow to inf
  return g;
}
std::vector<double> bf16_grid() {
  std::vector<double> g;
  for (int m = 0; m < 128; ++m) g.push_back(m * std::ldexp(1.0, -133));
  for (int e = 1; e <= 254; ++e)
    for (int m = 0; m < 128; ++m) g.push_back((1.0 + m / 128.0) * std::ldexp(1.0, e - 127));
  g.push_back(std::ldexp(1.0, 128));  // overflow marker, as for fp16
  return g;
}

// The nearest grid value to |x|, ties to the even (lower-mantissa) one: the
// grid index's parity is the mantissa's parity.
double nearest_even(const std::vector<double>& grid, double x) {
  const double a = std::fabs(x);
  auto it = std::lower_bound(grid.begin(), grid.end(), a);
  if (it == grid.end()) return std::copysign(INFINITY, x);
  if (*it == a || it == grid.begin()) return std::copysign(*it, x);
  const double hi = *it, lo = *(it - 1);
  const auto lo_index = static_cast<std::size_t>(it - 1 - grid.begin());
  double r;
  if (a - lo < hi - a)
    r = lo;
  else if (hi - a < a - lo)
    r = hi;
  else
    r = lo_index % 2 == 0 ? lo : hi;
  if (r == grid.back()) r = INFINITY;
  return std::copysign(r, x);
}

}  // namespace

TEST_CASE("bf16 and fp16 round to the nearest value of the format (ties to even)") {
  const auto g16 = fp16_grid();
  const auto gb = bf16_grid();
  cp::cast_codec<dc::fp16, cp::round_nearest> fp16;
  cp::cast_codec<dc::bf16, cp::round_nearest> bf16;
  // Magnitudes across fp16's whole range (subnormals included) and bf16's.
  auto v16 = random_values(64, 1, -26.0f, 15.9f);
  auto vb = random_values(64, 2, -130.0f, 127.0f);
  // Exact ties: midway between neighbours.
  v16[0] = static_cast<float>((g16[3000] + g16[3001]) / 2);
  v16[1] = static_cast<float>((g16[3001] + g16[3002]) / 2);
  v16[2] = static_cast<float>((g16[5] + g16[6]) / 2);  // subnormal tie
  v16[3] = 65519.0f;                                   // just below the overflow threshold
  v16[4] = 0.0f;
  v16[5] = -0.0f;
  vb[0] = static_cast<float>((gb[20000] + gb[20001]) / 2);
  vb[1] = static_cast<float>((gb[20001] + gb[20002]) / 2);
  vb[2] = std::numeric_limits<float>::denorm_min() * 3.0f;
  const auto r16 = round_trip(fp16, v16);
  const auto rb = round_trip(bf16, vb);
  for (std::size_t j = 0; j < v16.size(); ++j) {
    CAPTURE(v16[j]);
    CHECK(static_cast<double>(r16[j]) == nearest_even(g16, v16[j]));
  }
  for (std::size_t j = 0; j < vb.size(); ++j) {
    CAPTURE(vb[j]);
    CHECK(static_cast<double>(rb[j]) == nearest_even(gb, vb[j]));
  }
  // Beyond fp16's range: inf, which the round's finiteness check rejects.
  const auto big = round_trip(fp16, std::vector<float>{65520.0f, -1e6f, 65504.0f});
  CHECK(std::isinf(big[0]));
  CHECK(std::isinf(big[1]));
  CHECK(big[2] == 65504.0f);
  // NaN stays NaN.
  CHECK(std::isnan(round_trip(bf16, std::vector<float>{NAN})[0]));
}

TEST_CASE("bf16's branch-free rounding equals the generic neighbour rounding on every bit pattern class") {
  // Every sign/exponent combination with a spread of mantissas, plus random
  // patterns: specials, subnormals, ties, the overflow boundary.
  std::vector<std::uint32_t> patterns;
  for (std::uint32_t se = 0; se < 512; ++se)
    for (std::uint32_t m : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u, 0xffffu, 0x10000u, 0x7fffffu, 0x7f8000u})
      patterns.push_back((se << 23) | m);
  std::mt19937 rng(99);
  for (int i = 0; i < 200000; ++i) patterns.push_back(static_cast<std::uint32_t>(rng()));
  for (std::uint32_t u : patterns) {
    const float x = dc::kernels::bits_float(u);
    CAPTURE(u);
    REQUIRE(dc::kernels::bf16_round_nearest(x) == dc::kernels::encode_float16<dc::kernels::bf16_format>(x, -1.0f));
  }
}

TEST_CASE("block-wise int8/int4: error <= scale/2 per element with round to nearest") {
  auto check_bound = [](const auto& codec, const std::vector<float>& v, float levels) {
    const auto back = round_trip(codec, v);
    float amax = 0.0f;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    // scale/2 from the definition, plus fp32 rounding of the product
    // q * (amax / L): at most one ulp of the value (or of the smallest
    // subnormal).
    const double half_step = static_cast<double>(amax) / levels / 2.0;
    for (std::size_t j = 0; j < v.size(); ++j) {
      const double err = std::fabs(static_cast<double>(v[j]) - back[j]);
      const double ulp = std::max(std::fabs(static_cast<double>(v[j])) * 0x1p-23, 0x1p-149);
      REQUIRE(err <= half_step + ulp);
    }
    return back;
  };
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{127}, std::size_t{128}}) {
    CAPTURE(n);
    cp::blockwise_codec<dc::int8, 128, cp::round_nearest> i8;
    cp::blockwise_codec<dc::int4, 128, cp::round_nearest> i4;
    const auto v = random_values(n, static_cast<unsigned>(n) + 3, -6.0f, 3.0f);
    check_bound(i8, v, 127.0f);
    check_bound(i4, v, 7.0f);
  }
  SUBCASE("odd counts for int4, several block sizes") {
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{63}}) {
      cp::blockwise_codec<dc::int4, 64, cp::round_nearest> i4;
      check_bound(i4, random_values(n, 9, -3.0f, 3.0f), 7.0f);
    }
  }
  SUBCASE("a block of zeros decodes to zeros") {
    cp::blockwise_codec<dc::int8, 128, cp::round_nearest> i8;
    const auto back = check_bound(i8, std::vector<float>(100, 0.0f), 127.0f);
    for (float x : back) CHECK(x == 0.0f);
  }
  SUBCASE("one huge outlier: the outlier is exact, the rest within scale/2") {
    cp::blockwise_codec<dc::int8, 128, cp::round_nearest> i8;
    auto v = random_values(128, 5, -10.0f, -8.0f);
    v[77] = 1e30f;
    const auto back = check_bound(i8, v, 127.0f);
    CHECK(back[77] == doctest::Approx(1e30).epsilon(1e-6));
  }
  SUBCASE("denormals") {
    cp::blockwise_codec<dc::int8, 128, cp::round_nearest> i8;
    cp::blockwise_codec<dc::int4, 128, cp::round_nearest> i4;
    std::vector<float> v(50);
    for (std::size_t j = 0; j < v.size(); ++j)
      v[j] = std::numeric_limits<float>::denorm_min() * static_cast<float>((j * 37) % 1000) * (j % 2 ? -1.0f : 1.0f);
    check_bound(i8, v, 127.0f);
    check_bound(i4, v, 7.0f);
  }
}

TEST_CASE("stochastic rounding is unbiased: the mean of many decodes converges to the input") {
  // Each decode is lo or hi (the neighbours of x) with P(hi) = (x-lo)/(hi-lo),
  // so it has mean x and variance <= step^2/4; the mean of K independent
  // decodes has standard deviation <= step / (2 sqrt K). We allow 6 of them.
  constexpr int draws = 4000;
  auto check = [&](const auto& codec, const std::vector<float>& x, auto step_of) {
    std::vector<double> sum(x.size(), 0.0);
    for (int d = 0; d < draws; ++d) {
      const auto back = round_trip(codec, x, dc::kernels::make_stream(7, static_cast<std::uint64_t>(d), 0, 1));
      for (std::size_t j = 0; j < x.size(); ++j) sum[j] += back[j];
    }
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double mean = sum[j] / draws;
      const double step = step_of(x, j);
      CAPTURE(x[j]);
      REQUIRE(std::fabs(mean - x[j]) <= 6.0 * step / (2.0 * std::sqrt(static_cast<double>(draws))));
    }
  };
  const auto x = random_values(32, 11, -4.0f, 4.0f);
  auto ulp_step = [](int mantissa_bits) {
    return [mantissa_bits](const std::vector<float>& v, std::size_t j) {
      int e;
      std::frexp(static_cast<double>(v[j]), &e);
      return std::ldexp(1.0, e - 1 - mantissa_bits);
    };
  };
  check(cp::cast_codec<dc::bf16, cp::stochastic_rounding>{}, x, ulp_step(7));
  check(cp::cast_codec<dc::fp16, cp::stochastic_rounding>{}, x, ulp_step(10));
  auto block_step = [](float levels) {
    return [levels](const std::vector<float>& v, std::size_t) {
      float amax = 0.0f;
      for (float t : v) amax = std::max(amax, std::fabs(t));
      return static_cast<double>(amax) / levels;
    };
  };
  check(cp::blockwise_codec<dc::int8, 128, cp::stochastic_rounding>{}, x, block_step(127.0f));
  check(cp::blockwise_codec<dc::int4, 128, cp::stochastic_rounding>{}, x, block_step(7.0f));
  // Round to nearest is not unbiased: a value at 0.3 of a step always
  // decodes to the lower neighbour.
  const float third = 0.3f * (8.0f / 7.0f);
  const auto rtn = round_trip(cp::blockwise_codec<dc::int4, 128, cp::round_nearest>{}, std::vector<float>{8.0f, third});
  CHECK(rtn[1] == 0.0f);
}

TEST_CASE("stochastic rounding is reproducible: same stream, same bytes") {
  const auto x = random_values(100, 12, -3.0f, 3.0f);
  cp::blockwise_codec<dc::int4, 128, cp::stochastic_rounding> c;
  const auto a = round_trip(c, x, 42), b = round_trip(c, x, 42), d = round_trip(c, x, 43);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  CHECK(std::memcmp(a.data(), d.data(), a.size() * 4) != 0);
}

TEST_CASE("top-k keeps the k largest magnitudes of each block, ties to the lower index") {
  auto c = cp::topk<16>::make_codec({.fraction = 0.25f});  // 4 of 16
  std::vector<float> v{0.1f, -5.0f, 0.2f, 3.0f, 0.0f, 3.0f, -0.3f, 0.0f, 7.0f, 0.0f, 0.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const auto back = round_trip(c, v);
  // Largest: 7 (index 8), -5 (1), then two of the three 3.0s at 3, 5, 11:
  // ties go to the lower indices 3 and 5.
  const std::vector<float> want{0, -5.0f, 0, 3.0f, 0, 3.0f, 0, 0, 7.0f, 0, 0, 0, 0, 0, 0, 0};
  CHECK(back == want);
  // A partial block keeps ceil(0.25 * len).
  const auto part = round_trip(c, std::vector<float>{1.0f, -2.0f, 0.5f});
  CHECK(part == std::vector<float>{0.0f, -2.0f, 0.0f});
  CHECK_THROWS_AS(cp::topk<16>::make_codec({.fraction = 0.0f}), dc::config_error);
}

TEST_CASE("error feedback: the decoded transmissions sum to the true deltas minus the final residual") {
  // Rounds of the real stage-1 pass (kernels::encode_pseudo_gradient) over
  // two tensors, with global - local = delta_r each round.
  using codec = cp::blockwise_codec<dc::int4, 32, cp::round_nearest>;
  const std::vector<std::size_t> sizes{45, 70};
  cp::block_layout layout(sizes, codec::block, 1);
  const std::size_t n = 115;
  std::vector<float> global(n, 0.0f), residual(n, 0.0f), next(n, 0.0f);
  std::vector<std::vector<float>> local{std::vector<float>(45), std::vector<float>(70)};
  std::vector<float*> ptrs{local[0].data(), local[1].data()};
  std::vector<std::size_t> offsets{0, 45};
  std::vector<std::byte> payload(layout.block_count() * codec::stride());
  std::vector<double> sent(n, 0.0), truth(n, 0.0);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  dc::exec::host ex;
  constexpr int rounds = 200;
  double max_residual = 0.0;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t t = 0; t < 2; ++t)
      for (auto& x : local[t]) x = -nd(rng);  // global is 0, so delta = -local
    for (std::size_t t = 0; t < 2; ++t)
      for (std::size_t j = 0; j < sizes[t]; ++j) truth[offsets[t] + j] += -static_cast<double>(local[t][j]);
    ex.transform_reduce(layout.block_count(),
                        dc::kernels::encode_pseudo_gradient<codec>{codec{}, layout.blocks(), {ptrs.data(), offsets.data()},
                                                                  global.data(), residual.data(), next.data(),
                                                                  payload.data(), codec::stride(), 0});
    std::swap(residual, next);
    // Decode what was sent, independently of the pass.
    for (std::size_t b = 0; b < layout.block_count(); ++b) {
      const auto blk = layout.blocks()[b];
      std::vector<float> dq(blk.len);
      codec{}.decode(payload.data() + b * codec::stride(), blk.len, dq.data());
      for (std::size_t j = 0; j < blk.len; ++j) sent[offsets[blk.tensor] + blk.start + j] += dq[j];
    }
    for (float e : residual) max_residual = std::max(max_residual, static_cast<double>(std::fabs(e)));
  }
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(sent[i] + residual[i] == doctest::Approx(truth[i]).epsilon(1e-4).scale(1.0));
  }
  // The residual stays bounded (int4 with unit-normal deltas: a block's
  // amax is a few units and the residual at most half a step above the
  // incoming values' scale); it does not grow with the number of rounds.
  CHECK(max_residual < 2.0);
}

namespace {

// A block's ||delta||^2 in the order docs/internals.md defines: element j
// into fp32 lane j % lanes, in order; the lanes added as a halving tree
// (lane l += lane l + w for w = lanes / 2, ..., 1); the total to double.
double documented_block_norm(const std::vector<float>& delta, std::size_t lanes) {
  std::vector<float> acc(lanes, 0.0f);
  for (std::size_t j = 0; j < delta.size(); ++j) acc[j % lanes] += delta[j] * delta[j];
  for (std::size_t w = lanes / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return static_cast<double>(acc[0]);
}

template <std::size_t B>
void check_documented_block_norms(std::size_t lanes) {
  CAPTURE(B);
  using codec = cp::blockwise_codec<dc::int8, B, cp::round_nearest>;
  const std::size_t n = 6 * B + B / 2 + 3;  // full blocks and a partial one
  const cp::block_layout layout({n}, B, 1);
  // Magnitudes over many binades, so that the order of the sums shows in
  // their bits.
  std::vector<float> global(n, 0.0f), local = random_values(n, static_cast<unsigned>(B), -6.0f, 6.0f);
  std::vector<float*> ptrs{local.data()};
  std::vector<std::size_t> offsets{0};
  std::vector<std::byte> payload(layout.block_count() * codec::stride());
  const dc::kernels::encode_pseudo_gradient<codec> pass{codec{}, layout.blocks(), {ptrs.data(), offsets.data()},
                                                        global.data(), nullptr, nullptr, payload.data(),
                                                        codec::stride(), 0};
  std::size_t other_order_differs = 0;
  for (std::size_t b = 0; b < layout.block_count(); ++b) {
    const auto blk = layout.blocks()[b];
    std::vector<float> delta(blk.len);
    for (std::size_t j = 0; j < blk.len; ++j) delta[j] = global[blk.start + j] - local[blk.start + j];
    const double want = documented_block_norm(delta, lanes), got = pass(b).a;
    CHECK(std::memcmp(&got, &want, sizeof got) == 0);
    other_order_differs += documented_block_norm(delta, lanes == 8 ? 16 : 8) != want;
  }
  CHECK(other_order_differs > 0);  // the data tells the orders apart
}

}  // namespace

TEST_CASE("a block's squared norms follow the documented order: about one fp32 lane per 16 elements, then a tree") {
  // docs/internals.md: 8 lanes up to B = 255, 64 at B = 1024, 256 from
  // B = 4096 on (the device team sums the same lanes and the same tree).
  CHECK(dc::kernels::norm_lanes(64) == 8);
  CHECK(dc::kernels::norm_lanes(255) == 8);
  CHECK(dc::kernels::norm_lanes(256) == 16);
  CHECK(dc::kernels::norm_lanes(1024) == 64);
  CHECK(dc::kernels::norm_lanes(4096) == 256);
  check_documented_block_norms<64>(8);
  check_documented_block_norms<128>(8);
  check_documented_block_norms<1024>(64);
  check_documented_block_norms<4096>(256);
}
