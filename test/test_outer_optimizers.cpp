// SPDX-License-Identifier: Apache-2.0
// Outer optimizers against closed forms. Pseudo-gradients are made exact by
// construction: one inner SGD step with lr 1 from theta moves the replica to
// theta - g, so Delta_m = g_m (all values dyadic, no rounding in round 1).
#include <doctest/doctest.h>

#include <cmath>
#include <diloco/diloco.hpp>
#include <mutex>
#include <vector>

namespace dc = diloco;

TEST_CASE("Nesterov outer step: two rounds against the closed form") {
  // PyTorch SGD(nesterov=True, dampening=0) on gradient d:
  //   round 1: b1 = d1,            theta1 = theta0 - lr (d1 + mu b1)
  //   round 2: b2 = mu b1 + d2,    theta2 = theta1 - lr (d2 + mu b2)
  const double lr = 0.7, mu = 0.9;
  const std::vector<float> theta0{1.0f, -2.0f, 0.5f, 3.0f, 0.0f};
  // Per-rank inner gradients (= pseudo-gradients) for rounds 1 and 2.
  const std::vector<std::vector<float>> g1{{0.5f, 0.25f, -1.0f, 2.0f, 0.0f}, {0.25f, -0.75f, 0.5f, 1.0f, 0.125f}};
  const std::vector<std::vector<float>> g2{{0.125f, 1.0f, 0.0f, -0.5f, 0.25f}, {-0.5f, 0.5f, 0.25f, 0.5f, 0.375f}};

  std::vector<double> want1(theta0.size()), want2(theta0.size());
  for (std::size_t i = 0; i < theta0.size(); ++i) {
    const double d1 = (g1[0][i] + g1[1][i]) / 2.0;
    const double b1 = d1;
    want1[i] = theta0[i] - lr * (d1 + mu * b1);
    const double d2 = (g2[0][i] + g2[1][i]) / 2.0;
    const double b2 = mu * b1 + d2;
    want2[i] = want1[i] - lr * (d2 + mu * b2);
  }

  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> theta = theta0;
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
        theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
    CHECK(t.step(g1[r]));
    for (std::size_t i = 0; i < theta.size(); ++i) CHECK(theta[i] == doctest::Approx(want1[i]).epsilon(1e-6));
    CHECK(t.step(g2[r]));
    for (std::size_t i = 0; i < theta.size(); ++i) CHECK(theta[i] == doctest::Approx(want2[i]).epsilon(1e-6));
    const auto global = t.global_parameters();
    for (std::size_t i = 0; i < theta.size(); ++i) CHECK(global[i] == theta[i]);
    CHECK(t.stats().rounds == 2);
  });
}

TEST_CASE("Nesterov update functor: the first round sets the buffer to d") {
  const auto u1 = dc::outer::nesterov::make_update({}, 1);
  float theta = 1.0f, b = 123.0f;  // b's old value must be ignored on round 1
  u1(theta, 0.5f, &b, 1);
  CHECK(b == 0.5f);
  CHECK(theta == doctest::Approx(1.0 - 0.7 * (0.5 + 0.9 * 0.5)).epsilon(1e-7));
  const auto u2 = dc::outer::nesterov::make_update({}, 2);
  u2(theta, -0.25f, &b, 1);
  CHECK(b == doctest::Approx(0.9 * 0.5 - 0.25).epsilon(1e-7));
  CHECK(theta == doctest::Approx(1.0 - 0.7 * 0.95 - 0.7 * (-0.25 + 0.9 * (0.9 * 0.5 - 0.25))).epsilon(1e-6));
}

TEST_CASE("outer SGD with lr 1 and no momentum is model averaging") {
  // After H inner steps the replicas differ; the round must set every replica
  // and theta_global to their mean.
  constexpr int workers = 3;
  constexpr std::size_t n = 64;
  std::vector<std::vector<float>> before(workers);
  std::mutex mu;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int r = comm.rank();
    std::vector<float> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = 0.01f * static_cast<float>(i);
    dc::algorithm<dc::inner::adamw, dc::outer::sgd, dc::compress::none, dc::comm::threads> t(
        w, comm, {.inner_steps = 4, .inner = {.lr = 0.05f}});
    std::vector<float> g(n);
    for (int s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(static_cast<float>(i * (r + 1) + s));
      t.inner_step(g);
    }
    {
      std::lock_guard lock(mu);
      before[static_cast<std::size_t>(r)] = w;
    }
    comm.barrier();
    t.outer_round();
    for (std::size_t i = 0; i < n; ++i) {
      const double mean = (static_cast<double>(before[0][i]) + before[1][i] + before[2][i]) / 3.0;
      CHECK(w[i] == doctest::Approx(mean).epsilon(1e-6).scale(1.0));
    }
  });
}
