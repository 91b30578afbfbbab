// SPDX-License-Identifier: Apache-2.0
// The compressed mean over the threads communicator: within each codec's
// error bound of the exact mean for M = 1, 2, 3, 4, 7; non-finite values and
// corrupt bytes reject the round on every rank and change no state.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "compressed_mean_bounds.hpp"
#include "threads_link.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

using namespace compressed_mean_bounds;

template <class C>
using trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, C, dc::comm::threads>;

// One round from theta = 0 with inner SGD lr 1 and outer SGD lr 1: the
// replica gets -grad exactly, so delta_r = grad_r, and theta afterwards is
// minus the decoded mean. Returns rank 0's theta per tensor.
template <class C>
std::vector<std::vector<float>> run_round(int m, unsigned salt, typename C::options opts = {}) {
  std::vector<std::vector<std::vector<float>>> seen(static_cast<std::size_t>(m));
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    trainer<C> t(theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = opts});
    CHECK(t.step(deltas(comm.rank(), salt)));
    seen[static_cast<std::size_t>(comm.rank())] = theta;
  });
  for (int r = 1; r < m; ++r)
    for (std::size_t k = 0; k < sizes.size(); ++k)  // every replica identical, bit for bit
      REQUIRE(std::memcmp(seen[static_cast<std::size_t>(r)][k].data(), seen[0][k].data(), sizes[k] * 4) == 0);
  return seen[0];
}

}  // namespace

TEST_CASE("compressed mean within the codec's bound of the exact mean, M = 1, 2, 3, 4, 7") {
  for (int m : {1, 2, 3, 4, 7}) {
    CAPTURE(m);
    check_blockwise(m, 1, run_round<cp::blockwise<dc::int8, B>>(m, 1), 127.0f);
    check_blockwise(m, 2, run_round<cp::blockwise<dc::int4, B>>(m, 2), 7.0f);
    check_blockwise(m, 3, run_round<cp::error_feedback<cp::blockwise<dc::int4, B>>>(m, 3), 7.0f);
    check_cast(m, 4, run_round<cp::cast<dc::bf16>>(m, 4), 7, 0.0);
    check_cast(m, 5, run_round<cp::cast<dc::fp16>>(m, 5), 10, std::ldexp(1.0, -25));
    // Top-k keeping everything is the exact mean up to fp32 summation.
    const auto all = run_round<cp::topk<64>>(m, 6, {.fraction = 1.0f});
    check_cast(m, 6, all, 22, 0.0);
  }
}

TEST_CASE_TEMPLATE("small formats: the compressed mean within the format's bound, M = 1, 2, 3, 4, 7", F, dc::fp8_e4m3,
                   dc::fp8_e5m2, dc::fp4_e3m0, dc::int2) {
  for (int m : {1, 2, 3, 4, 7}) {
    CAPTURE(m);
    check_blockwise(m, 11, run_round<cp::blockwise<F, B>>(m, 11), bound_levels<F>());
    check_blockwise(m, 12, run_round<cp::error_feedback<cp::blockwise<F, B>>>(m, 12), bound_levels<F>());
    // Stochastic rounding: each stage within a whole gap (two half gaps).
    check_blockwise(m, 13, run_round<cp::blockwise<F, B, cp::stochastic_rounding>>(m, 13, {.seed = 5}),
                    bound_levels<F>() / 2.0f);
  }
}

TEST_CASE("the bytes on the wire are what the codec promises") {
  constexpr int m = 4;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    trainer<cp::error_feedback<cp::blockwise<dc::int8, B>>> t(theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
    t.step(deltas(comm.rank(), 7));
    // Blocks per tensor of 1, 37, 300, 129 elements at B = 128: 1 + 1 + 3 + 2
    // = 7, each 4 + 128 bytes; plus one 64-byte header per shard.
    const double total = 1 + 37 + 300 + 129;
    CHECK(t.stats().encoded_bytes_per_parameter == doctest::Approx((7 * 132 + m * 64) / total));
    // All-to-all and all-gather of equal slots: 2 (M - 1) slots sent.
    CHECK(t.stats().last_round_bytes_sent % (2 * (m - 1)) == 0);
    CHECK(t.stats().compression_error_norm > 0.0);
    CHECK(t.stats().compression_error_norm < 0.05 * t.stats().pseudo_gradient_norm);
  });
}

TEST_CASE("compressed rounds reject NaN on every rank and leave all state unchanged") {
  constexpr int m = 4;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    trainer<cp::error_feedback<cp::blockwise<dc::int8, B>>> t(theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
    CHECK(t.step(deltas(comm.rank(), 8)));  // a good round builds residuals
    const auto g = t.global_parameters();
    const auto e = t.compression_residual();
    REQUIRE(e.size() == g.size());
    const std::vector<float> g0(g.data(), g.data() + g.size()), e0(e.data(), e.data() + e.size());
    auto bad = deltas(comm.rank(), 9);
    if (comm.rank() == 1) bad[2][17] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(t.step(bad), doctest::Contains("non-finite pseudo-gradient from rank 1"), dc::numeric_error);
    CHECK(std::memcmp(g.data(), g0.data(), g0.size() * 4) == 0);
    CHECK(std::memcmp(e.data(), e0.data(), e0.size() * 4) == 0);
    CHECK(t.step(deltas(comm.rank(), 10)));
  });
}

TEST_CASE("fp16 overflow in the mean is rejected, not applied") {
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> theta(10, 0.0f);
    trainer<cp::cast<dc::fp16>> t(theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
    std::vector<float> g(10, 1.0f);
    g[3] = 1e6f;  // beyond fp16's range
    CHECK_THROWS_AS(t.step(g), dc::numeric_error);
    for (float x : theta) CHECK(x == 0.0f);
  });
}

namespace {

// A threads communicator whose all-to-all delivers one flipped byte to
// `victim` on the round numbered `on_call` (fault injection on a real
// exchange).
class flaky_link : public threads_host_link {
 public:
  flaky_link(dc::comm::threads& c, int victim, int on_call) : threads_host_link(c), victim_(victim), on_call_(on_call) {}
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) {
    threads().all_to_all(s, r);
    // Byte 80 of the slot from rank 1: inside its segment's payload (header 64 bytes, every
    // codec's payload here at least 36).
    if (++calls_ == on_call_ && rank() == victim_) r[r.size() / static_cast<std::size_t>(size()) + 80] ^= std::byte{0x10};
  }

 private:
  int victim_, on_call_, calls_ = 0;
};

}  // namespace

TEST_CASE_TEMPLATE("corrupt bytes in transit: every rank rejects the round with format_error", C,
                   cp::error_feedback<cp::blockwise<dc::int8>>, cp::blockwise<dc::fp8_e4m3>,
                   cp::error_feedback<cp::blockwise<dc::fp8_e5m2>>, cp::blockwise<dc::fp4_e3m0>,
                   cp::error_feedback<cp::blockwise<dc::int2>>) {
  constexpr int m = 3;
  std::atomic<int> precise{0};
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& inner) {
    flaky_link comm(inner, 2, 2);
    std::vector<float> theta(500, 0.0f);
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, C, flaky_link> t(theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
    std::vector<float> g(500);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i + 1) * static_cast<float>(comm.rank() + 1));
    CHECK(t.step(g));
    const auto gl = t.global_parameters();
    const std::vector<float> before(gl.data(), gl.data() + gl.size());
    expect_corrupt_round(comm.rank(), 2, [&] { t.step(g); }, precise);
    CHECK(std::memcmp(gl.data(), before.data(), before.size() * 4) == 0);
    CHECK(std::memcmp(theta.data(), before.data(), before.size() * 4) == 0);
    CHECK(t.step(g));  // the next round goes through
  });
  CHECK(precise.load() == 1);
}
