// SPDX-License-Identifier: Apache-2.0
// adaptive<C...> (DiLoCoX-style adaptive compression): the rule on crafted
// link times and errors picks each rung for the reason docs/algorithms.md
// gives; through the engine over the threads communicator every rank picks
// the same rung (M = 1, 2, 3, 4, 7), the bytes follow the rung, a switch
// hands the error-feedback residual over without losing mass, the choice is
// checkpoint state, and bad options are refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <limits>
#include <chrono>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

using reason = cp::adaptive_reason;

cp::adaptive_memory fresh(std::size_t rungs, const cp::adaptive_settings& s) {
  cp::adaptive_memory m;
  m.reset(rungs, s);
  return m;
}

}  // namespace

TEST_CASE("adaptive rule: crafted link times and errors choose each rung, for the documented reason") {
  // Three rungs moving 400, 100 and 25 bytes a round; budget 1 s; errors
  // above 0.2 are refused for 3 rounds; one round of history.
  const std::vector<std::size_t> bytes{400, 100, 25};
  const cp::adaptive_settings s{.budget_seconds = 1.0, .error_bound = 0.2, .window = 1, .retry_after = 3, .start = 0};
  auto m = fresh(3, s);
  CHECK(m.active == 0);
  CHECK(m.why() == reason::start);

  // Rung 0 took 2 s for 400 bytes: 0.005 s/B, so rungs predict 2, 0.5, 0.125 s:
  // rung 1 is the most accurate that fits.
  cp::adaptive_rule(m, s, bytes, 0, {.link_seconds = 2.0, .relative_error = 0.01});
  CHECK(m.active == 1);
  CHECK(m.why() == reason::within_budget);
  // Rung 1 took 0.2 s for 100 bytes: 0.002 s/B, rung 0 predicts 0.8 s: back up.
  cp::adaptive_rule(m, s, bytes, 1, {.link_seconds = 0.2, .relative_error = 0.05});
  CHECK(m.active == 0);
  CHECK(m.why() == reason::within_budget);
  // The link slowed: 8 s for 400 bytes (0.02 s/B): 8, 2, 0.5 s: only rung 2 fits.
  cp::adaptive_rule(m, s, bytes, 0, {.link_seconds = 8.0, .relative_error = 0.01});
  CHECK(m.active == 2);
  CHECK(m.why() == reason::within_budget);
  // Rung 2's error is 0.5 > 0.2: it fits but is refused; the most
  // compressed rung within the bound is rung 1 (its last error 0.05).
  cp::adaptive_rule(m, s, bytes, 2, {.link_seconds = 0.5, .relative_error = 0.5});
  CHECK(m.active == 1);
  CHECK(m.why() == reason::error_bound);
  CHECK(m.error_of(2) == 0.5);
  // 10 s for 100 bytes (0.1 s/B): nothing fits (40, 10, 2.5 s); rung 2 is
  // still refused (used 1 round ago < 3): the most compressed within the
  // bound, rung 1.
  cp::adaptive_rule(m, s, bytes, 1, {.link_seconds = 10.0, .relative_error = 0.05});
  CHECK(m.active == 1);
  CHECK(m.why() == reason::over_budget);
  // Rung 2 was last used 2 rounds ago: still refused.
  cp::adaptive_rule(m, s, bytes, 1, {.link_seconds = 10.0, .relative_error = 0.05});
  CHECK(m.active == 1);
  // 3 rounds: its refusal has aged out, it is tried again.
  cp::adaptive_rule(m, s, bytes, 1, {.link_seconds = 10.0, .relative_error = 0.05});
  CHECK(m.active == 2);
  CHECK(m.why() == reason::over_budget);

  // Every rung above the bound: the most accurate, for the error.
  auto all_bad = fresh(3, s);
  cp::adaptive_rule(all_bad, s, bytes, 0, {.link_seconds = 0.1, .relative_error = 0.3});
  CHECK(all_bad.active == 1);  // rungs 1 and 2 never measured: within the bound
  cp::adaptive_rule(all_bad, s, bytes, 1, {.link_seconds = 0.1, .relative_error = 0.4});
  cp::adaptive_rule(all_bad, s, bytes, 2, {.link_seconds = 0.1, .relative_error = 0.6});
  CHECK(all_bad.active == 0);
  CHECK(all_bad.why() == reason::error_bound);
}

TEST_CASE("adaptive rule: the budget defaults to a share of the agreed compute time; the window averages") {
  const std::vector<std::size_t> bytes{400, 100};
  // No fixed budget: half the compute time between rounds.
  const cp::adaptive_settings s{.budget_seconds = 0.0, .budget_share = 0.5, .window = 2};
  auto m = fresh(2, s);
  // No compute time measured yet (first round): no budget, every rung fits.
  cp::adaptive_rule(m, s, bytes, 0, {.link_seconds = 4.0, .relative_error = 0.01, .compute_seconds = 0.0});
  CHECK(m.active == 0);
  CHECK(m.budget(s) == 0.0);
  // Compute 4 s: budget 2 s; 0.01 s/B (mean of 4/400 and 4/400): rung 0
  // predicts 4 s, rung 1 1 s.
  cp::adaptive_rule(m, s, bytes, 0, {.link_seconds = 4.0, .relative_error = 0.01, .compute_seconds = 4.0});
  CHECK(m.budget(s) == 2.0);
  CHECK(m.active == 1);
  // Rung 1 at 0.2 s for 100 B (0.002 s/B): the window's mean is
  // (0.01 + 0.002) / 2 = 0.006 s/B, rung 0 predicts 2.4 s > 2: stay on 1.
  cp::adaptive_rule(m, s, bytes, 1, {.link_seconds = 0.2, .relative_error = 0.1, .compute_seconds = 4.0});
  CHECK(m.mean_seconds_per_byte() == doctest::Approx(0.006));
  CHECK(m.active == 1);
  // Once more at 0.002 s/B the window holds only fast samples: 0.8 s fits.
  cp::adaptive_rule(m, s, bytes, 1, {.link_seconds = 0.2, .relative_error = 0.1, .compute_seconds = 4.0});
  CHECK(m.active == 0);
}

namespace {

using ef8 = cp::error_feedback<cp::blockwise<dc::int8, 128>>;
using ef4 = cp::error_feedback<cp::blockwise<dc::int4, 128>>;
using ef2 = cp::error_feedback<cp::blockwise<dc::int2, 128>>;
using ladder = cp::adaptive<ef8, ef4, ef2>;
template <class Sync = dc::sync::blocking>
using trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, ladder, dc::comm::threads, Sync>;

const std::vector<std::size_t> sizes{3000, 1000, 37};

// The pseudo-gradient of worker `rank` in round r (inner SGD at lr 1, one
// step: the gradient is the pseudo-gradient).
std::vector<std::vector<float>> deltas(int rank, int r) {
  std::vector<std::vector<float>> g;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    g.push_back(random_normals(sizes[k], static_cast<std::uint32_t>(1000 * r + 10 * rank + k)));
  return g;
}

struct run_result {
  std::vector<std::vector<dc::compression_choice>> choices;  // per rank, per round
  std::vector<std::vector<float>> global;                   // per rank
  std::vector<std::uint64_t> bytes;                         // rank 0: bytes sent per round
};

template <class Sync = dc::sync::blocking>
run_result run(int workers, int rounds, cp::adaptive_settings rule, typename Sync::options sync = {}) {
  run_result out;
  out.choices.resize(static_cast<std::size_t>(workers));
  out.global.resize(static_cast<std::size_t>(workers));
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    trainer<Sync> t(theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rule = rule}, .sync = sync});
    const auto r0 = static_cast<std::size_t>(comm.rank());
    for (int r = 1; r <= rounds; ++r) {
      const auto before = t.stats().bytes_sent;
      t.step(deltas(comm.rank(), r));
      if (comm.rank() == 0) out.bytes.push_back(t.stats().bytes_sent - before);
      out.choices[r0].push_back(t.stats().compression_choices.at(0));
    }
    t.finish();
    const auto g = t.global_parameters();
    out.global[r0].assign(g.data(), g.data() + g.size());
  });
  return out;
}

void check_agreement(const run_result& res) {
  for (std::size_t k = 1; k < res.choices.size(); ++k) {
    CAPTURE(k);
    REQUIRE(res.choices[k].size() == res.choices[0].size());
    for (std::size_t r = 0; r < res.choices[0].size(); ++r) {
      CHECK(res.choices[k][r].used == res.choices[0][r].used);
      CHECK(res.choices[k][r].next == res.choices[0][r].next);
      CHECK(res.choices[k][r].reason == res.choices[0][r].reason);
      // The agreed numbers are the same bits on every rank.
      CHECK(std::memcmp(&res.choices[k][r].link_seconds, &res.choices[0][r].link_seconds, sizeof(double)) == 0);
      CHECK(std::memcmp(&res.choices[k][r].relative_error, &res.choices[0][r].relative_error, sizeof(double)) == 0);
    }
    CHECK(std::memcmp(res.global[k].data(), res.global[0].data(), res.global[0].size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("adaptive through the engine: a generous budget keeps the most accurate rung, on every rank, M = 1..7") {
  for (int m : {1, 2, 3, 4, 7}) {
    CAPTURE(m);
    // Start on int2; with 1e9 s to spare int8 fits from round 2 on.
    const auto res = run(m, 4, {.budget_seconds = 1e9, .start = 2});
    check_agreement(res);
    const auto& c = res.choices[0];
    CHECK(c[0].used == 2);
    CHECK(c[0].next == 0);
    CHECK(c[0].next_name == std::string("blockwise int8"));
    CHECK(c[0].reason == "within budget");
    for (std::size_t r = 1; r < c.size(); ++r) CHECK(c[r].used == 0);
    if (m > 1) {
      // The bytes of a round, from docs/algorithms.md ("Bytes per block")
      // and docs/internals.md (shards all-to-all, reduced shards
      // all-gathered): every rank sends M - 1 slots in each of the two
      // exchanges, a slot being the 64-byte header and the largest shard's
      // blocks at the codec's stride (int8: 4 + 128 = 132 bytes a block,
      // int2: 4 + 128 / 4 = 36), rounded up to 64. The tensors (3000, 1000,
      // 37) cut into 24 + 8 + 1 = 33 blocks; block b goes to shard
      // floor(first element x M / 4037), so the largest shard holds 17
      // blocks for M = 2, 11 for M = 3, 9 for M = 4 and 5 for M = 7 (by
      // hand: e.g. M = 2 splits at element 2018.5, after block 15 of the
      // first tensor). The vote and the rule's agreed figures are the same
      // in both rounds, so the difference is exact.
      const std::uint64_t largest = m == 2 ? 17 : m == 3 ? 11 : m == 4 ? 9 : 5;
      const auto slot = [&](std::uint64_t stride) { return (64 + largest * stride + 63) / 64 * 64; };
      const auto exchanges = 2 * static_cast<std::uint64_t>(m - 1);
      CAPTURE(res.bytes[0]);
      CAPTURE(res.bytes[1]);
      CHECK(res.bytes[1] - res.bytes[0] == exchanges * (slot(132) - slot(36)));
      // What is not a segment (the vote, the agreed figures) is a few
      // floats: less than one 64-byte header a rank.
      CHECK(res.bytes[0] >= exchanges * slot(36));
      CHECK(res.bytes[0] - exchanges * slot(36) < 64 * static_cast<std::uint64_t>(m));
      CHECK(res.bytes[1] == res.bytes[2]);
    }
  }
}

TEST_CASE("adaptive through the engine: a budget no rung fits takes the most compressed rung within the error bound") {
  // Relative errors of a normal pseudo-gradient in blocks of 128 (amax about
  // 2.6 sigma): int8 about 0.006, int4 about 0.1, int2 about 0.4 or more.
  // (A world of one moves no bytes: every rung fits there.)
  for (int m : {2, 3, 4}) {
    CAPTURE(m);
    const auto loose = run(m, 3, {.budget_seconds = 1e-12, .error_bound = 0.9});
    check_agreement(loose);
    CHECK(loose.choices[0][0].next == 2);
    CHECK(loose.choices[0][0].reason == "over budget");
    CHECK(loose.choices[0][2].used == 2);
    const auto tight = run(m, 4, {.budget_seconds = 1e-12, .error_bound = 0.25, .retry_after = 100, .start = 2});
    check_agreement(tight);
    const auto& c = tight.choices[0];
    CHECK(c[0].used == 2);
    CHECK(c[0].relative_error > 0.25);  // int2 is beyond the bound
    CHECK(c[0].next == 1);              // int4, the most compressed within it
    CHECK(c[1].used == 1);
    CHECK(c[1].relative_error < 0.25);
    CHECK(c[1].relative_error > 0.02);
    CHECK(c[3].used == 1);
  }
}

TEST_CASE("adaptive: switching rungs every round hands the residual over: sent + residual = sum of deltas") {
  // M = 1, inner and outer SGD at lr 1: theta_g(R) = -sum_r sent_r, and
  // error feedback (beta = 1) keeps sent + residual = sum of the deltas,
  // so theta_g(R) + sum_r delta_r = residual(R), whatever rung sent what.
  // A world of one moves no bytes, so every rung fits; a bound below int8's
  // error (about 0.006) with retry_after 1 alternates int8 and int4.
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    trainer<> t(theta, comm,
                {.inner_steps = 1,
                 .inner = {.lr = 1.0f},
                 .compress = {.rule = {.error_bound = 0.001, .retry_after = 1}}});
    std::vector<double> sum(3000 + 1000 + 37, 0.0);
    std::vector<std::size_t> used;
    for (int r = 1; r <= 12; ++r) {
      const auto d = deltas(0, r);
      std::size_t i = 0;
      for (const auto& tensor : d)
        for (float x : tensor) sum[i++] += x;
      t.step(d);
      used.push_back(t.stats().compression_choices[0].used);
    }
    // int8 (above the bound), int4 (never measured), int8 (its refusal aged 1 round), ...
    for (std::size_t r = 0; r < used.size(); ++r) CHECK(used[r] == r % 2);
    const auto g = t.global_parameters();
    const auto res = t.compression_residual();
    REQUIRE(res.size() == g.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(g[i]) + sum[i] - static_cast<double>(res[i])));
    CHECK(worst < 2e-4);  // fp32 rounding of 12 rounds of sums of magnitude ~10
    // The rung not in use holds no residual.
    for (const auto& e : t.state())
      if (!e.is_scalar && e.name.find(".residual") != std::string::npos && e.name.find(".rung0.") != std::string::npos) {
        bool zero = true;
        for (std::size_t i = 0; i < e.size; ++i) zero = zero && e.data[i] == 0.0f;
        CHECK(zero == (t.stats().compression_choices[0].next != 0));
      }
  });
}

TEST_CASE("adaptive under sync::streaming: each fragment chooses for itself, the same on every rank") {
  dc::comm::threads::world world(3);
  std::vector<std::vector<std::size_t>> nexts(3);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    trainer<dc::sync::streaming> t(theta, comm,
                                   {.inner_steps = 2,
                                    .inner = {.lr = 1.0f},
                                    .compress = {.rule = {.budget_seconds = 1e9, .start = 1}},
                                    .sync = {.fragments = 2}});
    for (int s = 1; s <= 8; ++s) t.step(deltas(comm.rank(), s));
    t.finish();
    const auto& c = t.stats().compression_choices;
    REQUIRE(c.size() == 2);
    for (const auto& f : c) {
      CHECK(f.used == 0);  // after the first round on int4, int8 fits
      nexts[static_cast<std::size_t>(comm.rank())].push_back(f.next);
    }
  });
  CHECK(nexts[1] == nexts[0]);
  CHECK(nexts[2] == nexts[0]);
}

TEST_CASE("adaptive: the rule's memory is checkpoint state; a reloaded instance continues on the same rung") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    const trainer<>::options opts{
        .inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rule = {.budget_seconds = 1e9, .start = 2}}};
    trainer<> t(theta, comm, opts);
    t.step(deltas(0, 1));
    REQUIRE(t.stats().compression_choices[0].next == 0);
    bool seen = false;
    for (const auto& e : t.state())
      if (e.name == "fragment.0.adaptive.active") {
        seen = true;
        CHECK(e.value == 0);
      }
    CHECK(seen);
    const auto bytes = t.save_bytes();
    std::vector<std::vector<float>> theta2;
    for (auto n : sizes) theta2.emplace_back(n, 0.0f);
    trainer<> u(theta2, comm, opts);
    for (const auto& e : u.state())
      if (e.name == "fragment.0.adaptive.active") CHECK(e.value == 2);  // a fresh one starts on rung 2
    u.load(bytes);
    for (const auto& e : u.state())
      if (e.name == "fragment.0.adaptive.active") CHECK(e.value == 0);
    u.step(deltas(0, 2));
    CHECK(u.stats().compression_choices[0].used == 0);
  });
}

TEST_CASE("adaptive options: bad settings are config_errors naming the setting; ranks must agree on them") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta{std::vector<float>(10, 0.0f)};
    const auto make = [&](cp::adaptive_settings rule) {
      trainer<> t(theta, comm, {.inner_steps = 1, .compress = {.rule = rule}});
    };
    CHECK_THROWS_WITH_AS(make({.start = 3}), doctest::Contains("rule.start"), dc::config_error);
    CHECK_THROWS_WITH_AS(make({.window = 0}), doctest::Contains("rule.window"), dc::config_error);
    CHECK_THROWS_WITH_AS(make({.error_bound = 0.0}), doctest::Contains("rule.error_bound"), dc::config_error);
    CHECK_THROWS_WITH_AS(make({.budget_seconds = -1.0}), doctest::Contains("rule.budget_seconds"), dc::config_error);
    CHECK_THROWS_WITH_AS(make({.budget_seconds = std::numeric_limits<double>::infinity()}),
                         doctest::Contains("rule.budget_seconds"), dc::config_error);
    CHECK_THROWS_WITH_AS(make({.retry_after = 0}), doctest::Contains("rule.retry_after"), dc::config_error);
  });
  dc::comm::threads::world two(2);
  int refused = 0;
  std::mutex mu;
  two.run([&](dc::comm::threads& comm) {
    std::vector<std::vector<float>> theta{std::vector<float>(10, 0.0f)};
    try {
      trainer<> t(theta, comm, {.inner_steps = 1, .compress = {.rule = {.error_bound = comm.rank() == 0 ? 0.5 : 0.4}}});
    } catch (const dc::config_error& e) {
      std::lock_guard lock(mu);
      refused += std::string(e.what()).find("rule.error_bound") != std::string::npos;
    }
  });
  CHECK(refused == 2);
}

TEST_CASE("adaptive: the fingerprint names every rung") {
  CHECK(cp::fingerprint<ladder>() ==
        "adaptive(blockwise int8, block 128, round to nearest, error feedback | blockwise int4, block 128, round to "
        "nearest, error feedback | blockwise int2, block 128, round to nearest, error feedback)");
}

TEST_CASE("adaptive with the budget measured from the inner phase: slow compute keeps int8, a tiny share drives int2") {
  // Budget = share x the agreed compute time between rounds. What the test
  // can know of the clock is what sleep_for guarantees: at least `compute`
  // per inner step (H = 2), so from round 2 on the budget is at least
  // share x 2 x compute, whatever the scheduler does; and at most
  // share x the run's whole wall time. With 100 ms a step the budget is
  // >= 0.2 s, and int8 stays while its predicted link time (reported
  // beside the choice) fits it, which an in-process exchange of a few KB
  // does by orders of magnitude even under TSan on two cores. With a share
  // of 1e-9 the budget is below a microsecond and no rung fits: int2, the
  // most compressed within the (loose) bound.
  struct seen {
    std::vector<dc::compression_choice> choices;
    double wall = 0.0;
  };
  const auto run_with = [](double share, std::chrono::milliseconds compute) {
    std::vector<std::vector<dc::compression_choice>> got(2);
    const auto t0 = std::chrono::steady_clock::now();
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      std::vector<std::vector<float>> theta;
      for (auto n : sizes) theta.emplace_back(n, 0.0f);
      trainer<> t(theta, comm,
                  {.inner_steps = 2, .inner = {.lr = 1.0f}, .compress = {.rule = {.budget_share = share, .error_bound = 0.9}}});
      for (int s = 1; s <= 8; ++s) {
        std::this_thread::sleep_for(compute);
        if (t.step(deltas(comm.rank(), s))) got[static_cast<std::size_t>(comm.rank())].push_back(t.stats().compression_choices[0]);
      }
    });
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(got[0].size() == 4);
    REQUIRE(got[1].size() == 4);
    for (std::size_t r = 0; r < 4; ++r) {
      CHECK(got[0][r].next == got[1][r].next);
      CHECK(std::memcmp(&got[0][r].budget_seconds, &got[1][r].budget_seconds, sizeof(double)) == 0);
    }
    return seen{got[0], wall};
  };
  const auto next_of = [](const seen& s) {
    std::vector<std::size_t> out;
    for (const auto& c : s.choices) out.push_back(c.next);
    return out;
  };
  // Round 1 has no compute time measured yet (no budget): int8 stays.
  const auto slow = run_with(1.0, std::chrono::milliseconds(100));
  CHECK(slow.choices[0].budget_seconds == 0.0);
  for (std::size_t r = 1; r < 4; ++r) {
    CAPTURE(r);
    CHECK(slow.choices[r].budget_seconds >= 0.2);
    CHECK(slow.choices[r].budget_seconds <= slow.wall);
    MESSAGE("round ", r + 1, ": int8 predicted ", slow.choices[r].predicted_seconds, " s, budget ", slow.choices[r].budget_seconds, " s");
    CHECK(slow.choices[r].predicted_seconds <= slow.choices[r].budget_seconds);
  }
  CHECK(next_of(slow) == std::vector<std::size_t>{0, 0, 0, 0});
  const auto tiny = run_with(1e-9, std::chrono::milliseconds(0));
  for (std::size_t r = 1; r < 4; ++r) {
    CAPTURE(r);
    CHECK(tiny.choices[r].budget_seconds > 0.0);
    CHECK(tiny.choices[r].budget_seconds <= 1e-9 * tiny.wall);
    CHECK(tiny.choices[r].reason == "over budget");
  }
  CHECK(next_of(tiny) == std::vector<std::size_t>{0, 2, 2, 2});
}
