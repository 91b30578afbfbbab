// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <diloco/diloco.hpp>
#include <random>
#include <vector>

using diloco::exec::host;

TEST_CASE("for_each visits every index exactly once") {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, host::parallel_threshold - 1,
                        host::parallel_threshold, host::parallel_threshold + 1, std::size_t{100003}}) {
    CAPTURE(n);
    std::vector<int> hits(n, 0);
    host ex;
    ex.for_each(n, [&](std::size_t i) { hits[i] += 1; });
    for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
  }
}

TEST_CASE("transform_reduce sums exactly representable values exactly") {
  // sum_{i<n} i = n(n-1)/2 is exact in double for these n.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{9}, host::reduce_chunk - 1, host::reduce_chunk,
                        host::reduce_chunk + 1, std::size_t{200001}}) {
    CAPTURE(n);
    host ex;
    const double s = ex.transform_reduce(n, [](std::size_t i) { return static_cast<double>(i); });
    CHECK(s == static_cast<double>(n) * static_cast<double>(n == 0 ? 0 : n - 1) / 2.0);
  }
}

TEST_CASE("transform_reduce gives the same bits whatever the thread count") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(300007);
  for (auto& v : x) v = u(rng);
  auto f = [&](std::size_t i) { return static_cast<double>(x[i]) * static_cast<double>(x[i]) * 1.0000001; };
  host one(1), two(2), three(3);
  const double a = one.transform_reduce(x.size(), f);
  const double b = two.transform_reduce(x.size(), f);
  const double c = three.transform_reduce(x.size(), f);
  CHECK(std::memcmp(&a, &b, sizeof a) == 0);
  CHECK(std::memcmp(&a, &c, sizeof a) == 0);
  // And it is the sum (to double rounding).
  double ref = 0.0;
  for (float v : x) ref += static_cast<double>(v) * static_cast<double>(v) * 1.0000001;
  CHECK(a == doctest::Approx(ref).epsilon(1e-12));
}
