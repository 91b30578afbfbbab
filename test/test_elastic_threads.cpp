// SPDX-License-Identifier: Apache-2.0
// Elastic membership over comm::threads: workers leave (algorithm::leave)
// and join (world::spawn) between rounds; the group re-forms and the
// algorithm re-plans for the new M. Checked against rounds run by hand
// with the same memberships.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "diloco/diloco.hpp"

namespace dc = diloco;
using dc::comm::threads;

namespace {

constexpr std::size_t n = 6;
constexpr std::size_t H = 3;
constexpr float inner_lr = 0.1f, outer_lr = 0.7f, mu = 0.9f;

// Worker `id`'s objective 0.5 * |x - c_id|^2: the gradient is x - c_id.
std::vector<float> target(int id) {
  std::vector<float> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = static_cast<float>(id + 1) * 0.5f + static_cast<float>(i) * 0.25f;
  return c;
}

std::vector<float> initial() {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 1.0f - 0.1f * static_cast<float>(i);
  return x;
}

// The rounds by hand: each member runs H SGD steps from theta_global; the
// mean pseudo-gradient d takes one Nesterov step (torch.optim.SGD with
// nesterov=True: b = d on the first round, then b = mu*b + d; theta -= lr *
// (d + mu*b)).
std::vector<float> by_hand(const std::vector<std::vector<int>>& members_per_round) {
  const std::vector<float> x0 = initial();
  std::vector<double> theta(x0.begin(), x0.end()), b(n, 0.0);
  bool first = true;
  for (const auto& members : members_per_round) {
    std::vector<double> d(n, 0.0);
    for (int id : members) {
      const auto c = target(id);
      std::vector<double> x = theta;
      for (std::size_t s = 0; s < H; ++s)
        for (std::size_t i = 0; i < n; ++i) x[i] -= inner_lr * (x[i] - c[i]);
      for (std::size_t i = 0; i < n; ++i) d[i] += (theta[i] - x[i]) / static_cast<double>(members.size());
    }
    for (std::size_t i = 0; i < n; ++i) {
      b[i] = first ? d[i] : mu * b[i] + d[i];
      theta[i] -= outer_lr * (d[i] + mu * b[i]);
    }
    first = false;
  }
  return {theta.begin(), theta.end()};
}

using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, threads>;
trainer::options opts() {
  trainer::options o;
  o.inner_steps = H;
  o.inner = {.lr = inner_lr};
  o.outer = {.lr = outer_lr, .momentum = mu};
  return o;
}

// `rounds` rounds of worker `id`: H steps each with its own gradient.
void train(trainer& t, std::vector<float>& x, int id, int rounds) {
  const auto c = target(id);
  std::vector<float> g(n);
  for (int r = 0; r < rounds; ++r)
    for (std::size_t s = 0; s < H; ++s) {
      for (std::size_t i = 0; i < n; ++i) g[i] = x[i] - c[i];
      const bool applied = t.step(g);
      REQUIRE(applied == (s + 1 == H));
    }
}

}  // namespace

TEST_CASE("elastic threads: M goes 4 -> 3 -> 4 and theta_global follows the rounds run by hand") {
  threads::world world(4, std::chrono::seconds(60), threads::membership::elastic);
  std::mutex m;
  std::map<int, std::vector<float>> final_global;  // by worker id
  std::map<int, std::vector<int>> sizes;           // world size seen after each phase, by id
  world.run([&](threads& comm) {
    const int id = comm.rank();
    std::vector<float> x = initial();
    trainer t(x, comm, opts());
    train(t, x, id, 2);  // rounds 1, 2 with workers 0..3
    std::vector<int> seen{t.world_size()};
    if (id == 2) {
      t.leave();
      CHECK(t.left());
      CHECK_THROWS_AS(t.step(x), dc::state_error);
      std::lock_guard lock(m);
      sizes[id] = seen;
      return;
    }
    train(t, x, id, 1);  // round 3 with 0, 1, 3
    seen.push_back(t.world_size());
    if (id == 0) {
      world.spawn([&](threads& joiner) {
        std::vector<float> y(n, 123.0f);  // replaced by theta_global when admitted
        trainer u(y, joiner, opts());
        CHECK(u.world_size() == 4);
        CHECK(u.rank() == 3);
        for (std::size_t i = 0; i < n; ++i) CHECK(y[i] == u.global_parameters()[i]);
        train(u, y, 4, 2);  // rounds 5, 6
        auto g = u.global_parameters();
        std::lock_guard lock(m);
        final_global[4] = std::vector<float>(g.data(), g.data() + g.size());
        sizes[4] = {u.world_size()};
      });
      // The joiner is waiting before round 4 ends, so that round end admits it.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (world.waiting_joiners() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      REQUIRE(world.waiting_joiners() == 1);
    }
    train(t, x, id, 1);  // round 4 with 0, 1, 3; the joiner is admitted at its end
    seen.push_back(t.world_size());
    train(t, x, id, 2);  // rounds 5, 6 with 0, 1, 3, 4
    seen.push_back(t.world_size());
    auto g = t.global_parameters();
    std::lock_guard lock(m);
    final_global[id] = std::vector<float>(g.data(), g.data() + g.size());
    sizes[id] = seen;
    if (id == 3) CHECK(t.rank() == 2);  // renumbered after rank 2 left
    CHECK(t.stats().membership_changes == 2);
  });
  const auto want = by_hand({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 3}, {0, 1, 3}, {0, 1, 3, 4}, {0, 1, 3, 4}});
  REQUIRE(final_global.size() == 4);
  for (const auto& entry : final_global) {
    const auto& id = entry.first;  // not a structured binding: Clang 14 cannot capture one (INFO)
    const auto& g = entry.second;
    INFO("worker ", id);
    for (std::size_t i = 0; i < n; ++i) CHECK(g[i] == doctest::Approx(want[i]).epsilon(1e-5));
    CHECK(g == final_global.begin()->second);  // bitwise equal on every member
  }
  CHECK(sizes[2] == std::vector<int>{4});
  CHECK(sizes[0] == std::vector<int>{4, 3, 4, 4});
  CHECK(sizes[4] == std::vector<int>{4});
}

TEST_CASE("elastic threads: misuse is named") {
  SUBCASE("leave on a fixed world") {
    threads::world world(2);
    world.run([&](threads& comm) {
      std::vector<float> x = initial();
      trainer t(x, comm, opts());
      CHECK_THROWS_WITH_AS(t.leave(), doctest::Contains("elastic communicator"), dc::config_error);
    });
  }
  SUBCASE("leave in the middle of a round") {
    threads::world world(2, std::chrono::seconds(60), threads::membership::elastic);
    world.run([&](threads& comm) {
      std::vector<float> x = initial();
      trainer t(x, comm, opts());
      std::vector<float> g(n, 0.0f);
      t.step(g);
      CHECK_THROWS_WITH_AS(t.leave(), doctest::Contains("at inner step 1"), dc::state_error);
      t.step(g);
      t.step(g);
    });
  }
  SUBCASE("spawn on a fixed world") {
    threads::world world(1);
    world.run([&](threads&) {
      CHECK_THROWS_WITH_AS(world.spawn([](threads&) {}), doctest::Contains("elastic world"), dc::config_error);
    });
  }
  SUBCASE("a joiner that no round end admits is refused when the members finish") {
    threads::world world(2, std::chrono::seconds(60), threads::membership::elastic);
    CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
      std::vector<float> x = initial();
      trainer t(x, comm, opts());
      if (comm.rank() == 0) {
        world.spawn([&](threads& joiner) {
          std::vector<float> y = initial();
          trainer u(y, joiner, opts());
        });
        while (world.waiting_joiners() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }),
                         doctest::Contains("returned before a round end could admit it"), dc::comm_error);
  }
}
