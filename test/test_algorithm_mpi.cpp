// SPDX-License-Identifier: Apache-2.0
// DiLoCo over MPI (CTest runs it with -np 2 and -np 4) on the linear
// regression problem of test_algorithm.cpp, with M = the number of ranks.
// Each process also runs the same M workers on the threads communicator and
// the algorithm's definition in double precision; MPI must reach the
// threads communicator's theta_global within 1e-6 relative after every
// round, keep its replicas bitwise identical across ranks, and count the
// same bytes.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <mutex>
#include <random>
#include <type_traits>
#include <vector>

#include "linear_regression.hpp"
#include "low_precision_reference.hpp"
#include "test_probes.hpp"

namespace dc = diloco;
using namespace linear_regression;

namespace {

constexpr int h = 5, rounds = 6;
constexpr float inner_lr = 0.05f, inner_mu = 0.9f, outer_lr = 0.7f, outer_mu = 0.9f;

// One worker's whole run on any communicator: theta (= theta_global) after
// every round, and the worker's statistics. `external`: inner::external,
// the inner steps taken by a momentum SGD written here (PyTorch's SGD:
// b = g at the first step, else mu b + g; w -= lr b), as a user's own
// optimizer would.
template <bool external = false, class Comm>
std::vector<std::vector<float>> train(const dataset& data, Comm& comm, dc::stats* stats_out) {
  const int m = comm.rank();
  // Rank 0 starts from zeros, the others from garbage: the initial broadcast
  // must make every replica start from rank 0's parameters.
  std::vector<float> w(features, m == 0 ? 0.0f : 42.0f + static_cast<float>(m));
  using inner = std::conditional_t<external, dc::inner::external, dc::inner::sgd>;
  typename inner::options io{};
  if constexpr (!external) io = {.lr = inner_lr, .momentum = inner_mu};
  dc::algorithm<inner, dc::outer::nesterov, dc::compress::none, Comm> t(
      w, comm, {.inner_steps = h, .inner = io, .outer = {.lr = outer_lr, .momentum = outer_mu}, .host_threads = 1});
  std::vector<std::vector<float>> seen;
  std::vector<float> g(features), b(features);
  for (int step = 0; step < h * rounds; ++step) {
    const auto gd = gradient(data, m, w);
    for (std::size_t j = 0; j < features; ++j) g[j] = static_cast<float>(gd[j]);
    bool applied = false;
    if constexpr (external) {
      for (std::size_t j = 0; j < features; ++j) {
        b[j] = step == 0 ? g[j] : inner_mu * b[j] + g[j];
        w[j] -= inner_lr * b[j];
      }
      applied = t.step();
    } else {
      applied = t.step(g);
    }
    if (applied) seen.push_back(w);
  }
  *stats_out = t.stats();
  return seen;
}

double max_abs(const std::vector<float>& v) {
  double out = 0.0;
  for (float x : v) out = std::max(out, std::abs(static_cast<double>(x)));
  return out;
}

}  // namespace

TEST_CASE("DiLoCo over MPI matches the threads communicator with the same M") {
  const int workers = world_size();
  const auto data = make_data(workers);
  const auto want = reference_rounds(data, workers, rounds, h, inner_lr, inner_mu, outer_lr, outer_mu);

  // The same M workers as threads inside this process.
  std::vector<std::vector<float>> threads_theta;
  std::vector<dc::stats> threads_stats(static_cast<std::size_t>(workers));
  std::mutex mu;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    dc::stats s;
    auto seen = train(data, comm, &s);
    std::lock_guard lock(mu);
    threads_stats[static_cast<std::size_t>(comm.rank())] = s;
    if (comm.rank() == 0) threads_theta = seen;
  });
  REQUIRE(threads_theta.size() == static_cast<std::size_t>(rounds));

  dc::comm::mpi comm(MPI_COMM_WORLD, {.expected_size = workers});
  dc::stats mpi_stats;
  const auto mpi_theta = train(data, comm, &mpi_stats);
  REQUIRE(mpi_theta.size() == static_cast<std::size_t>(rounds));

  double worst = 0.0;  // largest deviation from threads, relative to the parameters' scale
  for (int r = 0; r < rounds; ++r) {
    CAPTURE(r);
    const auto& got = mpi_theta[static_cast<std::size_t>(r)];
    const auto& ref = threads_theta[static_cast<std::size_t>(r)];
    // Within 1e-6 of the threads result, relative to the parameters' scale.
    for (std::size_t j = 0; j < features; ++j) {
      const double dev = std::abs(static_cast<double>(got[j]) - ref[j]) / max_abs(ref);
      CHECK(dev <= 1e-6);
      worst = std::max(worst, dev);
    }
    // And both follow the definition (fp32 against fp64 after 30 steps).
    for (std::size_t j = 0; j < features; ++j)
      CHECK(got[j] == doctest::Approx(want[static_cast<std::size_t>(r)][j]).epsilon(2e-5));
    // Every rank holds the same bits (gathered with plain MPI).
    std::vector<float> all(features * static_cast<std::size_t>(workers));
    MPI_Allgather(got.data(), static_cast<int>(features), MPI_FLOAT, all.data(), static_cast<int>(features),
                  MPI_FLOAT, MPI_COMM_WORLD);
    for (int k = 1; k < workers; ++k)
      CHECK(std::memcmp(all.data() + static_cast<std::size_t>(k) * features, all.data(),
                        features * sizeof(float)) == 0);
  }

  if (comm.rank() == 0) MESSAGE("M = ", workers, ": largest relative deviation from threads ", worst);

  // The same accounting as threads: per round one all-reduce of the
  // parameters plus one norm slot per rank, as a ring; plus the initial
  // broadcast along the chain 0 -> 1 -> ... (the last rank does not send).
  const auto& ts = threads_stats[static_cast<std::size_t>(comm.rank())];
  const std::uint64_t per_round = dc::ring_all_reduce_bytes((features + static_cast<std::size_t>(workers)) * 4,
                                                            workers);
  const std::uint64_t bcast_sent = comm.rank() == workers - 1 ? 0 : features * sizeof(float);
  CHECK(mpi_stats.last_round_bytes_sent == per_round);
  CHECK(mpi_stats.bytes_sent == per_round * rounds + bcast_sent);
  CHECK(mpi_stats.bytes_sent == ts.bytes_sent);
  CHECK(mpi_stats.bytes_received == ts.bytes_received);
  CHECK(mpi_stats.rounds == static_cast<std::uint64_t>(rounds));
}

TEST_CASE("inner::external over MPI: a momentum SGD written here takes the inner steps and gives inner::sgd's run") {
  const int workers = world_size();
  const auto data = make_data(workers);
  dc::comm::mpi comm(MPI_COMM_WORLD, {.expected_size = workers});
  dc::stats fused_stats, wrapped_stats;
  const auto fused = train(data, comm, &fused_stats);
  const auto wrapped = train<true>(data, comm, &wrapped_stats);
  REQUIRE(fused.size() == static_cast<std::size_t>(rounds));
  REQUIRE(wrapped.size() == fused.size());
  double worst = 0.0;
  for (std::size_t r = 0; r < fused.size(); ++r)
    for (std::size_t j = 0; j < features; ++j)
      worst = std::max(worst, std::abs(static_cast<double>(wrapped[r][j]) - fused[r][j]) / max_abs(fused[r]));
  if (comm.rank() == 0) MESSAGE("M = ", workers, ": inner::external vs inner::sgd, largest relative deviation ", worst);
  CHECK(worst <= 1e-6);
  CHECK(max_abs(fused.back()) > 0.1);  // the model moved
  CHECK(wrapped_stats.bytes_sent == fused_stats.bytes_sent);
  CHECK(wrapped_stats.rounds == static_cast<std::uint64_t>(rounds));
}

TEST_CASE("AdamW inner over MPI, several tensors: replicas agree with threads and with each other") {
  const int workers = world_size();
  const auto data = make_data(workers);
  auto run = [&](auto& comm) {
    const int m = comm.rank();
    using Comm = std::remove_reference_t<decltype(comm)>;
    std::vector<std::vector<float>> parts{std::vector<float>(1, 0.0f), std::vector<float>(2, 0.0f),
                                          std::vector<float>(3, 0.0f)};
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, Comm> t(
        parts, comm, {.inner_steps = 10, .inner = {.lr = 0.02f, .weight_decay = 0.01f}, .host_threads = 1});
    std::vector<float> flat(features);
    std::vector<std::vector<float>> grads{std::vector<float>(1), std::vector<float>(2), std::vector<float>(3)};
    for (int step = 0; step < 60; ++step) {
      std::size_t k = 0;
      for (const auto& p : parts)
        for (float v : p) flat[k++] = v;
      const auto g = gradient(data, m, flat);
      k = 0;
      for (auto& gp : grads)
        for (auto& v : gp) v = static_cast<float>(g[k++]);
      t.step(grads);
    }
    std::vector<float> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  std::vector<float> threads_theta;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    auto theta = run(comm);
    if (comm.rank() == 0) threads_theta = theta;
  });
  dc::comm::mpi comm(MPI_COMM_WORLD);
  const auto theta = run(comm);
  for (std::size_t j = 0; j < features; ++j)
    CHECK(std::abs(static_cast<double>(theta[j]) - threads_theta[j]) <= 1e-6 * max_abs(threads_theta));
  std::vector<float> all(features * static_cast<std::size_t>(workers));
  MPI_Allgather(theta.data(), static_cast<int>(features), MPI_FLOAT, all.data(), static_cast<int>(features), MPI_FLOAT,
                MPI_COMM_WORLD);
  for (int k = 1; k < workers; ++k)
    CHECK(std::memcmp(all.data() + static_cast<std::size_t>(k) * features, all.data(), features * sizeof(float)) == 0);
}

TEST_CASE("sync::streaming with P = 1, tau = 0, alpha = 0 over MPI is sync::blocking bit for bit (fp32, int8+EF)") {
  const int workers = world_size();
  const auto data = make_data(workers);
  dc::comm::mpi comm(MPI_COMM_WORLD, {.expected_size = workers});
  const int m = comm.rank();
  auto run = [&]<class Compressor, class Sync>(Compressor, Sync, typename Sync::options so) {
    std::vector<float> w(features, 0.0f);
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, Compressor, dc::comm::mpi, Sync> t(
        w, comm, {.inner_steps = h, .inner = {.lr = inner_lr, .momentum = inner_mu}, .sync = so, .host_threads = 1});
    std::vector<std::vector<float>> seen;
    std::vector<float> g(features);
    for (int step = 0; step < h * rounds; ++step) {
      const auto gd = gradient(data, m, w);
      for (std::size_t j = 0; j < features; ++j) g[j] = static_cast<float>(gd[j]);
      if (t.step(g)) seen.push_back(std::vector<float>(t.global_parameters().data(), t.global_parameters().data() + features));
    }
    seen.push_back(w);
    return seen;
  };
  auto compare = [&]<class Compressor>(Compressor c) {
    const auto a = run(c, dc::sync::blocking{}, {});
    const auto b = run(c, dc::sync::streaming{}, {.fragments = 1, .delay = 0, .alpha = 0.0f});
    REQUIRE(a.size() == static_cast<std::size_t>(rounds) + 1);
    REQUIRE(b.size() == a.size());
    for (std::size_t r = 0; r < a.size(); ++r) CHECK(std::memcmp(a[r].data(), b[r].data(), features * sizeof(float)) == 0);
    CHECK(a.front() != a.back());
  };
  SUBCASE("fp32") { compare(dc::compress::none{}); }
  SUBCASE("int8 + error feedback") { compare(dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>{}); }
}

TEST_CASE("bf16 replicas over MPI follow the double-precision simulation of the rules bit for bit") {
  // test/low_precision_reference.hpp: M = the ranks, plain averaging, the
  // means on bf16 ties (docs/algorithms.md section 6a).
  namespace ref = low_precision_reference;
  const int workers = world_size();
  constexpr int bf16_rounds = 4;
  const ref::expected e = ref::simulate(workers, bf16_rounds);
  REQUIRE(!e.out_of_binade);
  REQUIRE(e.tie_seen);
  dc::comm::mpi comm(MPI_COMM_WORLD, {.expected_size = workers});
  std::vector<std::vector<double>> global, replica;
  ref::run_worker<dc::bfloat16, dc::algorithm<dc::inner::external, dc::outer::sgd, dc::compress::none, dc::comm::mpi>>(
      comm, bf16_rounds, global, replica);
  CHECK(global == e.global);
  CHECK(replica == e.replica);
}
