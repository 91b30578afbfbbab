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

#include "process_harness.hpp"

namespace dc = diloco;
using gloo_comm = dc::comm::gloo;
using namespace std::chrono_literals;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

constexpr std::size_t n = 256;
constexpr std::size_t H = 4;

// Worker `seed`'s objective 0.5 * |x - c|^2 with its own c.
std::vector<float> target(int seed) {
  std::vector<float> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = static_cast<float>(seed % 7) * 0.3f + static_cast<float>(i % 13) * 0.05f;
  return c;
}

std::string hex(const float* p, std::size_t count) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < count * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// One worker: trains until DILOCO_TEST_ROUNDS rounds are applied, then
// writes theta_global's hash, the group size and its rounds to
// <dir>/theta.<pid>. Exit 0 on success, 3 on a comm_error, 4 otherwise.
int train() {
  const std::string dir = env_or("DILOCO_TEST_DIR", ".");
  const auto rounds = static_cast<std::uint64_t>(std::atoi(env_or("DILOCO_TEST_ROUNDS", "6").c_str()));
  try {
    auto comm = gloo_comm::from_env();
    using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, gloo_comm>;
    trainer::options o;
    o.inner_steps = H;
    o.inner = {.lr = 0.1f};
    std::vector<float> x(n, 0.5f);
    trainer t(x, comm, o);
    const auto c = target(static_cast<int>(getpid()));
    std::vector<float> g(n);
    const int want_size = std::atoi(env_or("DILOCO_TEST_WANT_SIZE", "0").c_str());
    while (t.stats().rounds < rounds || t.world_size() < want_size) {
      for (std::size_t i = 0; i < n; ++i) g[i] = x[i] - c[i];
      t.step(g);
    }
    const auto theta = t.global_parameters();
    harness::write_file(dir + "/theta." + std::to_string(getpid()),
                        hex(theta.data(), theta.size()) + " " + std::to_string(t.world_size()) + " " +
                            std::to_string(t.stats().rounds) + " " + std::to_string(t.stats().membership_changes));
    return 0;
  } catch (const dc::comm_error& e) {
    harness::write_file(dir + "/error." + std::to_string(getpid()), e.what());
    return 3;
  } catch (const std::exception& e) {
    harness::write_file(dir + "/error." + std::to_string(getpid()), e.what());
    return 4;
  }
}

struct result {
  std::vector<std::string> thetas;  // "hash size rounds changes" of each finished worker
  std::vector<std::string> errors;
};

result collect(const std::string& dir) {
  result r;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("theta.", 0) == 0) r.thetas.push_back(harness::read_file(e.path().string()));
    if (name.rfind("error.", 0) == 0) r.errors.push_back(harness::read_file(e.path().string()));
  }
  return r;
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
    for (int r = 0; r < m; ++r) {
      if (r == victim) continue;
      INFO("rank ", r, " ", harness::describe(ps.status(static_cast<std::size_t>(r))));
      CHECK((ps.status(static_cast<std::size_t>(r)).exited && ps.status(static_cast<std::size_t>(r)).code == 0));
    }
    const result res = collect(d.path().string());
    for (const auto& e : res.errors) MESSAGE("error: ", e);
    REQUIRE(res.thetas.size() == 3);
    for (const auto& t : res.thetas) {
      CHECK(t.substr(0, 16) == res.thetas[0].substr(0, 16));  // bitwise equal theta_global
      CHECK(t.find(" 3 6 ") != std::string::npos);           // 3 workers, 6 rounds
    }
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
  const auto until = harness::clock::now() + 30s;
  // (Dead: a zombie, state Z in /proc; wait_all reaps it later.)
  auto dead = [&] {
    const std::string stat = harness::read_file("/proc/" + std::to_string(ps.pid(victim)) + "/stat");
    const auto close = stat.rfind(')');
    return close == std::string::npos || stat.size() < close + 3 || stat[close + 2] == 'Z';
  };
  while (!dead() && harness::clock::now() < until) std::this_thread::sleep_for(5ms);
  auto env = env_for(dir, victim, m, timeout_ms, "none:0");
  env.push_back("DILOCO_TEST_WANT_SIZE=4");
  const auto again = ps.start(env);
  ps.wait_all(60s);
  for (std::size_t p = 0; p < ps.count(); ++p) {
    if (p == static_cast<std::size_t>(victim)) continue;
    INFO("process ", p, " ", harness::describe(ps.status(p)));
    CHECK((ps.status(p).exited && ps.status(p).code == 0));
  }
  CHECK(again == 4);
  const result res = collect(dir);
  for (const auto& e : res.errors) MESSAGE("error: ", e);
  REQUIRE(res.thetas.size() == 4);
  for (const auto& t : res.thetas) {
    CHECK(t.substr(0, 16) == res.thetas[0].substr(0, 16));
    CHECK(t.find(" 4 ") == 16);  // 4 workers at the end
  }
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
