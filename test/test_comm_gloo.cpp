// SPDX-License-Identifier: Apache-2.0
// comm::gloo over real processes and loopback TCP. The test binary is also
// its own rank program: run with DILOCO_TEST_ROLE set (and the DILOCO_*
// variables of comm::gloo::from_env) it plays one rank of a world its
// parent started, and reports through its exit code and files in
// DILOCO_TEST_DIR.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <diloco/comm/gloo.hpp>
#include <diloco/diloco.hpp>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "low_precision_reference.hpp"
#include "comm_conformance.hpp"
#include "compressed_mean_bounds.hpp"
#include "process_harness.hpp"

namespace dc = diloco;
using gloo_comm = dc::comm::gloo;
using namespace std::chrono_literals;

namespace {

// Exit codes of the rank programs.
constexpr int exit_caught_comm_error = 3;
constexpr int exit_wrong_error = 4;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
std::string test_dir() { return env_or("DILOCO_TEST_DIR", "."); }
std::string rank_file(const std::string& what, int rank) {
  return test_dir() + "/" + what + "." + std::to_string(rank);
}

// The environment of rank `rank`: scripts/launch_gloo.sh's variables, plus
// the role to play and where to report.
struct world_spec {
  std::string role{};
  int size = 2;
  std::string store{};
  std::string run_id = "test";
  int timeout_ms = 10000;
  std::string dir{};
  std::vector<std::string> extra{};
};
std::vector<std::string> rank_env(const world_spec& w, int rank) {
  std::vector<std::string> env{"DILOCO_TEST_ROLE=" + w.role,
                               "DILOCO_TEST_DIR=" + w.dir,
                               "DILOCO_RANK=" + std::to_string(rank),
                               "DILOCO_WORLD_SIZE=" + std::to_string(w.size),
                               "DILOCO_STORE=" + w.store,
                               "DILOCO_RUN_ID=" + w.run_id,
                               "DILOCO_TIMEOUT_MS=" + std::to_string(w.timeout_ms)};
  env.insert(env.end(), w.extra.begin(), w.extra.end());
  return env;
}

// Runs all ranks of a world to completion and checks that each exited with
// code 0 and finished its test bodies (a doctest run that matched no test
// case would also exit 0).
void run_world(const world_spec& w, std::chrono::milliseconds limit, const std::vector<std::string>& bodies) {
  harness::processes ps;
  for (int r = 0; r < w.size; ++r) ps.start(rank_env(w, r));
  ps.wait_all(limit);
  for (int r = 0; r < w.size; ++r) {
    CAPTURE(r);
    const auto& s = ps.status(static_cast<std::size_t>(r));
    INFO("rank ", r, " ", harness::describe(s));
    CHECK((s.exited && s.code == 0));
    for (const auto& b : bodies) {
      INFO("body ", b);
      CHECK(std::filesystem::exists(w.dir + "/done-" + b + "." + std::to_string(r)));
    }
  }
}

void mark_done(const std::string& body, int rank) { harness::write_file(rank_file("done-" + body, rank), "ok"); }

std::uint64_t fnv1a(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// ------------------------------------------------ the algorithm problem
// Linear regression as in test_algorithm.cpp: worker m fits y = X_m w* +
// noise with its own X_m; every rank makes its own shard from its rank.
constexpr std::size_t features = 6;
constexpr std::size_t rows = 16;
constexpr int inner_steps = 5;
constexpr int rounds = 6;

struct shard {
  std::vector<double> x, y;
};
shard make_shard(int m) {
  std::mt19937 star_rng(123);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<double> w_star(features);
  for (auto& w : w_star) w = n01(star_rng);
  std::mt19937 rng(1000u + static_cast<unsigned>(m));
  shard s{std::vector<double>(rows * features), std::vector<double>(rows)};
  for (auto& v : s.x) v = static_cast<float>(n01(rng));
  for (std::size_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (std::size_t j = 0; j < features; ++j) acc += s.x[r * features + j] * w_star[j];
    s.y[r] = static_cast<float>(acc + 0.1 * n01(rng));
  }
  return s;
}

// theta_global after `rounds` rounds of DiLoCo (inner SGD with momentum,
// outer Nesterov) over `comm`, with `Compressor` and `Sync`; `bytes_sent`
// gets the worker's stats().bytes_sent.
// `Inner` inner::external: the inner steps are a momentum SGD written here
// (PyTorch's: b = g at the first step, else 0.9 b + g; w -= 0.05 b), as a
// user's own optimizer would take them.
template <class Comm, class Compressor = dc::compress::none, class Sync = dc::sync::blocking,
          class Inner = dc::inner::sgd>
std::vector<float> train_linear(Comm& comm, std::uint64_t* bytes_sent = nullptr) {
  constexpr bool external = std::is_same_v<Inner, dc::inner::external>;
  const int m = comm.rank();
  const shard s = make_shard(m);
  // Rank 0 starts from zeros, the others from garbage that the initial
  // broadcast must replace.
  std::vector<float> w(features, m == 0 ? 0.0f : 42.0f + static_cast<float>(m));
  typename Inner::options io{};
  if constexpr (!external) io = {.lr = 0.05f, .momentum = 0.9f};
  dc::algorithm<Inner, dc::outer::nesterov, Compressor, Comm, Sync> t(
      w, comm, {.inner_steps = inner_steps, .inner = io, .outer = {.lr = 0.7f, .momentum = 0.9f}});
  std::vector<float> g(features), b(features);
  for (int step = 0; step < inner_steps * rounds; ++step) {
    std::fill(g.begin(), g.end(), 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      double pred = 0;
      for (std::size_t j = 0; j < features; ++j) pred += s.x[r * features + j] * static_cast<double>(w[j]);
      const double err = pred - s.y[r];
      for (std::size_t j = 0; j < features; ++j) g[j] += static_cast<float>(err * s.x[r * features + j] / rows);
    }
    if constexpr (external) {
      for (std::size_t j = 0; j < features; ++j) {
        b[j] = step == 0 ? g[j] : 0.9f * b[j] + g[j];
        w[j] -= 0.05f * b[j];
      }
      t.step();
    } else {
      t.step(g);
    }
  }
  t.finish();
  if (bytes_sent) *bytes_sent = t.stats().bytes_sent;
  const auto global = t.global_parameters();
  return std::vector<float>(global.data(), global.data() + global.size());
}

// Mixed-magnitude values, where the summation order shows in the bits.
std::vector<float> mixed_inputs(int rank, std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(rank) * 7919u + 17u);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = u(rng) * static_cast<float>(1 << (rng() % 20));
  return x;
}

// True if SIGPIPE is blocked in the calling thread.
bool sigpipe_blocked() {
  sigset_t now;
  sigemptyset(&now);
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGPIPE) == 1;
}
bool sigpipe_pending() {
  sigset_t p;
  sigemptyset(&p);
  sigpending(&p);
  return sigismember(&p, SIGPIPE) == 1;
}
bool sigpipe_default() {
  struct sigaction sa {};
  sigaction(SIGPIPE, nullptr, &sa);
  return sa.sa_handler == SIG_DFL;
}

}  // namespace

// ====================================================================
// Rank programs (run only in child processes, with --no-skip)
// ====================================================================

TEST_CASE("child: operations" * doctest::skip()) {
  auto comm = gloo_comm::from_env();
  const int r = comm.rank(), m = comm.size();
  conformance::check_all_operations(comm);
  conformance::check_deterministic(comm, 10);

  // Traffic as the ring / chain / exchange models count it.
  const auto before = comm.traffic();
  std::vector<float> f(1000, 1.0f);
  comm.all_reduce(f, dc::reduce_op::sum);
  std::vector<std::byte> b(100);
  comm.broadcast(std::span<std::byte>(b), 0);
  std::vector<std::byte> send(7), recv(7 * static_cast<std::size_t>(m));
  comm.all_gather(send, recv);
  std::vector<std::byte> a2a_send(5 * static_cast<std::size_t>(m)), a2a_recv(a2a_send.size());
  comm.all_to_all(a2a_send, a2a_recv);
  const auto after = comm.traffic();
  const std::uint64_t ring = dc::ring_all_reduce_bytes(4000, m);
  const std::uint64_t exch = static_cast<std::uint64_t>(m - 1) * (7 + 5);
  CHECK(after.bytes_sent - before.bytes_sent == ring + (r == m - 1 ? 0u : 100u) + exch);
  CHECK(after.bytes_received - before.bytes_received == ring + (r == 0 ? 0u : 100u) + exch);

  // One all-reduce of mixed-magnitude values: close to the exact sum (fp32
  // summation of m terms errs by at most (m-1) ulp-sized steps), and its
  // bits go to a file so the parent can compare ranks and runs.
  std::vector<float> x = mixed_inputs(r, 10007);
  comm.all_reduce(x, dc::reduce_op::sum);
  std::vector<std::vector<float>> inputs;
  for (int k = 0; k < m; ++k) inputs.push_back(mixed_inputs(k, x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    double exact = 0, magnitude = 0;
    for (int k = 0; k < m; ++k) {
      exact += inputs[static_cast<std::size_t>(k)][i];
      magnitude += std::abs(inputs[static_cast<std::size_t>(k)][i]);
    }
    REQUIRE(std::abs(x[i] - exact) <= (m - 1) * 6e-8 * magnitude);
  }
  harness::write_file(rank_file("hash", r), std::to_string(fnv1a(x.data(), x.size() * sizeof(float))));
  mark_done("operations", r);
}

TEST_CASE("child: algorithm" * doctest::skip()) {
  auto comm = gloo_comm::from_env();
  const int m = comm.size();
  const auto over_gloo = train_linear(comm);

  // The same problem with the same M on the in-process communicator.
  std::vector<float> over_threads;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& c) {
    auto w = train_linear(c);
    if (c.rank() == 0) over_threads = w;
  });
  REQUIRE(over_gloo.size() == over_threads.size());
  double diff = 0, scale = 0;
  for (std::size_t j = 0; j < features; ++j) {
    diff = std::max(diff, std::abs(static_cast<double>(over_gloo[j]) - over_threads[j]));
    scale = std::max(scale, std::abs(static_cast<double>(over_threads[j])));
  }
  MESSAGE("rank ", comm.rank(), ": max |gloo - threads| = ", diff, " for max |theta| = ", scale);
  CHECK(scale > 0.1);  // the model moved
  CHECK(diff <= 1e-6 * scale);

  // Wrapper mode over Gloo: the same run with the inner steps taken by the
  // test's own momentum SGD (inner::external) reaches inner::sgd's result.
  const auto wrapped = train_linear<gloo_comm, dc::compress::none, dc::sync::blocking, dc::inner::external>(comm);
  double wdiff = 0;
  for (std::size_t j = 0; j < features; ++j)
    wdiff = std::max(wdiff, std::abs(static_cast<double>(wrapped[j]) - over_gloo[j]));
  MESSAGE("rank ", comm.rank(), ": max |external - sgd| = ", wdiff);
  CHECK(wdiff <= 1e-6 * scale);

  // bf16 replicas over Gloo follow the double simulation of the rules
  // (test/low_precision_reference.hpp, docs/algorithms.md section 6a) bit
  // for bit, M = the processes.
  {
    namespace ref = low_precision_reference;
    constexpr int bf16_rounds = 4;
    const ref::expected e = ref::simulate(m, bf16_rounds);
    REQUIRE(!e.out_of_binade);
    std::vector<std::vector<double>> global, replica;
    ref::run_worker<dc::bfloat16, dc::algorithm<dc::inner::external, dc::outer::sgd, dc::compress::none, gloo_comm>>(
        comm, bf16_rounds, global, replica);
    CHECK(global == e.global);
    CHECK(replica == e.replica);
  }

  // Every replica holds the same theta_global, bit for bit.
  std::vector<std::byte> gathered(features * sizeof(float) * static_cast<std::size_t>(m));
  comm.all_gather(std::as_bytes(std::span<const float>(over_gloo)), gathered);
  for (int k = 0; k < m; ++k)
    CHECK(std::memcmp(gathered.data() + static_cast<std::size_t>(k) * features * sizeof(float), over_gloo.data(),
                      features * sizeof(float)) == 0);
  mark_done("algorithm", comm.rank());
}

// A compressed exchange under one-step delay: comm::gloo is a
// task_communicator, so reduce::staged runs each round's all-to-all, shard
// reduction, all-gather, decode and vote as one task on its progress thread
// (blocking collectives called from that thread). theta_global and the
// bytes sent equal the same run over comm::threads, bit for bit.
TEST_CASE("child: chained" * doctest::skip()) {
  using codec = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>;
  static_assert(dc::task_communicator<gloo_comm>);
  auto comm = gloo_comm::from_env();
  std::uint64_t gloo_bytes = 0, threads_bytes = 0;
  const auto over_gloo = train_linear<gloo_comm, codec, dc::sync::one_step_delay>(comm, &gloo_bytes);
  std::vector<float> over_threads;
  dc::comm::threads::world world(comm.size());
  world.run([&](dc::comm::threads& c) {
    std::uint64_t bytes = 0;
    auto w = train_linear<dc::comm::threads, codec, dc::sync::one_step_delay>(c, &bytes);
    if (c.rank() == comm.rank()) over_threads = w, threads_bytes = bytes;
  });
  REQUIRE(over_gloo.size() == over_threads.size());
  CHECK(std::memcmp(over_gloo.data(), over_threads.data(), over_gloo.size() * sizeof(float)) == 0);
  CHECK(gloo_bytes == threads_bytes);
  CHECK(gloo_bytes > 0);
  double moved = 0;
  for (float w : over_gloo) moved = std::max(moved, std::abs(static_cast<double>(w)));
  CHECK(moved > 0.1);  // the model moved
  mark_done("chained", comm.rank());
}

// Every block-wise small format over Gloo: one round from theta = 0 with
// inner and outer SGD at lr 1 leaves minus the decoded mean, within the
// format's bound (compressed_mean_bounds.hpp), the same bits on every rank.
template <class C>
void gloo_codec_round(gloo_comm& comm, unsigned salt, float levels, typename C::options opts = {}) {
  using namespace compressed_mean_bounds;
  std::vector<std::vector<float>> theta;
  for (auto n : sizes) theta.emplace_back(n, 0.0f);
  dc::algorithm<dc::inner::sgd, dc::outer::sgd, C, gloo_comm> t(theta, comm,
                                                                {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = opts});
  CHECK(t.step(deltas(comm.rank(), salt)));
  check_blockwise(comm.size(), salt, theta, levels);
  std::vector<std::byte> mine(sizes.back() * 4), all(mine.size() * static_cast<std::size_t>(comm.size()));
  std::memcpy(mine.data(), theta.back().data(), mine.size());
  comm.all_gather(mine, all);
  for (int k = 0; k < comm.size(); ++k)
    CHECK(std::memcmp(all.data() + static_cast<std::size_t>(k) * mine.size(), mine.data(), mine.size()) == 0);
}

TEST_CASE("child: codecs" * doctest::skip()) {
  namespace cp = dc::compress;
  using compressed_mean_bounds::bound_levels;
  auto comm = gloo_comm::from_env();
  gloo_codec_round<cp::blockwise<dc::fp8_e4m3>>(comm, 21, bound_levels<dc::fp8_e4m3>());
  gloo_codec_round<cp::error_feedback<cp::blockwise<dc::fp8_e5m2>>>(comm, 22, bound_levels<dc::fp8_e5m2>());
  gloo_codec_round<cp::blockwise<dc::fp4_e3m0, 64, cp::stochastic_rounding>>(comm, 23, bound_levels<dc::fp4_e3m0>() / 2,
                                                                             {.seed = 4});
  gloo_codec_round<cp::error_feedback<cp::blockwise<dc::int2>>>(comm, 24, bound_levels<dc::int2>());
  {
    // chunk_topk keeping every element in int8: the sparse mean is within
    // int8's bound of one stage (nothing is re-encoded).
    using namespace compressed_mean_bounds;
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    dc::algorithm<dc::inner::sgd, dc::outer::sgd, cp::chunk_topk<128, 128, dc::int8>, gloo_comm> t(
        theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
    CHECK(t.step(deltas(comm.rank(), 25)));
    check_blockwise(comm.size(), 25, theta, 127.0f);
  }
  {
    // low_rank: a rank-1 matrix held by both is reproduced, a vector exactly.
    std::vector<float> w(12 * 9, 0.0f), b(3, 0.0f), a(12 * 9);
    for (std::size_t i = 0; i < 12; ++i)
      for (std::size_t j = 0; j < 9; ++j) a[i * 9 + j] = static_cast<float>(i + 1) * static_cast<float>(j % 4 + 1);
    std::vector<dc::matrix_view<float>> params{{w.data(), 12, 9}, {b.data(), 3, 1}};
    dc::algorithm<dc::inner::sgd, dc::outer::sgd, cp::low_rank, gloo_comm> t(
        params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = 2}});
    CHECK(t.step(std::vector<std::vector<float>>{a, {1.0f, 2.0f, static_cast<float>(comm.rank())}}));
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(w[i] + a[i]) <= 1e-5f * std::fabs(a[i]) + 1e-6f);
    CHECK(b[2] == -0.5f);
  }
  {
    // adaptive int8 / int2: the first round on int2 (the start), then int8
    // (a budget every rung fits), on both ranks; each round within its
    // rung's bound of the exact mean.
    using namespace compressed_mean_bounds;
    using ladder = cp::adaptive<cp::blockwise<dc::int8>, cp::blockwise<dc::int2>>;
    std::vector<std::vector<float>> theta;
    for (auto n : sizes) theta.emplace_back(n, 0.0f);
    dc::algorithm<dc::inner::sgd, dc::outer::sgd, ladder, gloo_comm> t(
        theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rule = {.budget_seconds = 1e9, .start = 1}}});
    CHECK(t.step(deltas(comm.rank(), 26)));
    check_blockwise(comm.size(), 26, theta, bound_levels<dc::int2>());
    CHECK(t.stats().compression_choices.at(0).used == 1);
    CHECK(t.stats().compression_choices.at(0).next == 0);
    const auto before = theta;
    CHECK(t.step(deltas(comm.rank(), 27)));
    CHECK(t.stats().compression_choices.at(0).used == 0);
    auto step = theta;  // minus round 2's decoded mean
    for (std::size_t k = 0; k < step.size(); ++k)
      for (std::size_t i = 0; i < step[k].size(); ++i) step[k][i] -= before[k][i];
    check_blockwise(comm.size(), 27, step, bound_levels<dc::int8>());
  }
  mark_done("codecs", comm.rank());
}

TEST_CASE("child: determinism" * doctest::skip()) {
  auto comm = gloo_comm::from_env();
  std::vector<float> x = mixed_inputs(comm.rank(), 10007);
  comm.all_reduce(x, dc::reduce_op::sum);
  harness::write_file(rank_file("hash", comm.rank()), std::to_string(fnv1a(x.data(), x.size() * sizeof(float))));
  mark_done("determinism", comm.rank());
}

// Disagreeing and invalid calls: every rank raises at once (the parent
// gives a 20 s timeout and requires the whole run to take far less), and
// the communicator stays usable since no payload moved.
TEST_CASE("child: mismatch" * doctest::skip()) {
  auto comm = gloo_comm::from_env();
  const int r = comm.rank(), m = comm.size();
  {
    std::vector<float> x(r == 0 ? 4 : 5);
    CHECK_THROWS_WITH_AS(comm.all_reduce(x, dc::reduce_op::sum), doctest::Contains("buffer sizes differ across ranks"),
                         dc::comm_error);
  }
  {
    std::vector<float> x(4);
    if (r == 0)
      CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("every rank must call the same collective"),
                           dc::comm_error);
    else
      CHECK_THROWS_WITH_AS(comm.all_reduce(x, dc::reduce_op::sum),
                           doctest::Contains("every rank must call the same collective"), dc::comm_error);
  }
  {
    std::vector<float> x(4);
    CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(x), r == 1 ? 1 : 0),
                         doctest::Contains("ranks disagree on the root"), dc::comm_error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(x, r == 0 ? dc::reduce_op::mean : dc::reduce_op::sum),
                         doctest::Contains("ranks disagree on the reduction"), dc::comm_error);
  }
  {
    // Non-blocking: the error surfaces at wait().
    std::vector<float> x(r == m - 1 ? 9 : 8);
    auto req = comm.iall_reduce(x, dc::reduce_op::sum);
    CHECK_THROWS_WITH_AS(req.wait(), doctest::Contains("buffer sizes differ"), dc::comm_error);
  }
  {
    // Rank 1 passes a recv buffer of the wrong size: config_error there,
    // and the others hear of it instead of waiting for the timeout.
    std::vector<std::byte> send(3), recv(r == 1 ? 5 : 3 * static_cast<std::size_t>(m));
    if (r == 1)
      CHECK_THROWS_WITH_AS(comm.all_gather(send, recv), doctest::Contains("recv has 5 bytes, expected"),
                           dc::config_error);
    else
      CHECK_THROWS_WITH_AS(comm.all_gather(send, recv), doctest::Contains("rank 1 rejected its own arguments"),
                           dc::comm_error);
    // The same through the non-blocking form.
    if (r == 1)
      CHECK_THROWS_AS(comm.iall_gather(send, recv), dc::config_error);
    else
      CHECK_THROWS_WITH_AS(comm.iall_gather(send, recv).wait(), doctest::Contains("rank 1 rejected"),
                           dc::comm_error);
  }
  {
    std::vector<float> x(2);
    CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(x), m), doctest::Contains("is not a rank of a world of"),
                         dc::config_error);
  }
  // Still usable, and the results are right.
  std::vector<float> x(5, static_cast<float>(r + 1));
  comm.all_reduce(x, dc::reduce_op::sum);
  for (float v : x) CHECK(v == static_cast<float>(m * (m + 1) / 2));
  mark_done("mismatch", r);
}

// A loop of all-reduces and broadcasts until a peer vanishes. Exit code
// exit_caught_comm_error means: the failure arrived as comm_error, the
// communicator then refused further work with comm_error, its destructor
// returned, and SIGPIPE's disposition and this thread's mask are as before.
int kill_loop() {
  try {
    std::string message;
    {
      auto comm = gloo_comm::from_env();
      const int r = comm.rank();
      std::vector<float> big(1 << 18, static_cast<float>(r));
      try {
        const auto give_up = harness::clock::now() + 60s;
        for (int it = 0; harness::clock::now() < give_up; ++it) {
          comm.all_reduce(big, dc::reduce_op::mean);
          comm.broadcast(std::span<float>(big), it % comm.size());
          if (it == 3) harness::write_file(rank_file("ready", r), "ready");
        }
        return 0;  // nobody died: the parent fails the test
      } catch (const dc::comm_error& e) {
        message = e.what();
      }
      try {
        comm.barrier();
        return exit_wrong_error;
      } catch (const dc::comm_error& e) {
        if (std::string(e.what()).find("communicator is closed") == std::string::npos) return exit_wrong_error;
      }
    }  // the communicator's destructor must return
    harness::write_file(rank_file("error", std::atoi(std::getenv("DILOCO_RANK"))), message);
    if (!sigpipe_default() || sigpipe_blocked() || sigpipe_pending()) return exit_wrong_error;
    return exit_caught_comm_error;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kill_loop: %s\n", e.what());
    return exit_wrong_error;
  }
}

// Joins a world that is expected to fail: exit_caught_comm_error if the
// constructor throws comm_error containing DILOCO_TEST_EXPECT.
int expect_comm_error() {
  const std::string expect = env_or("DILOCO_TEST_EXPECT", "");
  const int r = std::atoi(env_or("DILOCO_RANK", "0").c_str());
  try {
    auto comm = gloo_comm::from_env();
    comm.barrier();
    return 0;
  } catch (const dc::comm_error& e) {
    harness::write_file(rank_file("error", r), e.what());
    harness::write_file(test_dir() + "/error-pid." + std::to_string(getpid()), e.what());
    return std::string(e.what()).find(expect) != std::string::npos ? exit_caught_comm_error : exit_wrong_error;
  } catch (const std::exception& e) {
    harness::write_file(rank_file("error", r), e.what());
    return exit_wrong_error;
  }
}

// Joins a world with a rank that never connects: reports how long the
// constructor took (steady_clock, in microseconds) and its message.
int timed_join() {
  const int r = std::atoi(env_or("DILOCO_RANK", "0").c_str());
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed_us = [&] {
    return std::to_string(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  };
  try {
    auto comm = gloo_comm::from_env();
    harness::write_file(rank_file("elapsed_us", r), elapsed_us());
    return 0;
  } catch (const dc::comm_error& e) {
    harness::write_file(rank_file("elapsed_us", r), elapsed_us());
    harness::write_file(rank_file("error", r), e.what());
    return exit_caught_comm_error;
  } catch (const std::exception& e) {
    harness::write_file(rank_file("elapsed_us", r), elapsed_us());
    harness::write_file(rank_file("error", r), e.what());
    return exit_wrong_error;
  }
}

// A peer that registers in the store as a real rank does (the library's
// own join) and publishes connection addresses, then never connects.
// DILOCO_TEST_FAKE=port:P publishes 127.0.0.1:P for every pair, where
// nothing listens (65535 compares above any listening port, so the real
// ranks take the listening side and wait; 0 below, so they connect and are
// refused). DILOCO_TEST_FAKE=stop listens for real, as Gloo's pairs do,
// publishes those addresses and stops itself with SIGSTOP (connections
// to it complete in the kernel; it never makes its own).
int fake_peer() {
  namespace dg = dc::comm::detail_gloo;
  const std::string how = env_or("DILOCO_TEST_FAKE", "port:65535");
  try {
    const auto o = gloo_comm::options_from_env();
    const std::string where = "fake peer";
    dg::rendezvous_store rs(o, dg::next_generation(o), where);
    const auto hosts = dg::join(rs, o, dc::detail::deadline_after(o.timeout), where);
    std::vector<char> list;
    std::shared_ptr<::gloo::transport::Device> device;
    std::shared_ptr<::gloo::transport::Context> pairs;
    if (how == "stop") {
      ::gloo::transport::tcp::attr a;
      a.hostname = "127.0.0.1";
      device = ::gloo::transport::tcp::CreateDevice(a);
      pairs = device->createContext(o.rank, o.size);
      for (int k = 0; k < o.size; ++k) {
        if (k == o.rank) continue;
        const auto b = pairs->createPair(k)->address().bytes();
        list.insert(list.end(), b.begin(), b.end());
      }
    } else {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<std::uint16_t>(std::atoi(how.substr(5).c_str())));
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const auto b =
          ::gloo::transport::tcp::Address(reinterpret_cast<const sockaddr*>(&sa), sizeof sa).bytes();
      for (int k = 0; k < o.size - 1; ++k) list.insert(list.end(), b.begin(), b.end());
    }
    rs.store().set(dg::address_key(o.rank), list);
    harness::write_file(rank_file("published", o.rank), "yes");
    if (how == "stop") raise(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(env_or("DILOCO_TEST_FAKE_LIFE_MS", "8000").c_str())));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake_peer: %s\n", e.what());
    return exit_wrong_error;
  }
}

// ====================================================================
// Parent tests
// ====================================================================

TEST_CASE("2 and 4 processes over a file store: every operation and the algorithm") {
  for (int m : {2, 4}) {
    CAPTURE(m);
    harness::temp_dir d;
    world_spec w{.role = "doctest:child: operations,child: algorithm",
                 .size = m,
                 .store = "file://" + d.file("store"),
                 .dir = d.path().string()};
    run_world(w, 120s, {"operations", "algorithm"});
    // Every rank holds the same bits.
    for (int r = 1; r < m; ++r)
      CHECK(harness::read_file(d.file("hash." + std::to_string(r))) == harness::read_file(d.file("hash.0")));
  }
}

TEST_CASE("2 and 3 processes: a chained compressed exchange (one-step delay) gives comm::threads' bits") {
  for (int m : {2, 3}) {
    CAPTURE(m);
    harness::temp_dir d;
    world_spec w{.role = "doctest:child: chained", .size = m, .store = "file://" + d.file("store"), .dir = d.path().string()};
    run_world(w, 120s, {"chained"});
  }
}

TEST_CASE("2 processes: every small format's compressed mean within its bound, the same bits on both") {
  harness::temp_dir d;
  world_spec w{.role = "doctest:child: codecs", .size = 2, .store = "file://" + d.file("store"), .dir = d.path().string()};
  run_world(w, 120s, {"codecs"});
}

// Without redis-server (scripts/install-deps.sh installs it) the Redis
// cases are reported as skipped by doctest's summary, not as passed.
static bool no_redis_server() { return harness::find_program("redis-server").empty(); }

TEST_CASE("2 and 4 processes over a Redis store: every operation and the algorithm" * doctest::skip(no_redis_server())) {
  harness::redis_server redis;
  if (!redis.available()) {
    FAIL("redis-server is not installed (scripts/install-deps.sh installs it)");
    return;
  }
  for (int m : {2, 4}) {
    CAPTURE(m);
    harness::temp_dir d;
    world_spec w{.role = "doctest:child: operations,child: algorithm",
                 .size = m,
                 .store = redis.url(),
                 .run_id = "redis-" + std::to_string(m),
                 .dir = d.path().string()};
    run_world(w, 120s, {"operations", "algorithm"});
  }
}

TEST_CASE("same world size and inputs give the same bits on every rank and every run") {
  std::vector<std::string> runs;
  for (int run = 0; run < 3; ++run) {
    harness::temp_dir d;
    world_spec w{.role = "doctest:child: determinism",
                 .size = 3,
                 .store = "file://" + d.file("store"),
                 .dir = d.path().string()};
    run_world(w, 60s, {"determinism"});
    for (int r = 0; r < 3; ++r) runs.push_back(harness::read_file(d.file("hash." + std::to_string(r))));
  }
  REQUIRE(runs.size() == 9);
  CHECK(!runs[0].empty());
  for (const auto& h : runs) CHECK(h == runs[0]);
}

TEST_CASE("disagreeing or invalid arguments: comm_error on every rank at once, then the communicator goes on") {
  harness::temp_dir d;
  world_spec w{.role = "doctest:child: mismatch",
               .size = 3,
               .store = "file://" + d.file("store"),
               .timeout_ms = 20000,
               .dir = d.path().string()};
  const auto t0 = harness::clock::now();
  run_world(w, 60s, {"mismatch"});
  // Far below one 20 s timeout: nobody waited for a peer that would not come.
  CHECK(harness::seconds_between(t0, harness::clock::now()) < 10.0);
}

// Starts m ranks of kill_loop and returns once all of them have looped a
// few times and had 200 ms more to get deep into a collective.
void start_kill_loop(harness::processes& ps, const harness::temp_dir& d, int m, int timeout_ms) {
  world_spec w{.role = "kill_loop", .size = m, .store = "file://" + d.file("store"), .timeout_ms = timeout_ms,
               .dir = d.path().string()};
  for (int r = 0; r < m; ++r) ps.start(rank_env(w, r));
  const auto ready_by = harness::clock::now() + 60s;
  for (int r = 0; r < m; ++r)
    while (!std::filesystem::exists(d.file("ready." + std::to_string(r))) && harness::clock::now() < ready_by)
      std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(200ms);
}

TEST_CASE("a process killed mid-run: the others raise comm_error within the timeout and exit cleanly") {
  constexpr int m = 4, victim = 2, timeout_ms = 2000;
  constexpr double slack_s = 2.0;
  harness::temp_dir d;
  harness::processes ps;
  start_kill_loop(ps, d, m, timeout_ms);
  const auto killed_at = harness::clock::now();
  ps.kill(victim);
  ps.wait_all(60s);

  const auto& v = ps.status(victim);
  CHECK(v.signal == SIGKILL);
  std::string messages;
  for (int r = 0; r < m; ++r) {
    if (r == victim) continue;
    CAPTURE(r);
    const auto& s = ps.status(static_cast<std::size_t>(r));
    INFO("rank ", r, " ", harness::describe(s));
    CHECK((s.exited && s.code == exit_caught_comm_error));
    const double after_kill = harness::seconds_between(killed_at, s.at);
    MESSAGE("rank ", r, " exited ", after_kill, " s after the kill");
    CHECK(after_kill < timeout_ms / 1000.0 + slack_s);
    const std::string msg = harness::read_file(d.file("error." + std::to_string(r)));
    MESSAGE("rank ", r, ": ", msg);
    CHECK(msg.find("comm::gloo") != std::string::npos);
    CHECK(msg.find("on rank " + std::to_string(r) + " of 4") != std::string::npos);
    messages += msg;
  }
  // A neighbour of the victim names it: Gloo reports the lost connection
  // by address, which the communicator maps back to the rank.
  CHECK(messages.find("(connection to rank 2)") != std::string::npos);
}

TEST_CASE("a rank killed or frozen mid-run: every survivor names that rank, and no live one") {
  // Before, a survivor not next to the victim named the live neighbour that
  // had closed its connections on failing (about one in three), and with a
  // frozen rank no message named it (issue 12, item 4).
  constexpr int m = 4, victim = 2, timeout_ms = 2000;
  for (int sig : {SIGKILL, SIGSTOP, SIGKILL, SIGSTOP}) {
    CAPTURE(sig);
    harness::temp_dir d;
    harness::processes ps;
    start_kill_loop(ps, d, m, timeout_ms);
    const auto hit_at = harness::clock::now();
    ps.kill(victim, sig);
    const auto reported_by = harness::clock::now() + 30s;
    for (int r = 0; r < m; ++r)
      while (r != victim && !std::filesystem::exists(d.file("error." + std::to_string(r))) &&
             harness::clock::now() < reported_by)
        std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(100ms);
    ps.kill(victim, SIGKILL);
    ps.wait_all(30s);
    for (int r = 0; r < m; ++r) {
      if (r == victim) continue;
      CAPTURE(r);
      const auto& s = ps.status(static_cast<std::size_t>(r));
      const std::string msg = harness::read_file(d.file("error." + std::to_string(r)));
      INFO(harness::describe(s), ": ", msg);
      CHECK((s.exited && s.code == exit_caught_comm_error));
      MESSAGE((sig == SIGKILL ? "killed" : "frozen"), ": rank ", r, " after ",
              harness::seconds_between(hit_at, s.at), " s: ", msg);
      CHECK(harness::seconds_between(hit_at, s.at) < timeout_ms / 1000.0 + 2.0);
      const bool names_victim = msg.find("(connection to rank 2)") != std::string::npos ||
                                msg.find("(rank 2 failed; heard through rank ") != std::string::npos ||
                                msg.find("(no word from rank 2: stalled or dead?)") != std::string::npos;
      CHECK(names_victim);
      for (int k = 0; k < m; ++k)
        if (k != victim) CHECK(msg.find("(connection to rank " + std::to_string(k) + ")") == std::string::npos);
    }
  }
}

TEST_CASE("a rank that never comes: the others raise comm_error naming it within the timeout") {
  constexpr int timeout_ms = 1500;
  harness::temp_dir d;
  world_spec w{.role = "expect_comm_error",
               .size = 3,
               .store = "file://" + d.file("store"),
               .timeout_ms = timeout_ms,
               .dir = d.path().string(),
               .extra = {"DILOCO_TEST_EXPECT=waiting for rank(s) 2 to join"}};
  harness::processes ps;
  const auto t0 = harness::clock::now();
  ps.start(rank_env(w, 0));
  ps.start(rank_env(w, 1));
  ps.wait_all(30s);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto& s = ps.status(static_cast<std::size_t>(r));
    INFO(harness::describe(s), ": ", harness::read_file(d.file("error." + std::to_string(r))));
    CHECK((s.exited && s.code == exit_caught_comm_error));
    // What the timeout guarantees: no rank gives up before it has passed
    // (measured from before the processes start, so start-up only adds).
    // The upper bound includes process start-up, which takes seconds under
    // sanitizers on two cores: it only rules out a wait of many timeouts
    // (wait_all's 30 s rules out a hang).
    CHECK(harness::seconds_between(t0, s.at) >= timeout_ms / 1000.0);
    CHECK(harness::seconds_between(t0, s.at) < timeout_ms / 1000.0 + 10.0);
  }
}

TEST_CASE("a peer that registers but never connects: every rank raises after the timeout, well before twice it, naming it") {
  // Gloo's own connect waited five times the timeout for such a peer and
  // named only an address (issue 12, item 1). The constructor's own clock
  // (timed_join) excludes process start-up. A "did not connect" verdict
  // cannot come before the timeout has passed; the upper bound, twice the
  // timeout, leaves 3 s for sanitizers on two cores and still tells the
  // fix from the old five timeouts (15 s).
  constexpr int m = 3, fake = 2, timeout_ms = 3000;
  constexpr double bound_s = 2.0 * timeout_ms / 1000.0;
  struct scenario {
    const char* fake;
    const char* expect;
  };
  for (const scenario& sc : {scenario{"port:65535", "rank 2 did not connect within 3000 ms"},
                             scenario{"stop", "rank 2 did not connect within 3000 ms"},
                             scenario{"port:0", "the connection to rank 2 failed"}}) {
    const std::string fake_kind = sc.fake;
    CAPTURE(fake_kind);
    harness::temp_dir d;
    world_spec w{.role = "timed_join",
                 .size = m,
                 .store = "file://" + d.file("store"),
                 .timeout_ms = timeout_ms,
                 .dir = d.path().string()};
    world_spec wf = w;
    wf.role = "fake_peer";
    wf.extra = {std::string("DILOCO_TEST_FAKE=") + sc.fake, "DILOCO_TEST_FAKE_LIFE_MS=8000"};
    harness::processes ps;
    for (int r = 0; r < fake; ++r) ps.start(rank_env(w, r));
    const std::size_t f = ps.start(rank_env(wf, fake));
    const auto reported_by = harness::clock::now() + 30s;
    for (int r = 0; r < fake; ++r)
      while (!std::filesystem::exists(d.file("elapsed_us." + std::to_string(r))) &&
             harness::clock::now() < reported_by)
        std::this_thread::sleep_for(5ms);
    ps.kill(f, SIGKILL);
    ps.wait_all(30s);
    for (int r = 0; r < fake; ++r) {
      CAPTURE(r);
      const auto& s = ps.status(static_cast<std::size_t>(r));
      const std::string msg = harness::read_file(d.file("error." + std::to_string(r)));
      INFO(harness::describe(s), ": ", msg);
      CHECK((s.exited && s.code == exit_caught_comm_error));
      const double elapsed_s = std::atof(harness::read_file(d.file("elapsed_us." + std::to_string(r))).c_str()) / 1e6;
      MESSAGE(fake_kind, ": rank ", r, " raised after ", elapsed_s, " s: ", msg);
      CHECK(elapsed_s <= bound_s);
      if (fake_kind != "port:0") CHECK(elapsed_s >= timeout_ms / 1000.0);
      CHECK(msg.find(sc.expect) != std::string::npos);
      CHECK(msg.find("rendezvous on rank " + std::to_string(r) + " of 3") != std::string::npos);
      // It is rank 2's fault, and no other rank is blamed.
      CHECK(msg.find("rank 0 did") == std::string::npos);
      CHECK(msg.find("rank 1 did") == std::string::npos);
    }
    CHECK(std::filesystem::exists(d.file("published.2")));
  }
}

TEST_CASE("DILOCO_TIMEOUT_MS=none: a rank 300 ms late is waited for, no false timeout and no hang") {
  // Before, a huge timeout overflowed the deadlines: rank 0 failed at once
  // with a false timeout and rank 1 hung.
  harness::temp_dir d;
  world_spec w{.role = "doctest:child: determinism",
               .size = 2,
               .store = "file://" + d.file("store"),
               .dir = d.path().string(),
               .extra = {"DILOCO_TIMEOUT_MS=none"}};
  harness::processes ps;
  ps.start(rank_env(w, 0));
  std::this_thread::sleep_for(300ms);
  ps.start(rank_env(w, 1));
  ps.wait_all(60s);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto& s = ps.status(static_cast<std::size_t>(r));
    INFO("rank ", r, " ", harness::describe(s));
    CHECK((s.exited && s.code == 0));
    CHECK(std::filesystem::exists(d.file("done-determinism." + std::to_string(r))));
  }
  CHECK(harness::read_file(d.file("hash.0")) == harness::read_file(d.file("hash.1")));
}

TEST_CASE("processes started with different world sizes: comm_error on each, not a hang") {
  harness::temp_dir d;
  world_spec w{.role = "expect_comm_error",
               .size = 2,
               .store = "file://" + d.file("store"),
               .timeout_ms = 10000,
               .dir = d.path().string(),
               .extra = {"DILOCO_TEST_EXPECT=every process must be given the same world size"}};
  world_spec w3 = w;
  w3.size = 3;
  harness::processes ps;
  const auto t0 = harness::clock::now();
  ps.start(rank_env(w, 0));   // thinks the world has 2 ranks
  ps.start(rank_env(w3, 1));  // thinks it has 3
  ps.wait_all(30s);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto& s = ps.status(static_cast<std::size_t>(r));
    INFO(harness::describe(s), ": ", harness::read_file(d.file("error." + std::to_string(r))));
    CHECK((s.exited && s.code == exit_caught_comm_error));
  }
  // Both saw the other's registration: no one waited for the 10 s timeout.
  CHECK(harness::seconds_between(t0, harness::clock::now()) < 8.0);
}

TEST_CASE("two processes claiming the same rank: comm_error, not a hang") {
  harness::temp_dir d;
  world_spec w{.role = "expect_comm_error",
               .size = 2,
               .store = "file://" + d.file("store"),
               .timeout_ms = 1500,
               .dir = d.path().string()};
  harness::processes ps;
  ps.start(rank_env(w, 0));
  ps.start(rank_env(w, 0));
  ps.wait_all(30s);
  std::string messages;
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& s = ps.status(i);
    INFO(harness::describe(s));
    CHECK((s.exited && s.code == exit_caught_comm_error));
    const std::string msg = harness::read_file(d.file("error-pid." + std::to_string(ps.pid(i))));
    MESSAGE("process ", i, ": ", msg);
    messages += msg;
  }
  // Exactly one creates rank 0's registration (the store's atomic create);
  // the other is told that the store already holds it, and the first waits
  // for rank 1 until the timeout.
  CHECK(messages.find("already") != std::string::npos);
}

// --------------------------------------------------- in-process checks
TEST_CASE("a world of one passes the conformance checks and keeps SIGPIPE out of Gloo's threads") {
  static_assert(dc::communicator<gloo_comm>);
  harness::temp_dir d;
  auto threads_now = [] {
    std::vector<std::string> ids;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ids.push_back(e.path().filename());
    return ids;
  };
  const auto before = threads_now();
  {
    gloo_comm comm({.rank = 0, .size = 1, .rendezvous = gloo_comm::file_store{d.file("store")}, .timeout = 5s});
    // Gloo's event-loop thread was started with SIGPIPE blocked; this thread's
    // mask is as it was.
    CHECK_FALSE(sigpipe_blocked());
    for (const auto& id : threads_now()) {
      if (std::find(before.begin(), before.end(), id) != before.end()) continue;
      const std::string status = harness::read_file("/proc/self/task/" + id + "/status");
      const auto pos = status.find("SigBlk:");
      REQUIRE(pos != std::string::npos);
      const auto mask = std::stoull(status.substr(pos + 7), nullptr, 16);
      INFO("thread ", id, " SigBlk ", status.substr(pos + 7, 17));
      CHECK(((mask >> (SIGPIPE - 1)) & 1u) == 1u);
    }
    conformance::check_all_operations(comm);
    conformance::check_deterministic(comm, 3);
    CHECK(comm.traffic().bytes_sent == 0);
    // A request that was already waited on, or never issued, is done.
    auto req = comm.ibarrier();
    req.wait();
    CHECK(req.test());
    gloo_comm::request empty;
    CHECK(empty.test());
    empty.wait();
  }
  {
    // A second communicator for the same store and run id, in turn: it
    // joins under keys of its own (and listens on the loopback interface
    // named, rather than on an address).
    gloo_comm again({.rank = 0, .size = 1, .rendezvous = gloo_comm::file_store{d.file("store")}, .iface = "lo",
                     .timeout = 5s});
    std::vector<float> x(3, 2.0f);
    again.all_reduce(x, dc::reduce_op::mean);
    CHECK(x[2] == 2.0f);
  }
  CHECK_FALSE(sigpipe_blocked());
}

TEST_CASE("batch_scheduling: Gloo's event loop and the progress thread run under SCHED_BATCH, the caller as it was") {
  harness::temp_dir d;
  // Every thread of this process and its policy, as the kernel reports it.
  auto policies = [] {
    std::map<std::string, int> m;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      const std::string id = e.path().filename();
      m[id] = sched_getscheduler(static_cast<pid_t>(std::stol(id)));
    }
    return m;
  };
  const auto before = policies();
  const int caller = sched_getscheduler(0);
  REQUIRE(caller == SCHED_OTHER);
  for (const bool on : {true, false}) {
    CAPTURE(on);
    gloo_comm comm({.rank = 0,
                    .size = 1,
                    .rendezvous = gloo_comm::file_store{d.file(on ? "batch" : "normal")},
                    .timeout = 5s,
                    .batch_scheduling = on});
    comm.ibarrier().wait();  // starts the progress thread
    int batch = 0, normal = 0;
    for (const auto& entry : policies()) {
      const std::string& id = entry.first;
      const int policy = entry.second;
      if (before.count(id) != 0) continue;
      CAPTURE(id);
      CHECK((policy == SCHED_BATCH || policy == SCHED_OTHER));
      (policy == SCHED_BATCH ? batch : normal) += 1;
    }
    // Gloo's event loop and the progress thread, at least.
    CHECK(batch + normal >= 2);
    CHECK((on ? normal : batch) == 0);
    CHECK(sched_getscheduler(0) == caller);
  }
}

TEST_CASE("ranks may also be threads of one process, each with its own communicator") {
  harness::temp_dir d;
  constexpr int m = 3;
  std::vector<std::thread> ranks;
  for (int r = 0; r < m; ++r)
    ranks.emplace_back([&, r] {
      gloo_comm comm({.rank = r, .size = m, .rendezvous = gloo_comm::file_store{d.file("store")}, .timeout = 10s});
      conformance::check_all_operations(comm);
    });
  for (auto& t : ranks) t.join();
}

TEST_CASE("sigpipe_guard: a write to a closed socket fails with EPIPE and leaves the signal state as it was") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  close(fds[1]);
  const char byte = 'x';
  {
    dc::comm::detail_gloo::sigpipe_guard guard;
    errno = 0;
    CHECK(send(fds[0], &byte, 1, 0) == -1);  // send without MSG_NOSIGNAL, as Gloo's writev
    CHECK(errno == EPIPE);
  }
  // The process is alive, nothing is pending, the mask is restored.
  CHECK_FALSE(sigpipe_pending());
  CHECK_FALSE(sigpipe_blocked());
  CHECK(sigpipe_default());

  // A SIGPIPE that was pending before belongs to the user and stays.
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  pthread_kill(pthread_self(), SIGPIPE);
  REQUIRE(sigpipe_pending());
  {
    dc::comm::detail_gloo::sigpipe_guard guard;
    CHECK(send(fds[0], &byte, 1, 0) == -1);
  }
  CHECK(sigpipe_pending());
  CHECK(sigpipe_blocked());
  const timespec zero{0, 0};
  CHECK(sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(fds[0]);
}

TEST_CASE("bad options are config errors") {
  harness::temp_dir d;
  const gloo_comm::file_store fs{d.file("store")};
  auto make = [&](gloo_comm::options o) { gloo_comm comm(std::move(o)); };
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 0, .rendezvous = fs}), doctest::Contains("size must be at least 1, got 0"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 2, .size = 2, .rendezvous = fs}), doctest::Contains("rank 2 is outside [0, 2)"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = -1, .size = 2, .rendezvous = fs}), doctest::Contains("rank -1 is outside"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = fs, .timeout = 0ms}),
                       doctest::Contains("timeout must be positive"), dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = fs, .timeout = std::chrono::hours(2 * 365 * 24)}),
                       doctest::Contains("timeout is 63072000000 ms; expected a timeout in [1, 31536000000] ms"),
                       dc::config_error);
  // No timeout is accepted and nothing on the way overflows (a world of one
  // still registers in the store and sets up Gloo's context).
  CHECK_NOTHROW(make({.rank = 0, .size = 1, .rendezvous = fs, .run_id = "no-timeout", .timeout = dc::no_timeout}));
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = fs, .run_id = ""}),
                       doctest::Contains("run_id must not be empty"), dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = gloo_comm::file_store{""}}),
                       doctest::Contains("needs a directory"), dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = gloo_comm::redis_store{"127.0.0.1", 70000}}),
                       doctest::Contains("port 70000 is outside [1, 65535]"), dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = fs, .hostname = "no-such-host.invalid"}),
                       doctest::Contains("cannot listen on hostname 'no-such-host.invalid'"), dc::config_error);
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = fs, .iface = "no-such-iface0"}),
                       doctest::Contains("cannot listen on interface 'no-such-iface0'"), dc::config_error);
  harness::write_file(d.file("a-file"), "x");
  CHECK_THROWS_WITH_AS(make({.rank = 0, .size = 1, .rendezvous = gloo_comm::file_store{d.file("a-file")}}),
                       doctest::Contains("cannot use"), dc::config_error);
}

TEST_CASE("a rerun with a run id already used in the store is refused with comm_error") {
  harness::temp_dir d;
  world_spec w{.role = "expect_comm_error",
               .size = 1,
               .store = "file://" + d.file("store"),
               .run_id = "once",
               .timeout_ms = 2000,
               .dir = d.path().string(),
               .extra = {"DILOCO_TEST_EXPECT=already holds a registration for rank 0"}};
  for (int run = 0; run < 2; ++run) {
    CAPTURE(run);
    harness::processes ps;
    ps.start(rank_env(w, 0));
    ps.wait_all(30s);
    INFO(harness::describe(ps.status(0)), ": ", harness::read_file(d.file("error.0")));
    // The first run joins; the second finds the first's registration.
    CHECK((ps.status(0).exited && ps.status(0).code == (run == 0 ? 0 : exit_caught_comm_error)));
  }
  // Under another run id the same store serves again.
  w.run_id = "twice";
  harness::processes ps;
  ps.start(rank_env(w, 0));
  ps.wait_all(30s);
  CHECK((ps.status(0).exited && ps.status(0).code == 0));
}

TEST_CASE("an unreachable Redis store is a comm_error naming it") {
  const int port = harness::free_port();
  const auto t0 = harness::clock::now();
  CHECK_THROWS_WITH_AS(gloo_comm({.rank = 0, .size = 1, .rendezvous = gloo_comm::redis_store{"127.0.0.1", port}, .timeout = 2s}),
                       doctest::Contains(("cannot reach the Redis store at 127.0.0.1:" + std::to_string(port)).c_str()),
                       dc::comm_error);
  CHECK(harness::seconds_between(t0, harness::clock::now()) < 5.0);
}

TEST_CASE("a Redis store that stops answering is a comm_error within the timeout, not a hang" * doctest::skip(no_redis_server())) {
  harness::redis_server redis;
  if (!redis.available()) {
    FAIL("redis-server is not installed (scripts/install-deps.sh installs it)");
    return;
  }
  redis.signal(SIGSTOP);  // the kernel still accepts connections; nobody answers
  const auto t0 = harness::clock::now();
  CHECK_THROWS_WITH_AS(
      gloo_comm({.rank = 0, .size = 1, .rendezvous = gloo_comm::redis_store{"127.0.0.1", redis.port()}, .timeout = 1500ms}),
      doctest::Contains("the store failed"), dc::comm_error);
  CHECK(harness::seconds_between(t0, harness::clock::now()) < 1.5 + 2.0);
  redis.signal(SIGCONT);
}

TEST_CASE("from_env reads the launcher's variables and names any missing or malformed one") {
  struct saved_env {
    std::vector<std::pair<std::string, std::string>> vars;
    saved_env() {
      for (const char* n : {"DILOCO_RANK", "DILOCO_WORLD_SIZE", "DILOCO_STORE", "DILOCO_RUN_ID", "DILOCO_HOSTNAME",
                            "DILOCO_IFACE", "DILOCO_TIMEOUT_MS", "DILOCO_BATCH_SCHEDULING"}) {
        const char* v = std::getenv(n);
        vars.emplace_back(n, v ? v : "\x01");
        unsetenv(n);
      }
    }
    ~saved_env() {
      for (auto& [n, v] : vars)
        if (v == "\x01")
          unsetenv(n.c_str());
        else
          setenv(n.c_str(), v.c_str(), 1);
    }
  } restore;
  auto missing = [](const char* var) {
    CHECK_THROWS_WITH_AS(gloo_comm::options_from_env(), doctest::Contains((std::string(var) + " is not set").c_str()),
                         dc::config_error);
  };
  missing("DILOCO_WORLD_SIZE");
  setenv("DILOCO_WORLD_SIZE", "4", 1);
  missing("DILOCO_RANK");
  setenv("DILOCO_RANK", "2", 1);
  missing("DILOCO_STORE");
  setenv("DILOCO_STORE", "redis://10.0.0.5:7000", 1);
  auto o = gloo_comm::options_from_env();
  CHECK(o.rank == 2);
  CHECK(o.size == 4);
  CHECK(std::get<gloo_comm::redis_store>(o.rendezvous).host == "10.0.0.5");
  CHECK(std::get<gloo_comm::redis_store>(o.rendezvous).port == 7000);
  CHECK(o.run_id == "diloco");
  CHECK(o.hostname == "127.0.0.1");
  CHECK(o.timeout == 30s);
  CHECK(o.batch_scheduling);

  setenv("DILOCO_BATCH_SCHEDULING", "0", 1);
  CHECK_FALSE(gloo_comm::options_from_env().batch_scheduling);
  setenv("DILOCO_BATCH_SCHEDULING", "1", 1);
  CHECK(gloo_comm::options_from_env().batch_scheduling);

  setenv("DILOCO_STORE", "file:///shared/rdv", 1);
  setenv("DILOCO_RUN_ID", "job-17", 1);
  setenv("DILOCO_HOSTNAME", "10.1.2.3", 1);
  setenv("DILOCO_TIMEOUT_MS", "2500", 1);
  o = gloo_comm::options_from_env();
  CHECK(std::get<gloo_comm::file_store>(o.rendezvous).directory == "/shared/rdv");
  CHECK(o.run_id == "job-17");
  CHECK(o.hostname == "10.1.2.3");
  CHECK(o.timeout == 2500ms);

  auto malformed = [](const char* var, const char* value, const char* expect) {
    CAPTURE(var);
    CAPTURE(value);
    const std::string old = std::getenv(var) ? std::getenv(var) : "";
    setenv(var, value, 1);
    CHECK_THROWS_WITH_AS(gloo_comm::options_from_env(), doctest::Contains(expect), dc::config_error);
    setenv(var, old.c_str(), 1);
  };
  malformed("DILOCO_RANK", "4", "DILOCO_RANK is '4'; expected an integer in [0, 3]");
  malformed("DILOCO_RANK", "two", "DILOCO_RANK is 'two'");
  malformed("DILOCO_RANK", "1x", "DILOCO_RANK is '1x'");
  malformed("DILOCO_WORLD_SIZE", "0", "DILOCO_WORLD_SIZE is '0'");
  malformed("DILOCO_WORLD_SIZE", "99999999999999999999", "DILOCO_WORLD_SIZE is '99999999999999999999'");
  malformed("DILOCO_TIMEOUT_MS", "-5", "DILOCO_TIMEOUT_MS is '-5'");
  malformed("DILOCO_TIMEOUT_MS", "", "DILOCO_TIMEOUT_MS is ''");
  // 1000 years: accepted before and overflowed every deadline.
  malformed("DILOCO_TIMEOUT_MS", "31536000000000",
            "DILOCO_TIMEOUT_MS is '31536000000000'; expected a timeout in milliseconds in [1, 31536000000] (one "
            "year), or 'none'");
  malformed("DILOCO_TIMEOUT_MS", "99999999999999999999", "DILOCO_TIMEOUT_MS is '99999999999999999999'");
  malformed("DILOCO_TIMEOUT_MS", "None", "DILOCO_TIMEOUT_MS is 'None'");
  setenv("DILOCO_TIMEOUT_MS", "none", 1);
  CHECK(gloo_comm::options_from_env().timeout == std::chrono::milliseconds::max());
  setenv("DILOCO_TIMEOUT_MS", "31536000000", 1);  // exactly one year
  CHECK(gloo_comm::options_from_env().timeout == std::chrono::hours(24 * 365));
  setenv("DILOCO_TIMEOUT_MS", "2500", 1);
  malformed("DILOCO_STORE", "tcp://host:1", "expected file:///absolute/directory or redis://host[:port]");
  malformed("DILOCO_STORE", "file://relative/dir", "file:///absolute/directory");
  malformed("DILOCO_STORE", "redis://host:port", "DILOCO_STORE port is 'port'");
  malformed("DILOCO_STORE", "redis://:6379", "redis://host[:port]");
  malformed("DILOCO_RUN_ID", "", "DILOCO_RUN_ID is set but empty");
  malformed("DILOCO_BATCH_SCHEDULING", "yes", "DILOCO_BATCH_SCHEDULING is 'yes'; expected an integer in [0, 1]");
  setenv("DILOCO_STORE", "redis://just-a-host", 1);
  CHECK(std::get<gloo_comm::redis_store>(gloo_comm::options_from_env().rendezvous).port == 6379);
}

TEST_CASE("a Gloo message naming a peer's address is mapped to its rank, whole ports only") {
  using dc::comm::detail_gloo::rank_named_in;
  const std::vector<dc::comm::detail_gloo::peer_alias> peers{
      {0, "[127.0.0.1]:1234"}, {1, "[127.0.0.1]:999"}, {2, "[127.0.0.1]:12345"}, {1, "[127.0.0.1]:777"}};
  CHECK(rank_named_in("Connection closed by peer [127.0.0.1]:777", peers) == 1);
  CHECK(rank_named_in("Connection closed by peer [127.0.0.1]:12345", peers) == 2);
  CHECK(rank_named_in("Read error [127.0.0.1]:1234: Connection reset by peer", peers) == 0);
  CHECK_FALSE(rank_named_in("Timed out waiting 2000ms for recv operation to complete", peers).has_value());
}

// ====================================================================
int main(int argc, char** argv) {
  // A rank program: "doctest:<filter>" runs the child test cases matching
  // the filter; other roles are plain functions reporting by exit code.
  if (const char* role_env = std::getenv("DILOCO_TEST_ROLE")) {
    const std::string role = role_env;
    if (role == "kill_loop") return kill_loop();
    if (role == "expect_comm_error") return expect_comm_error();
    if (role == "timed_join") return timed_join();
    if (role == "fake_peer") return fake_peer();
    if (role.rfind("doctest:", 0) == 0) {
      doctest::Context ctx;
      ctx.setOption("no-skip", true);
      ctx.setOption("test-case", role.substr(8).c_str());
      ctx.setOption("no-version", true);
      return ctx.run();
    }
    std::fprintf(stderr, "unknown DILOCO_TEST_ROLE '%s'\n", role.c_str());
    return 2;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
