// SPDX-License-Identifier: Apache-2.0
// Full DiLoCo runs with 4 worker threads on linear regression, against a
// reference simulation of the algorithm's definition in double precision
// with plain loops (linear_regression.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <mutex>
#include <random>
#include <vector>

#include "linear_regression.hpp"

namespace dc = diloco;
using namespace linear_regression;

namespace {

constexpr int workers = 4;
}  // namespace

TEST_CASE("4 workers: after every round all replicas equal the reference theta_global") {
  const auto data = make_data(workers);
  constexpr int h = 5, rounds = 6;
  const double inner_lr = 0.05, inner_mu = 0.9, outer_lr = 0.7, outer_mu = 0.9;
  const auto want = reference_rounds(data, workers, rounds, h, inner_lr, inner_mu, outer_lr, outer_mu);

  std::vector<std::vector<std::vector<float>>> seen(workers);  // [rank][round] replica after the round
  std::mutex mu;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    // Rank 0 starts from zeros, the others from garbage: the initial broadcast
    // must make them all start from rank 0's parameters.
    std::vector<float> w(features, m == 0 ? 0.0f : 42.0f + static_cast<float>(m));
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
        w, comm,
        {.inner_steps = h,
         .inner = {.lr = static_cast<float>(inner_lr), .momentum = static_cast<float>(inner_mu)},
         .outer = {.lr = static_cast<float>(outer_lr), .momentum = static_cast<float>(outer_mu)}});
    std::vector<float> g(features);
    int round = 0;
    for (int step = 0; step < h * rounds; ++step) {
      const auto gd = gradient(data, m, w);
      for (std::size_t j = 0; j < features; ++j) g[j] = static_cast<float>(gd[j]);
      if (t.step(g)) {
        ++round;
        std::lock_guard lock(mu);
        seen[static_cast<std::size_t>(m)].push_back(w);
      }
    }
    CHECK(round == rounds);
    CHECK(t.stats().rounds == static_cast<std::uint64_t>(rounds));
    CHECK(t.stats().inner_steps == static_cast<std::uint64_t>(h * rounds));
    // One fp32 all-reduce of the parameters plus the per-rank norm slots per
    // round, counted as a ring all-reduce; and the initial broadcast.
    const std::uint64_t per_round = dc::ring_all_reduce_bytes((features + workers) * sizeof(float), workers);
    CHECK(t.stats().last_round_bytes_sent == per_round);
    const std::uint64_t bcast_sent = m == workers - 1 ? 0 : features * sizeof(float);
    CHECK(t.stats().bytes_sent == per_round * rounds + bcast_sent);
    CHECK(t.stats().pseudo_gradient_norm > 0.0);
  });

  for (int r = 0; r < rounds; ++r) {
    CAPTURE(r);
    for (int m = 0; m < workers; ++m) {
      const auto& got = seen[static_cast<std::size_t>(m)][static_cast<std::size_t>(r)];
      // Identical replicas, bit for bit.
      CHECK(std::memcmp(got.data(), seen[0][static_cast<std::size_t>(r)].data(), features * sizeof(float)) == 0);
      // fp32 against the fp64 reference after up to 30 momentum steps.
      for (std::size_t j = 0; j < features; ++j)
        CHECK(got[j] == doctest::Approx(want[static_cast<std::size_t>(r)][j]).epsilon(2e-5));
    }
  }
}

TEST_CASE("H = 1 with outer SGD lr 1 and inner SGD is synchronous data-parallel SGD") {
  const auto data = make_data(workers);
  constexpr int steps = 12;
  constexpr float lr = 0.1f;
  // Data parallel SGD: w <- w - lr * mean_m grad_m(w), in double.
  std::vector<double> dp(features, 0.0);
  std::vector<std::vector<double>> dp_trace;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> mean(features, 0.0);
    for (int m = 0; m < workers; ++m) {
      const auto g = gradient(data, m, dp);
      for (std::size_t j = 0; j < features; ++j) mean[j] += g[j] / workers;
    }
    for (std::size_t j = 0; j < features; ++j) dp[j] -= lr * mean[j];
    dp_trace.push_back(dp);
  }

  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    std::vector<float> w(features, 0.0f);
    dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::threads> t(
        w, comm, {.inner_steps = 1, .inner = {.lr = lr}});
    std::vector<float> g(features);
    for (int s = 0; s < steps; ++s) {
      const auto gd = gradient(data, m, w);
      for (std::size_t j = 0; j < features; ++j) g[j] = static_cast<float>(gd[j]);
      REQUIRE(t.step(g));
      for (std::size_t j = 0; j < features; ++j)
        REQUIRE(w[j] == doctest::Approx(dp_trace[static_cast<std::size_t>(s)][j]).epsilon(1e-5));
    }
  });
}

TEST_CASE("AdamW inner, Nesterov outer, several tensors: replicas agree and follow DiLoCo computed in double") {
  const auto data = make_data(workers);
  std::vector<double> loss_first(workers), loss_last(workers);
  std::vector<std::vector<float>> final_global(workers);
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    // The weights split over three tensors of sizes 1, 2 and 3.
    std::vector<std::vector<float>> parts{std::vector<float>(1, 0.0f), std::vector<float>(2, 0.0f),
                                          std::vector<float>(3, 0.0f)};
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
        parts, comm, {.inner_steps = 10, .inner = {.lr = 0.02f, .weight_decay = 0.0f}});
    auto flat = [&] {
      std::vector<float> w;
      for (auto& p : parts) w.insert(w.end(), p.begin(), p.end());
      return w;
    };
    auto loss = [&](const std::vector<float>& w) {
      double l = 0;
      for (int k = 0; k < workers; ++k) {
        for (std::size_t r = 0; r < rows; ++r) {
          double pred = 0;
          for (std::size_t j = 0; j < features; ++j) pred += data.x[k][r * features + j] * w[j];
          l += (pred - data.y[k][r]) * (pred - data.y[k][r]) / (2.0 * rows * workers);
        }
      }
      return l;
    };
    loss_first[static_cast<std::size_t>(m)] = loss(flat());
    std::vector<std::vector<float>> grads{std::vector<float>(1), std::vector<float>(2), std::vector<float>(3)};
    for (int step = 0; step < 200; ++step) {
      const auto gd = gradient(data, m, flat());
      grads[0][0] = static_cast<float>(gd[0]);
      for (std::size_t j = 0; j < 2; ++j) grads[1][j] = static_cast<float>(gd[1 + j]);
      for (std::size_t j = 0; j < 3; ++j) grads[2][j] = static_cast<float>(gd[3 + j]);
      t.step(grads);
    }
    loss_last[static_cast<std::size_t>(m)] = loss(flat());
    // theta_global is the concatenation of the tensors, which equal it.
    const auto global = t.global_parameters();
    const auto w = flat();
    REQUIRE(global.size() == w.size());
    for (std::size_t j = 0; j < w.size(); ++j) CHECK(global[j] == w[j]);
    final_global[static_cast<std::size_t>(m)] = w;
  });
  for (int m = 0; m < workers; ++m) CHECK(loss_last[static_cast<std::size_t>(m)] == loss_last[0]);
  // The reference: DiLoCo (Douillard et al. 2023, Algorithm 1) in double.
  // Each worker keeps its AdamW state across rounds (PyTorch's AdamW:
  // m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr (m / (1 - b1^t))
  // / (sqrt(v / (1 - b2^t)) + eps), no weight decay here) and starts each
  // round from theta_global; the outer step is PyTorch's SGD with Nesterov
  // momentum on the mean pseudo-gradient Delta = theta - mean_w local_w:
  // b = mu b + Delta (b = Delta the first time), theta -= lr (Delta + mu b).
  constexpr std::size_t n = 6;
  constexpr double lr = 0.02, b1 = 0.9, b2 = 0.95, eps = 1e-8, outer_lr = 0.7, mu = 0.9;
  std::vector<double> theta(n, 0.0), buf(n, 0.0);
  std::vector<std::vector<double>> mom(workers, std::vector<double>(n, 0.0)), var = mom;
  int t = 0;
  for (int round = 0; round < 20; ++round) {
    std::vector<double> mean_local(n, 0.0);
    for (int k = 0; k < workers; ++k) {
      std::vector<double> w = theta;
      auto& mk = mom[static_cast<std::size_t>(k)];
      auto& vk = var[static_cast<std::size_t>(k)];
      for (int step = 0; step < 10; ++step) {
        const auto g = gradient(data, k, w);
        const int tk = t + step + 1;
        for (std::size_t j = 0; j < n; ++j) {
          mk[j] = b1 * mk[j] + (1 - b1) * g[j];
          vk[j] = b2 * vk[j] + (1 - b2) * g[j] * g[j];
          w[j] -= lr * (mk[j] / (1 - std::pow(b1, tk))) / (std::sqrt(vk[j] / (1 - std::pow(b2, tk))) + eps);
        }
      }
      for (std::size_t j = 0; j < n; ++j) mean_local[j] += w[j] / workers;
    }
    t += 10;
    for (std::size_t j = 0; j < n; ++j) {
      const double delta = theta[j] - mean_local[j];
      buf[j] = round == 0 ? delta : mu * buf[j] + delta;
      theta[j] -= outer_lr * (delta + mu * buf[j]);
    }
  }
  double largest = 0.0;
  for (double x : theta) largest = std::max(largest, std::fabs(x));
  for (int m = 0; m < workers; ++m)
    for (std::size_t j = 0; j < n; ++j) {
      CAPTURE(m);
      CAPTURE(j);
      // fp32 against double over 200 Adam steps: Adam's normalised steps
      // keep rounding at the level of lr x fp32's epsilon per step.
      CHECK(std::fabs(final_global[static_cast<std::size_t>(m)][j] - theta[j]) <= 1e-4 * largest);
    }
}
