// SPDX-License-Identifier: Apache-2.0
// The event hook (algorithm_options::on_event, core/event.hpp): round
// summaries, rejections and membership changes from real runs over
// comm::threads, checked against values derived by hand (the ring
// all-reduce's byte count, the rounds a schedule runs, the norm of a
// pseudo-gradient of SGD with a constant gradient, who left and joined an
// elastic group), and the rule for a hook that throws.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "diloco/diloco.hpp"

namespace dc = diloco;
using dc::comm::threads;

namespace {

// Bytes a ring all-reduce of `bytes` sends per rank: 2(M-1)/M of them
// (Patarasuk & Yuan's bandwidth-optimal all-reduce), written out here.
std::uint64_t ring_bytes(std::uint64_t bytes, std::uint64_t m) { return 2 * (m - 1) * bytes / m; }

// Worker m's constant gradient: with plain SGD (no momentum, no decay) the
// replica moves by -lr * g each step, so after H steps the pseudo-gradient
// theta_global - theta_local is H * lr * g and its norm H * lr * ||g||.
std::vector<float> constant_gradient(std::size_t n, int m) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.5f + 0.25f * static_cast<float>(m) - 0.125f * static_cast<float>(i);
  return g;
}

double norm(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

using blocking_trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, threads>;

// The events each worker's hook received, by worker id: a worker appends
// to its own list while it trains and stores it once at the end.
struct event_log {
  std::mutex mu;
  std::map<int, std::vector<dc::event>> by_worker;
  void store(int id, std::vector<dc::event> mine) {
    std::lock_guard lock(mu);
    by_worker[id] = std::move(mine);
  }
};

// Blocking DiLoCo with plain inner SGD whose hook appends to `mine`.
blocking_trainer::options recording(std::size_t H, float lr, std::vector<dc::event>& mine) {
  return {.inner_steps = H, .inner = {.lr = lr}, .on_event = [&mine](const dc::event& e) { mine.push_back(e); }};
}

}  // namespace

TEST_CASE("no hook by default") {
  const blocking_trainer::options o{};
  CHECK_FALSE(o.on_event);
}

TEST_CASE("round events: indices 1..R, bytes from the ring all-reduce's closed form, the pseudo-gradient's norm") {
  constexpr int M = 4;
  constexpr std::size_t n = 12, H = 4, R = 5;
  constexpr float lr = 0.125f;
  event_log recorded;
  threads::world world(M);
  world.run([&](threads& comm) {
    const int m = comm.rank();
    std::vector<float> x(n, 1.0f);
    std::vector<dc::event> mine;
    blocking_trainer t(x, comm, recording(H, lr, mine));
    const auto g = constant_gradient(n, m);
    for (std::size_t s = 0; s < H * R; ++s) t.step(g);
    const auto s = t.stats();
    recorded.store(m, mine);
    // The last event repeats what stats() says of the last round.
    REQUIRE(!mine.empty());
    CHECK(mine.back().bytes_sent == s.last_round_bytes_sent);
    CHECK(mine.back().pseudo_gradient_norm == s.pseudo_gradient_norm);
  });
  // fp32 pseudo-gradients travel with one norm slot per rank.
  const std::uint64_t wire = (n + M) * sizeof(float);
  for (int m = 0; m < M; ++m) {
    CAPTURE(m);
    const auto& ev = recorded.by_worker[m];
    REQUIRE(ev.size() == R);
    const double want_norm = static_cast<double>(H) * lr * norm(constant_gradient(n, m));
    for (std::size_t r = 0; r < R; ++r) {
      CAPTURE(r);
      const dc::event& e = ev[r];
      CHECK(e.kind == dc::event_kind::round);
      CHECK(e.round == r + 1);
      CHECK(e.fragment == 0);
      CHECK(e.fragment_round == r + 1);
      CHECK(e.inner_step == (r + 1) * H);
      CHECK(e.rank == m);
      CHECK(e.world == M);
      CHECK(e.bytes_sent == ring_bytes(wire, M));
      CHECK(e.bytes_received == ring_bytes(wire, M));
      CHECK(e.pseudo_gradient_norm == doctest::Approx(want_norm).epsilon(1e-5));
      CHECK(e.compression_error_norm == 0.0);
      CHECK(e.blocked_seconds >= 0.0);
      CHECK(e.hidden_seconds == 0.0);  // a blocking schedule hides nothing
      CHECK_FALSE(e.compression.has_value());
    }
  }
}

TEST_CASE("round events under sync::streaming: one per fragment application, each with its fragment's bytes") {
  constexpr int M = 3;
  constexpr std::size_t H = 4, cycles = 3;
  const std::vector<std::size_t> sizes{5, 7};  // contiguous, P = 2: tensor p is fragment p
  using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, threads, dc::sync::streaming>;
  event_log recorded;
  threads::world world(M);
  world.run([&](threads& comm) {
    std::vector<std::vector<float>> p{std::vector<float>(sizes[0], 1.0f), std::vector<float>(sizes[1], -1.0f)};
    std::vector<std::vector<float>> g{std::vector<float>(sizes[0], 0.5f), std::vector<float>(sizes[1], 0.25f)};
    std::vector<dc::event> mine;
    trainer::options o{.inner_steps = H, .inner = {.lr = 0.1f}, .sync = {.fragments = 2}};
    o.on_event = recording(H, 0.1f, mine).on_event;
    trainer t(p, comm, o);
    for (std::size_t s = 0; s < H * cycles; ++s) t.step(g);
    recorded.store(comm.rank(), mine);
  });
  // Fragment p is applied after steps t = floor((p+1)H/P) (mod H): 2 and 4.
  for (int m = 0; m < M; ++m) {
    const auto& ev = recorded.by_worker[m];
    REQUIRE(ev.size() == 2 * cycles);
    for (std::size_t k = 0; k < ev.size(); ++k) {
      CAPTURE(k);
      const std::size_t p = k % 2, cycle = k / 2;
      CHECK(ev[k].kind == dc::event_kind::round);
      CHECK(ev[k].round == k + 1);
      CHECK(ev[k].fragment == p);
      CHECK(ev[k].fragment_round == cycle + 1);
      CHECK(ev[k].inner_step == cycle * H + (p + 1) * H / 2);
      CHECK(ev[k].bytes_sent == ring_bytes((sizes[p] + M) * sizeof(float), M));
    }
  }
}

TEST_CASE("round events under compress::adaptive carry the choice: the rung used is the one chosen the round before") {
  using ef8 = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 64>>;
  using ef4 = dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 64>>;
  using trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::adaptive<ef8, ef4>, threads>;
  constexpr int M = 2;
  constexpr std::size_t n = 256, H = 2, R = 6;
  event_log recorded;
  threads::world world(M);
  world.run([&](threads& comm) {
    std::vector<float> x(n, 1.0f);
    std::vector<dc::event> mine;
    trainer::options o{.inner_steps = H, .inner = {.lr = 0.1f}};
    o.compress.rule.start = 1;  // the first round on rung 1
    o.on_event = recording(H, 0.1f, mine).on_event;
    trainer t(x, comm, o);
    const auto g = constant_gradient(n, comm.rank());
    for (std::size_t s = 0; s < H * R; ++s) t.step(g);
    recorded.store(comm.rank(), mine);
  });
  for (int m = 0; m < M; ++m) {
    const auto& ev = recorded.by_worker[m];
    REQUIRE(ev.size() == R);
    for (std::size_t r = 0; r < R; ++r) {
      CAPTURE(r);
      REQUIRE(ev[r].compression.has_value());
      const std::size_t expected_used = r == 0 ? 1 : ev[r - 1].compression->next;
      CHECK(ev[r].compression->used == expected_used);
      CHECK(ev[r].compression->next_name == (ev[r].compression->next == 0 ? ef8::name : ef4::name));
      CHECK(ev[r].compression_error_norm > 0.0);  // a lossy rung
      // The same choice on every rank (the rule runs on agreed numbers).
      CHECK(ev[r].compression->next == recorded.by_worker[0][r].compression->next);
    }
  }
}

TEST_CASE("a non-finite pseudo-gradient fires a rejected event on every rank, then the call raises") {
  constexpr int M = 2;
  constexpr std::size_t n = 6, H = 2;
  event_log recorded;
  threads::world world(M);
  world.run([&](threads& comm) {
    const int m = comm.rank();
    std::vector<float> x(n, 1.0f);
    std::vector<dc::event> mine;
    blocking_trainer t(x, comm, recording(H, 0.1f, mine));
    auto g = constant_gradient(n, m);
    t.step(g);
    if (m == 1) g[3] = std::nanf("");
    CHECK_THROWS_AS(t.step(g), dc::numeric_error);
    g = constant_gradient(n, m);
    for (std::size_t s = 0; s < H; ++s) t.step(g);  // the next round is accepted
    recorded.store(m, mine);
    CHECK(t.stats().rejected_rounds == 1);
  });
  for (int m = 0; m < M; ++m) {
    CAPTURE(m);
    const auto& ev = recorded.by_worker[m];
    REQUIRE(ev.size() == 2);
    CHECK(ev[0].kind == dc::event_kind::rejected);
    CHECK(ev[0].round == 1);
    CHECK(ev[0].inner_step == H);
    CHECK_FALSE(ev[0].corrupt);
    CHECK(ev[0].problem.find("non-finite pseudo-gradient from rank 1") != std::string::npos);
    CHECK(ev[0].bytes_sent == ring_bytes((n + M) * sizeof(float), M));
    // A refused round is not counted: the next one applied is round 1.
    CHECK(ev[1].kind == dc::event_kind::round);
    CHECK(ev[1].round == 1);
    CHECK(ev[1].inner_step == 2 * H);
  }
}

TEST_CASE("membership events: a worker leaves 3 -> 2, one joins 2 -> 3, each named by rank") {
  constexpr std::size_t n = 4, H = 2;
  threads::world world(3, std::chrono::seconds(60), threads::membership::elastic);
  event_log recorded;  // the joiner is worker 3
  std::mutex mu;
  std::map<int, std::uint64_t> generation;
  auto run_rounds = [](blocking_trainer& t, int id, int rounds) {
    const auto g = constant_gradient(n, id);
    for (int r = 0; r < rounds; ++r)
      for (std::size_t s = 0; s < H; ++s) t.step(g);
  };
  world.run([&](threads& comm) {
    const int id = comm.rank();
    std::vector<float> x(n, 1.0f);
    std::vector<dc::event> mine;
    blocking_trainer t(x, comm, recording(H, 0.1f, mine));
    run_rounds(t, id, 1);  // round 1 with 0, 1, 2
    if (id == 1) {
      t.leave();
      recorded.store(id, mine);
      std::lock_guard lock(mu);
      generation[id] = comm.generation();
      return;
    }
    run_rounds(t, id, 1);  // round 2 with 0, 2 (ranks 0, 1)
    if (id == 0) {
      world.spawn([&](threads& joiner) {
        std::vector<float> y(n, 9.0f);
        std::vector<dc::event> its;
        blocking_trainer u(y, joiner, recording(H, 0.1f, its));
        run_rounds(u, 3, 1);  // round 4
        recorded.store(3, its);
        std::lock_guard lock(mu);
        generation[3] = joiner.generation();
      });
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (world.waiting_joiners() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      REQUIRE(world.waiting_joiners() == 1);
    }
    run_rounds(t, id, 1);  // round 3; the joiner is admitted at its end
    run_rounds(t, id, 1);  // round 4 with 0, 2, 3
    recorded.store(id, mine);
    std::lock_guard lock(mu);
    generation[id] = comm.generation();
  });

  using K = dc::event_kind;
  // The leaver: one round, then its own leaving.
  {
    const auto& ev = recorded.by_worker[1];
    REQUIRE(ev.size() == 2);
    CHECK(ev[0].kind == K::round);
    CHECK(ev[1].kind == K::membership);
    CHECK(ev[1].previous_rank == 1);
    CHECK(ev[1].previous_world == 3);
    CHECK(ev[1].rank == -1);
    CHECK(ev[1].world == 0);
    CHECK(ev[1].left == std::vector<int>{1});
    CHECK(ev[1].joined.empty());
  }
  // Workers 0 and 2: round 1, the leave (found at round 2's start), rounds
  // 2 and 3, the join (at round 3's end), round 4.
  for (int id : {0, 2}) {
    CAPTURE(id);
    const auto& ev = recorded.by_worker[id];
    REQUIRE(ev.size() == 6);
    const std::vector<K> kinds{K::round, K::membership, K::round, K::round, K::membership, K::round};
    for (std::size_t k = 0; k < kinds.size(); ++k) CHECK(ev[k].kind == kinds[k]);
    const int before = id == 0 ? 0 : 2, after = id == 0 ? 0 : 1;  // worker 2 becomes rank 1
    const dc::event& leave = ev[1];
    CHECK(leave.previous_world == 3);
    CHECK(leave.world == 2);
    CHECK(leave.previous_rank == before);
    CHECK(leave.rank == after);
    CHECK(leave.left == std::vector<int>{1});
    CHECK(leave.joined.empty());
    CHECK_FALSE(leave.after_failure);
    const dc::event& join = ev[4];
    CHECK(join.previous_world == 2);
    CHECK(join.world == 3);
    CHECK(join.previous_rank == after);
    CHECK(join.rank == after);
    CHECK(join.left.empty());
    CHECK(join.joined == std::vector<int>{2});  // joiners come last
    CHECK(join.generation > leave.generation);
    CHECK(join.generation == generation[id]);  // no change after it
    std::vector<std::uint64_t> rounds;
    for (const auto& e : ev)
      if (e.kind == K::round) rounds.push_back(e.round);
    CHECK(rounds == std::vector<std::uint64_t>{1, 2, 3, 4});
    CHECK(ev[5].world == 3);
  }
  // The joiner: its admission, then round 4.
  {
    const auto& ev = recorded.by_worker[3];
    REQUIRE(ev.size() == 2);
    CHECK(ev[0].kind == K::membership);
    CHECK(ev[0].previous_rank == -1);
    CHECK(ev[0].previous_world == 0);
    CHECK(ev[0].rank == 2);
    CHECK(ev[0].world == 3);
    CHECK(ev[0].joined == std::vector<int>{2});
    CHECK(ev[0].generation == recorded.by_worker[0][4].generation);
    CHECK(ev[1].kind == K::round);
    CHECK(ev[1].round == 4);
  }
}

// ------------------------------------------------------- a throwing hook

namespace {

struct hook_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// theta_global of every rank after `rounds` rounds; rank 0's hook throws
// on the events `throw_on` selects (none when it is empty), and every
// exception step() raises is counted.
struct thrown_run {
  std::vector<std::vector<float>> global;  // by rank
  std::vector<int> thrown;                 // hook_failure caught, by rank
  std::vector<std::uint64_t> rounds;       // stats().rounds, by rank
};

thrown_run run_with_hook(bool throwing) {
  constexpr int M = 2;
  constexpr std::size_t n = 8, H = 3, R = 4;
  thrown_run out{std::vector<std::vector<float>>(M), std::vector<int>(M, 0), std::vector<std::uint64_t>(M, 0)};
  std::mutex mu;
  threads::world world(M);
  world.run([&](threads& comm) {
    const int m = comm.rank();
    std::vector<float> x(n, 0.5f);
    blocking_trainer::options o{.inner_steps = H, .inner = {.lr = 0.1f, .momentum = 0.5f}};
    if (throwing && m == 0)
      o.on_event = [](const dc::event& e) {
        if (e.round % 2 == 0) throw hook_failure("hook failed at round " + std::to_string(e.round));
      };
    blocking_trainer t(x, comm, o);
    const auto g = constant_gradient(n, m);
    int thrown = 0;
    for (std::size_t s = 0; s < H * R; ++s) {
      try {
        const bool applied = t.step(g);
        CHECK(applied == ((s + 1) % H == 0));
      } catch (const hook_failure& e) {
        ++thrown;
        // Thrown from the step that applied an even round, once it was
        // applied: the round counts and the replica holds theta_global.
        CHECK((s + 1) % (2 * H) == 0);
        CHECK(t.stats().rounds == (s + 1) / H);
        CHECK(std::string(e.what()) == "hook failed at round " + std::to_string((s + 1) / H));
        for (std::size_t i = 0; i < n; ++i) CHECK(x[i] == t.global_parameters()[i]);
      }
    }
    auto gp = t.global_parameters();
    std::lock_guard lock(mu);
    out.global[static_cast<std::size_t>(m)].assign(gp.data(), gp.data() + gp.size());
    out.thrown[static_cast<std::size_t>(m)] = thrown;
    out.rounds[static_cast<std::size_t>(m)] = t.stats().rounds;
  });
  return out;
}

}  // namespace

TEST_CASE("a throwing hook: the call completes, then rethrows; state is as if the hook had returned") {
  const thrown_run quiet = run_with_hook(false);
  const thrown_run loud = run_with_hook(true);
  CHECK(loud.thrown == std::vector<int>{2, 0});  // rounds 2 and 4, rank 0 only
  CHECK(loud.rounds == std::vector<std::uint64_t>{4, 4});
  // Bit for bit the run whose hook never threw, on both ranks.
  CHECK(loud.global[0] == quiet.global[0]);
  CHECK(loud.global[1] == quiet.global[0]);
  CHECK(quiet.global[1] == quiet.global[0]);
}

TEST_CASE("a throwing hook on a rejected round: the algorithm's numeric_error is the one raised") {
  threads::world world(2);
  world.run([&](threads& comm) {
    std::vector<float> x(4, 1.0f);
    blocking_trainer t(x, comm,
                       {.inner_steps = 1,
                        .inner = {.lr = 0.1f},
                        .on_event = [](const dc::event& e) {
                          if (e.kind == dc::event_kind::rejected) throw hook_failure("rejected");
                        }});
    std::vector<float> g(4, comm.rank() == 0 ? std::numeric_limits<float>::infinity() : 1.0f);
    CHECK_THROWS_AS(t.step(g), dc::numeric_error);
    // Nothing is left over for the next call.
    g.assign(4, 1.0f);
    CHECK_NOTHROW(t.step(g));
    CHECK(t.stats().rounds == 1);
  });
}

TEST_CASE("a hook that throws on a membership event does not stall the group") {
  constexpr std::size_t H = 2;
  threads::world world(3, std::chrono::seconds(60), threads::membership::elastic);
  std::mutex mu;
  std::map<int, std::vector<float>> final_global;
  std::map<int, int> thrown;
  world.run([&](threads& comm) {
    const int id = comm.rank();
    std::vector<float> x(4, 1.0f);
    blocking_trainer::options o{.inner_steps = H, .inner = {.lr = 0.1f}};
    if (id == 0)
      o.on_event = [](const dc::event& e) {
        if (e.kind == dc::event_kind::membership) throw hook_failure("membership");
      };
    blocking_trainer t(x, comm, o);
    const auto g = constant_gradient(4, id);
    int count = 0;
    for (std::size_t s = 0; s < 3 * H; ++s) {
      if (id == 2 && s == H) {
        t.leave();  // after round 1
        return;
      }
      try {
        t.step(g);
      } catch (const hook_failure&) {
        ++count;  // at round 2's step, which also ran the round
        CHECK(s + 1 == 2 * H);
        CHECK(t.stats().rounds == 2);
      }
    }
    auto gp = t.global_parameters();
    std::lock_guard lock(mu);
    final_global[id].assign(gp.data(), gp.data() + gp.size());
    thrown[id] = count;
  });
  CHECK(thrown[0] == 1);
  CHECK(thrown[1] == 0);
  CHECK(final_global[0] == final_global[1]);
}
