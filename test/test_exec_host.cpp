// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <diloco/diloco.hpp>
#include <random>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

using diloco::exec::host;

namespace {
// Which OpenMP thread ran each call (0 without OpenMP).
int thread_number() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}
// A pass whose every call stands for a block of 4096 elements, like the
// codec passes (kernels/compressed_passes.hpp).
struct block_pass {
  static constexpr std::size_t elements_per_call = 4096;
  int* thread_of;
  void operator()(std::size_t i) const { thread_of[i] = thread_number(); }
};
struct block_sum {
  static constexpr std::size_t elements_per_call = 4096;
  int* thread_of;
  double operator()(std::size_t i) const {
    thread_of[i] = thread_number();
    return 1.0;
  }
};
bool has(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

TEST_CASE("a functor's elements_per_call weighs n against the parallel threshold") {
  auto plain = [](std::size_t) {};
  static_assert(host::elements_per_call<block_pass>() == 4096);
  static_assert(host::elements_per_call<decltype(plain)>() == 1);
  static_assert(host::elements_per_call<diloco::kernels::reduce_shard<
                    diloco::compress::blockwise_codec<diloco::int8, 128, diloco::compress::round_nearest>>>() == 128);
  host two(2);
  if (two.threads() < 2) {
    MESSAGE("SKIPPED: built without OpenMP, every pass runs on the calling thread");
    return;
  }
  // 16 blocks of 4096 = 2^16 elements, above the threshold: both threads
  // take a share (static schedule); 16 plain calls stay on the caller.
  const std::size_t n = 2 * host::parallel_threshold / block_pass::elements_per_call;
  std::vector<int> t(n, -1);
  two.for_each(n, block_pass{t.data()});
  CHECK(has(t, 0));
  CHECK(has(t, 1));
  std::vector<int> u(n, -1);
  two.for_each(n, [&](std::size_t i) { u[i] = thread_number(); });
  CHECK_FALSE(has(u, 1));
  // transform_reduce parallelises by chunks of reduce_chunk calls: two
  // chunks of blocks are far above the threshold, and the sum is the same.
  const std::size_t m = host::reduce_chunk + 1;
  std::vector<int> w(m, -1);
  CHECK(two.transform_reduce(m, block_sum{w.data()}) == static_cast<double>(m));
  CHECK(has(w, 0));
  CHECK(has(w, 1));
}

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
