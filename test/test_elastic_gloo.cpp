// SPDX-License-Identifier: Apache-2.0
// Elastic membership over comm::gloo with real processes on loopback TCP:
// a worker SIGKILLs itself (the DILOCO_FAULT hook, compiled in here with
// DILOCO_FAULT_INJECTION) at each stage of start-up and of a round; the
// survivors abort what was in flight, form the next generation through the
// file store and finish the run with identical theta_global. The binary is
// its own rank program (DILOCO_TEST_ROLE=train).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <diloco/comm/gloo.hpp>
#include <diloco/diloco.hpp>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "elastic_by_hand.hpp"
#include "process_harness.hpp"

namespace dc = diloco;
using gloo_comm = dc::comm::gloo;
using namespace std::chrono_literals;

namespace {

using harness::env_or;

constexpr std::size_t n = 256;
constexpr std::size_t H = 4;

// The objective 0.5 * |x - c|^2 of the worker started with rank `rank`,
// in outer round `round` (counted from 1): a function of both, so the test
// can replay the rounds by hand and see a lost contribution or a frozen
// theta_global.
float target_at(int rank, std::uint64_t round, std::size_t i) {
  return static_cast<float>(rank + 1) * 0.3f + static_cast<float>(round % 5) * 0.2f +
         static_cast<float>(i % 13) * 0.05f;
}
std::vector<float> target(int rank, std::uint64_t round) {
  std::vector<float> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = target_at(rank, round, i);
  return c;
}

constexpr float inner_lr = 0.1f, outer_lr = 0.7f, mu = 0.9f;  // outer: nesterov's defaults

// The blocking rounds by hand (elastic_by_hand.hpp).
std::vector<double> by_hand(const std::vector<std::vector<int>>& members_per_round) {
  return elastic_by_hand(n, H, inner_lr, outer_lr, mu, members_per_round, target_at);
}

std::string hex(const float* p, std::size_t count) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < count * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// One worker: trains until DILOCO_TEST_ROUNDS rounds are applied (and the
// group has DILOCO_TEST_WANT_SIZE workers, when set), then writes
// theta_global's hash, the group size, its rounds and membership changes to
// <dir>/theta.<pid>. The model is two tensors (streaming needs fragments).
// DILOCO_TEST_SYNC picks the schedule (blocking, streaming: P = 2, tau = 1,
// alpha = 0.5; delay; eager), DILOCO_TEST_LEAVE_AT=k makes it leave after
// round k (writing <dir>/left.<pid>), DILOCO_TEST_STEP_US slows every inner
// step, DILOCO_TEST_REJOIN=1 makes a worker dropped from the group join
// again as a new worker. A worker writes <dir>/changed.<pid> once it has
// seen the group re-form. Exit 0 on success, 3 on a comm_error, 4 otherwise.
template <class Sync>
int train_with(typename Sync::options so) {
  const std::string dir = env_or("DILOCO_TEST_DIR", ".");
  const auto rounds = static_cast<std::uint64_t>(std::atoi(env_or("DILOCO_TEST_ROUNDS", "6").c_str()));
  const int want_size = std::atoi(env_or("DILOCO_TEST_WANT_SIZE", "0").c_str());
  const auto leave_at = static_cast<std::uint64_t>(std::atoi(env_or("DILOCO_TEST_LEAVE_AT", "0").c_str()));
  const int step_us = std::atoi(env_or("DILOCO_TEST_STEP_US", "0").c_str());
  const bool rejoin = env_or("DILOCO_TEST_REJOIN", "0") == std::string("1");
  const std::string me = std::to_string(getpid());
  const int start_rank = std::atoi(env_or("DILOCO_RANK", "0").c_str());
  for (int attempt = 0;; ++attempt) {
    try {
      auto comm = gloo_comm::from_env();
      using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, gloo_comm, Sync>;
      typename trainer::options o;
      o.inner_steps = H;
      o.inner = {.lr = inner_lr};
      o.outer = {.lr = outer_lr, .momentum = mu};
      o.sync = so;
      std::vector<std::vector<float>> x(2, std::vector<float>(n / 2, 0.5f));
      trainer t(x, comm, o);
      std::vector<std::vector<float>> g(2, std::vector<float>(n / 2));
      std::uint64_t steps = 0;
      bool marked = false;
      while (t.stats().rounds < rounds || t.world_size() < want_size) {
        const auto c = target(start_rank, t.stats().rounds + 1);
        for (std::size_t k = 0; k < 2; ++k)
          for (std::size_t i = 0; i < n / 2; ++i) g[k][i] = x[k][i] - c[k * n / 2 + i];
        t.step(g);
        ++steps;
        if (t.stats().membership_changes > 0 && !marked) {
          harness::write_file(dir + "/changed." + me, std::to_string(t.world_size()));  // the group re-formed
          marked = true;
        }
        if (step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
        if (leave_at > 0 && steps == leave_at * H) {
          t.leave();
          harness::write_file(dir + "/left." + me, std::to_string(t.stats().rounds));
          return 0;
        }
      }
      t.finish();
      const auto theta = t.global_parameters();
      bool finite = true;
      for (std::size_t i = 0; i < theta.size(); ++i) finite = finite && std::isfinite(theta.data()[i]);
      std::string values;  // theta_global, exactly (hexadecimal floats)
      for (std::size_t i = 0; i < theta.size(); ++i) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%a\n", static_cast<double>(theta.data()[i]));
        values += buf;
      }
      harness::write_file(dir + "/values." + me, values);
      harness::write_file(dir + "/theta." + me,
                          hex(theta.data(), theta.size()) + " " + std::to_string(t.world_size()) + " " +
                              std::to_string(t.stats().rounds) + " " +
                              std::to_string(t.stats().membership_changes) + (finite ? "" : " nonfinite"));
      return 0;
    } catch (const dc::comm_error& e) {
      const bool dropped = std::string(e.what()).find("formed without it") != std::string::npos;
      const bool again = dropped && rejoin && attempt == 0;  // join again as a new worker
      harness::write_file(dir + (again ? "/refused." : "/error.") + me, e.what());
      if (again) continue;
      return 3;
    } catch (const std::exception& e) {
      harness::write_file(dir + "/error." + me, e.what());
      return 4;
    }
  }
}

int train() {
  const std::string sync = env_or("DILOCO_TEST_SYNC", "blocking");
  if (sync == "blocking") return train_with<dc::sync::blocking>({});
  if (sync == "streaming") return train_with<dc::sync::streaming>({.fragments = 2, .delay = 1, .alpha = 0.5f});
  if (sync == "delay") return train_with<dc::sync::one_step_delay>({});
  if (sync == "eager") return train_with<dc::sync::eager>({});
  std::fprintf(stderr, "unknown DILOCO_TEST_SYNC '%s'\n", sync.c_str());
  return 2;
}

struct finished {
  std::string hash;
  int size = 0;
  std::uint64_t rounds = 0;
  std::string rest;  // " nonfinite" when theta_global is not finite
};

struct result {
  std::vector<finished> thetas;  // each finished worker's report
  std::vector<std::vector<double>> values;  // each finished worker's theta_global
  std::vector<std::string> errors, left, refused;
};

result collect(const std::string& dir) {
  result r;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string text = name.find('.') == std::string::npos ? "" : harness::read_file(e.path().string());
    if (name.rfind("theta.", 0) == 0) {
      finished f;
      char hash[17] = {};
      unsigned long long rounds = 0, changes = 0;
      char rest[32] = {};
      if (std::sscanf(text.c_str(), "%16s %d %llu %llu%31[^\n]", hash, &f.size, &rounds, &changes, rest) >= 4) {
        f.hash = hash;
        f.rounds = rounds;
        f.rest = rest;
      }
      r.thetas.push_back(f);
    }
    if (name.rfind("values.", 0) == 0) {
      std::vector<double> v;
      const char* p = text.c_str();
      char* end = nullptr;
      for (double x = std::strtod(p, &end); end != p; x = std::strtod(p, &end)) v.push_back(x), p = end;
      r.values.push_back(v);
    }
    if (name.rfind("error.", 0) == 0) r.errors.push_back(text);
    if (name.rfind("left.", 0) == 0) r.left.push_back(text);
    if (name.rfind("refused.", 0) == 0) r.refused.push_back(text);
  }
  return r;
}

// Every finished worker has the same theta_global (bitwise), finite, in a
// group of `size` after at least `rounds` rounds.
void check_agree(const result& res, std::size_t workers, int size, std::uint64_t rounds) {
  for (const auto& e : res.errors) MESSAGE("error: ", e);
  REQUIRE(res.thetas.size() == workers);
  for (const auto& t : res.thetas) {
    CHECK(t.hash.size() == 16);
    CHECK(t.hash == res.thetas[0].hash);
    CHECK(t.size == size);
    CHECK(t.rounds >= rounds);
    CHECK(t.rest.empty());
  }
}

// Every finished worker's theta_global against the rounds replayed by hand
// with these members (by starting rank) in each round: fp32 against double,
// to 1e-5 relative, as test_elastic_threads.cpp (a lost contribution or a
// frozen theta_global moves it by more than 1e-2).
void check_by_hand(const result& res, const std::vector<std::vector<int>>& members_per_round) {
  const auto want = by_hand(members_per_round);
  REQUIRE(res.values.size() == res.thetas.size());
  for (const auto& v : res.values) {
    REQUIRE(v.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(v[i] == doctest::Approx(want[i]).epsilon(1e-5));
    }
  }
}

std::vector<std::string> env_for(const std::string& dir, int rank, int size, int timeout_ms, const std::string& fault) {
  std::vector<std::string> env{"DILOCO_TEST_ROLE=train",
                               "DILOCO_TEST_DIR=" + dir,
                               "DILOCO_RANK=" + std::to_string(rank),
                               "DILOCO_WORLD_SIZE=" + std::to_string(size),
                               "DILOCO_STORE=file://" + dir + "/store",
                               "DILOCO_RUN_ID=elastic",
                               "DILOCO_ELASTIC=1",
                               "DILOCO_TIMEOUT_MS=" + std::to_string(timeout_ms),
                               "DILOCO_TEST_ROUNDS=6",
                               "DILOCO_FAULT=" + fault};
  return env;
}

using harness::proc_state;
using harness::wait_for;

// Every process started but `skip` (-1: none) exited normally with `code`.
void check_exits(const harness::processes& ps, int code, int skip = -1) {
  for (std::size_t p = 0; p < ps.count(); ++p) {
    if (static_cast<int>(p) == skip) continue;
    INFO("process ", p, " ", harness::describe(ps.status(p)));
    CHECK((ps.status(p).exited && ps.status(p).code == code));
  }
}

}  // namespace

TEST_CASE("4 Gloo workers, one SIGKILLed at each stage: the 3 survivors finish with identical theta_global") {
  const int m = 4, victim = 2, timeout_ms = 1500;
  for (const std::string fault : {"startup:0", "all_gather:0", "broadcast:0", "inner:2", "pseudo_gradient:2",
                                  "all_reduce:2", "apply:2", "all_reduce:5"}) {
    CAPTURE(fault);
    harness::temp_dir d;
    harness::processes ps;
    const auto t0 = harness::clock::now();
    for (int r = 0; r < m; ++r)
      ps.start(env_for(d.path().string(), r, m, timeout_ms, r == victim ? fault : std::string("none:0")));
    ps.wait_all(60s);
    const double took = harness::seconds_between(t0, harness::clock::now());
    MESSAGE(fault, ": the run took ", took, " s");
    const auto& v = ps.status(victim);
    CHECK(v.signal == SIGKILL);
    CHECK_FALSE(v.timed_out);
    check_exits(ps, 0, victim);
    const result res = collect(d.path().string());
    check_agree(res, 3, 3, 6);
    for (const auto& t : res.thetas) CHECK(t.rounds == 6);
    // The rounds the victim took part in (docs/internals.md, "Elastic
    // membership"; core/fault.hpp: stage:round, round 0 = start-up): none
    // when it died at start-up; those before round k when it died in round
    // k before its contribution was summed (the survivors run round k
    // again without it); round k too when it died applying round k (every
    // member had the sum).
    const int all_rounds = fault == "apply:2" ? 2 : fault == "all_reduce:5" ? 4 : fault.back() == '2' ? 1 : 0;
    std::vector<std::vector<int>> members;
    for (int k = 1; k <= 6; ++k) members.push_back(k <= all_rounds ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1, 3});
    check_by_hand(res, members);
  }
}

TEST_CASE("a killed Gloo worker started again with its rank rejoins; all 4 end with the same theta_global") {
  const int m = 4, victim = 1, timeout_ms = 1500;
  harness::temp_dir d;
  const std::string dir = d.path().string();
  harness::processes ps;
  for (int r = 0; r < m; ++r) {
    auto env = env_for(dir, r, m, timeout_ms, r == victim ? "inner:2" : "none:0");
    env.push_back("DILOCO_TEST_WANT_SIZE=4");
    ps.start(env);
  }
  // Restart the victim as the launcher would once it is dead.
  CHECK(wait_for([&] { return proc_state(ps.pid(victim)) == 'Z'; }, 30s));
  auto env = env_for(dir, victim, m, timeout_ms, "none:0");
  env.push_back("DILOCO_TEST_WANT_SIZE=4");
  const auto again = ps.start(env);
  ps.wait_all(60s);
  check_exits(ps, 0, victim);
  CHECK(again == 4);
  check_agree(collect(dir), 4, 4, 6);
}

TEST_CASE("the other schedules survive a kill too: streaming, one-step delay, eager") {
  const int m = 4, victim = 3, timeout_ms = 1500;
  for (const std::string sync : {"streaming", "delay", "eager"}) {
    for (const std::string fault : {"inner:2", "all_reduce:3", "apply:2"}) {
      CAPTURE(sync);
      CAPTURE(fault);
      harness::temp_dir d;
      harness::processes ps;
      for (int r = 0; r < m; ++r) {
        auto env = env_for(d.path().string(), r, m, timeout_ms, r == victim ? fault : std::string("none:0"));
        env.push_back("DILOCO_TEST_SYNC=" + sync);
        ps.start(env);
      }
      ps.wait_all(60s);
      CHECK(ps.status(victim).signal == SIGKILL);
      check_exits(ps, 0, victim);
      check_agree(collect(d.path().string()), 3, 3, 6);
    }
  }
}

TEST_CASE("min_workers: a group that would fall below it raises comm_error on every survivor") {
  const int m = 3, victim = 0, timeout_ms = 1500;
  harness::temp_dir d;
  harness::processes ps;
  for (int r = 0; r < m; ++r) {
    auto env = env_for(d.path().string(), r, m, timeout_ms, r == victim ? "inner:2" : "none:0");
    env.push_back("DILOCO_MIN_WORKERS=3");
    ps.start(env);
  }
  ps.wait_all(60s);
  CHECK(ps.status(victim).signal == SIGKILL);
  check_exits(ps, 3, victim);
  const result res = collect(d.path().string());
  CHECK(res.thetas.empty());
  REQUIRE(res.errors.size() == 2);
  for (const auto& e : res.errors) {
    INFO(e);
    CHECK(e.find("fewer than min_workers (3)") != std::string::npos);
    CHECK(e.find("2 workers") != std::string::npos);
  }
}

TEST_CASE("a Gloo worker that leaves after round 2: the others finish with 3 and agree") {
  const int m = 4, leaver = 1, timeout_ms = 1500;
  harness::temp_dir d;
  harness::processes ps;
  for (int r = 0; r < m; ++r) {
    auto env = env_for(d.path().string(), r, m, timeout_ms, "none:0");
    if (r == leaver) env.push_back("DILOCO_TEST_LEAVE_AT=2");
    ps.start(env);
  }
  ps.wait_all(60s);
  check_exits(ps, 0);
  const result res = collect(d.path().string());
  REQUIRE(res.left.size() == 1);
  CHECK(res.left[0] == "2");  // it left with 2 rounds applied
  check_agree(res, 3, 3, 6);
  for (const auto& t : res.thetas) CHECK(t.rounds == 6);
  check_by_hand(res, {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 2, 3}, {0, 2, 3}, {0, 2, 3}, {0, 2, 3}});
}

TEST_CASE("a SIGSTOPped Gloo worker is dropped; resumed, it is refused by the new generation and joins again") {
  const int m = 4, victim = 2, timeout_ms = 1500;
  harness::temp_dir d;
  const std::string dir = d.path().string();
  harness::processes ps;
  for (int r = 0; r < m; ++r) {
    auto env = env_for(dir, r, m, timeout_ms, r == victim ? "inner:2:stop" : "none:0");
    env.push_back("DILOCO_TEST_WANT_SIZE=4");
    env.push_back("DILOCO_TEST_REJOIN=1");
    env.push_back("DILOCO_TEST_STEP_US=2000");  // the survivors are still training when it resumes
    ps.start(env);
  }
  REQUIRE(wait_for([&] { return proc_state(ps.pid(victim)) == 'T'; }, 30s));
  // The survivors give up on it after the timeout and re-form without it;
  // then it resumes.
  auto reformed = [&] {
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().rfind("changed.", 0) == 0) return true;
    return false;
  };
  CHECK(wait_for(reformed, 30s));
  ::kill(ps.pid(victim), SIGCONT);
  ps.wait_all(60s);
  check_exits(ps, 0);
  const result res = collect(dir);
  REQUIRE(res.refused.size() == 1);
  INFO(res.refused[0]);
  CHECK(res.refused[0].find("was formed without it") != std::string::npos);
  check_agree(res, 4, 4, 6);
}

TEST_CASE("a worker that comes to join after the group finished is told so at once, not after join_timeout") {
  const int m = 3, timeout_ms = 1500;
  harness::temp_dir d;
  const std::string dir = d.path().string();
  harness::processes ps;
  for (int r = 0; r < m; ++r) ps.start(env_for(dir, r, m, timeout_ms, "none:0"));
  ps.wait_all(60s);
  check_exits(ps, 0);
  const auto t0 = harness::clock::now();
  const auto late = ps.start(env_for(dir, 1, m, timeout_ms, "none:0"));  // rank 1 ran before: a joiner
  ps.wait_all(60s);
  const double took = harness::seconds_between(t0, harness::clock::now());
  INFO(harness::describe(ps.status(late)));
  CHECK((ps.status(late).exited && ps.status(late).code == 3));
  CHECK(took < 10.0);
  const result res = collect(dir);
  REQUIRE(res.errors.size() == 1);
  INFO(res.errors[0]);
  CHECK(res.errors[0].find("finished before a round end admitted this worker") != std::string::npos);
}

int main(int argc, char** argv) {
  if (const char* role = std::getenv("DILOCO_TEST_ROLE")) {
    if (std::string(role) == "train") return train();
    std::fprintf(stderr, "unknown DILOCO_TEST_ROLE '%s'\n", role);
    return 2;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
