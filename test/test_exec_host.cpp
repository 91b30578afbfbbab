// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
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
  static_assert(host::elements_per_call<block_sum>() == 4096);
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

namespace {
// A codec-like pass with few calls (4096: chunk_topk's chunks of 4096 over
// 2^24 parameters, one reduction chunk): each call's term and thread.
struct few_heavy_calls {
  static constexpr std::size_t elements_per_call = 4096;
  const double* term;
  int* thread_of;
  double operator()(std::size_t i) const {
    thread_of[i] = thread_number();
    return term[i];
  }
};
// The same terms computed eight calls at a time, as reduce_shard::batch.
struct few_heavy_batches {
  static constexpr std::size_t elements_per_call = 4096;
  const double* term;
  int* thread_of;
  int* misaligned;
  double operator()(std::size_t i) const { return term[i]; }
  void batch(std::size_t i, std::size_t n, double* r) const {
    if (i % host::reduce_lanes != 0 || n > host::reduce_lanes) *misaligned = 1;
    for (std::size_t j = 0; j < n; ++j) {
      thread_of[i + j] = thread_number();
      r[j] = term[i + j];
    }
  }
};
struct two_sums {
  double a = 0, b = 0;
  two_sums& operator+=(const two_sums& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};
struct few_heavy_pairs {
  static constexpr std::size_t elements_per_call = 4096;
  const double* term;
  two_sums operator()(std::size_t i) const { return {term[i], term[i] * 3.0}; }
};
// transform_reduce's documented order over [0, n) within one chunk: lane l
// adds the terms at indices congruent to l modulo 8 in index order, then
// the lanes are added pairwise (l += l + 4, then + 2, then + 1).
double documented_chunk_sum(const std::vector<double>& t) {
  double lane[8] = {};
  for (std::size_t i = 0; i < t.size(); ++i) lane[i % 8] += t[i];
  for (std::size_t w = 4; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}
}  // namespace

TEST_CASE("transform_reduce shares fewer heavy calls than a chunk over the threads, with the chunk's own sum") {
  static_assert(host::elements_per_call<few_heavy_calls>() == 4096 &&
                host::elements_per_call<few_heavy_batches>() == 4096 &&
                host::elements_per_call<few_heavy_pairs>() == 4096);
  // Terms of mixed magnitudes and signs, so that any other order of the
  // additions gives other bits.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (const std::size_t n : {std::size_t{4096}, std::size_t{4093}, host::reduce_chunk}) {
    CAPTURE(n);
    std::vector<double> term(n);
    for (std::size_t i = 0; i < n; ++i) term[i] = u(rng) * std::ldexp(1.0, static_cast<int>(i % 61) - 30);
    const double want = documented_chunk_sum(term);
    host one(1), two(2);
    std::vector<int> t1(n, -1), t2(n, -1), tb(n, -1);
    const double a = one.transform_reduce(n, few_heavy_calls{term.data(), t1.data()});
    const double b = two.transform_reduce(n, few_heavy_calls{term.data(), t2.data()});
    int misaligned = 0;
    const double c = two.transform_reduce(n, few_heavy_batches{term.data(), tb.data(), &misaligned});
    CHECK(std::memcmp(&a, &want, sizeof a) == 0);
    CHECK(std::memcmp(&b, &want, sizeof b) == 0);
    CHECK(std::memcmp(&c, &want, sizeof c) == 0);
    CHECK(misaligned == 0);
    CHECK_FALSE(has(t2, -1));  // every call made
    const two_sums p = two.transform_reduce(n, few_heavy_pairs{term.data()});
    std::vector<double> tripled(term);
    for (double& x : tripled) x *= 3.0;
    const double want_b = documented_chunk_sum(tripled);
    CHECK(std::memcmp(&p.a, &want, sizeof want) == 0);
    CHECK(std::memcmp(&p.b, &want_b, sizeof want_b) == 0);
    if (two.threads() < 2) {
      MESSAGE("SKIPPED (sharing): built without OpenMP, every pass runs on the calling thread");
      continue;
    }
    // Both threads made calls, by operator() and by batch().
    CHECK(has(t2, 0));
    CHECK(has(t2, 1));
    CHECK(has(tb, 0));
    CHECK(has(tb, 1));
  }
  // Light calls stay on the caller: 4096 plain calls are below the threshold.
  host two(2);
  std::vector<int> light(4096, -1);
  two.transform_reduce(light.size(), [&](std::size_t i) {
    light[i] = thread_number();
    return 1.0;
  });
  CHECK_FALSE(has(light, 1));
}
