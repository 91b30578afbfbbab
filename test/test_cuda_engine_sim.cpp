// SPDX-License-Identifier: Apache-2.0
// diloco::algorithm and diloco::optimizer over device-space tensors, on the
// host: in this test program "device memory" is host memory and the device
// executor is the CUDA launcher replayed thread by thread
// (cuda_grid_sim.hpp). This runs what the device engine adds to the host
// one: 64-byte padded flat buffers, the 4-wide kernels, the wire staged
// through host memory for a host communicator, device views handed to a
// device communicator. References: the fp64 definition of the algorithm,
// and the host engine (itself tested against definitions in
// test_algorithm.cpp), which must agree bit for bit because every element
// goes through the same float operations.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <chrono>
#include <cstring>
#include <diloco/diloco.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "same_bits.hpp"
#include "sim_device.hpp"
#include "threads_link.hpp"

namespace dc = diloco;

namespace {

constexpr int workers = 3;
// Awkward sizes: none but 64 a multiple of 16, so the device layout pads
// after each of them.
const std::vector<std::size_t> sizes = {3, 17, 1, 64, 5};
constexpr std::size_t parameters = 3 + 17 + 1 + 64 + 5;

// Worker m's loss: 0.5 * sum_j (w_j - target_mj)^2, gradient w - target.
float target(int m, std::size_t j) { return std::sin(static_cast<float>(7 * m) + 0.37f * static_cast<float>(j)); }

// One replica: tensors in 64-byte aligned storage (optionally starting
// `misalign` floats in), seen as host or device tensors.
template <class Space>
struct replica {
  std::vector<dc::host_buffer<float>> storage;
  std::vector<dc::tensor_view<float, Space>> params, grads;
  std::vector<dc::host_buffer<float>> grad_storage;

  replica(int rank, std::size_t misalign = 0) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      storage.emplace_back(sizes[k] + misalign);
      grad_storage.emplace_back(sizes[k] + misalign);
      params.emplace_back(storage.back().data() + misalign, sizes[k]);
      grads.emplace_back(grad_storage.back().data() + misalign, sizes[k]);
      // Ranks start apart; the initial broadcast must make them equal.
      for (std::size_t i = 0; i < sizes[k]; ++i) params[k][i] = 0.1f * static_cast<float>(rank + 1) * static_cast<float>(i % 5);
    }
  }
  void compute_grads(int rank) {
    std::size_t j = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i, ++j) grads[k][i] = params[k][i] - target(rank, j);
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& p : params) out.insert(out.end(), p.data(), p.data() + p.size());
    return out;
  }
};

struct run_result {
  std::vector<std::vector<float>> replicas;  // [rank] flat parameters after training
  std::vector<std::vector<float>> globals;   // [rank] theta_global per tensor, packed
  std::vector<dc::stats> stats;
};

// Runs `rounds` rounds of H (and `extra_steps` more) on `workers` threads
// with parameters in Space, then finish(), handing each trainer to
// `inspect` at the end.
template <class Space, class Inner, class Outer, class Compressor = dc::compress::none,
          class Sync = dc::sync::blocking, class Wrap, class Inspect>
run_result train(typename dc::algorithm_options<Inner, Outer, Compressor, Sync> opts, int rounds, Wrap wrap,
                 Inspect inspect, std::size_t misalign = 0, int extra_steps = 0) {
  run_result out;
  out.replicas.resize(workers);
  out.globals.resize(workers);
  out.stats.resize(workers);
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& threads) {
    const int m = threads.rank();
    auto comm = wrap(threads);
    replica<Space> r(m, misalign);
    dc::algorithm<Inner, Outer, Compressor, std::remove_reference_t<decltype(*comm)>, Sync> t(r.params, *comm, opts);
    for (int s = 0; s < rounds * static_cast<int>(opts.inner_steps) + extra_steps; ++s) {
      r.compute_grads(m);
      t.step(r.grads);
    }
    t.finish();
    const auto g = t.template global_parameters<Space>();
    auto& packed = out.globals[static_cast<std::size_t>(m)];
    for (std::size_t k = 0; k < sizes.size(); ++k)
      packed.insert(packed.end(), g.data() + t.global_offset(k), g.data() + t.global_offset(k) + sizes[k]);
    out.replicas[static_cast<std::size_t>(m)] = r.flat();
    out.stats[static_cast<std::size_t>(m)] = t.stats();
    inspect(t, m);
  });
  return out;
}

auto plain_comm = [](dc::comm::threads& c) { return &c; };
auto no_inspect = [](auto&, int) {};


// A communicator of device memory only, over comm::threads (in this program
// device memory is host memory). Counts the calls it receives.
class device_only_threads : public threads_device_link {
 public:
  explicit device_only_threads(dc::comm::threads& c) : threads_device_link(c) {}
  void all_reduce(dc::device_view<float> b, dc::reduce_op op) { ++all_reduces, threads().all_reduce(span(b), op); }
  void broadcast(dc::device_view<float> b, int root) { ++broadcasts, threads().broadcast(span(b), root); }
  void broadcast(dc::device_view<std::byte> b, int root) { threads().broadcast(span(b), root); }

  int all_reduces = 0;
  int broadcasts = 0;
};

// One link per worker thread, kept alive for the whole run (train() takes
// a pointer from `wrap()`).
template <class Link>
class owned_links {
 public:
  template <class... Args>
  explicit owned_links(Args... args) : make_([=](dc::comm::threads& c) { return std::make_unique<Link>(c, args...); }) {}
  auto wrap() {
    return [this](dc::comm::threads& c) {
      auto p = make_(c);
      Link* raw = p.get();
      std::lock_guard lock(mu_);
      owned_[static_cast<std::size_t>(c.rank())] = std::move(p);
      return raw;
    };
  }
  Link& operator[](std::size_t m) { return *owned_[m]; }

 private:
  std::function<std::unique_ptr<Link>(dc::comm::threads&)> make_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Link>> owned_ = std::vector<std::unique_ptr<Link>>(workers);
};

static_assert(dc::device_communicator<device_only_threads> && !dc::communicator<device_only_threads>);
static_assert(dc::detail::wire_transport<dc::comm::threads, dc::device_space, sim::cuda_executor>::staged);
static_assert(!dc::detail::wire_transport<device_only_threads, dc::device_space, sim::cuda_executor>::staged);

using adamw_nesterov = dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov, dc::compress::none>;
const adamw_nesterov adamw_opts{.inner_steps = 4,
                                .inner = {.lr = 0.05f, .weight_decay = 0.01f, .max_grad_norm = 2.0f},
                                .outer = {.lr = 0.7f, .momentum = 0.9f}};

}  // namespace

TEST_CASE("device-space engine, SGD inner and Nesterov outer, against the fp64 definition") {
  constexpr int h = 4, rounds = 5;
  constexpr double inner_lr = 0.1, outer_lr = 0.7, mu = 0.9;
  // The definition in double: replicas start from rank 0's values.
  std::vector<double> global;
  {
    replica<dc::host_space> r0(0);
    for (float v : r0.flat()) global.push_back(v);
  }
  std::vector<double> b(parameters, 0.0);
  std::vector<std::vector<double>> want;
  for (int round = 1; round <= rounds; ++round) {
    std::vector<double> delta(parameters, 0.0);
    for (int m = 0; m < workers; ++m) {
      std::vector<double> w = global;
      for (int s = 0; s < h; ++s)
        for (std::size_t j = 0; j < parameters; ++j) w[j] -= inner_lr * (w[j] - static_cast<double>(target(m, j)));
      for (std::size_t j = 0; j < parameters; ++j) delta[j] += (global[j] - w[j]) / workers;
    }
    for (std::size_t j = 0; j < parameters; ++j) {
      b[j] = round == 1 ? delta[j] : mu * b[j] + delta[j];
      global[j] -= outer_lr * (delta[j] + mu * b[j]);
    }
  }

  sim::launches.reset();
  const auto got = train<dc::device_space, dc::inner::sgd, dc::outer::nesterov>(
      {.inner_steps = h, .inner = {.lr = static_cast<float>(inner_lr)}, .outer = {.lr = 0.7f, .momentum = 0.9f}},
      rounds, plain_comm, [](auto& t, int m) {
        // Parameters counted without padding; every tensor starts on a
        // 64-byte boundary of the flat buffers, and the padding stays zero.
        CHECK(t.parameter_count() == parameters);
        const auto g = t.template global_parameters<dc::device_space>();
        std::vector<bool> inside(g.size(), false);
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          CHECK(t.global_offset(k) % 16 == 0);
          for (std::size_t i = 0; i < sizes[k]; ++i) inside[t.global_offset(k) + i] = true;
        }
        CHECK(g.size() % 16 == 0);
        for (std::size_t i = 0; i < g.size(); ++i)
          if (!inside[i]) REQUIRE(g[i] == 0.0f);
        // The wire carries the padded buffer and one norm slot per rank.
        CHECK(t.stats().last_round_bytes_sent == dc::ring_all_reduce_bytes((g.size() + workers) * sizeof(float), workers));
        (void)m;
      });
  for (int m = 0; m < workers; ++m) {
    CAPTURE(m);
    for (std::size_t j = 0; j < parameters; ++j) {
      CAPTURE(j);
      CHECK(got.replicas[static_cast<std::size_t>(m)][j] == doctest::Approx(global[j]).epsilon(1e-5));
      CHECK(got.globals[static_cast<std::size_t>(m)][j] == got.replicas[static_cast<std::size_t>(m)][j]);
    }
  }
  // Every pass over aligned tensors took the 4-wide path.
  CHECK(sim::launches.vector > 0);
  CHECK(sim::launches.scalar == 0);
}

TEST_CASE("device tensors through a host communicator (staged): the host engine's bits") {
  const auto host = train<dc::host_space, dc::inner::adamw, dc::outer::nesterov>(adamw_opts, 4, plain_comm, no_inspect);
  sim::launches.reset();
  const auto device =
      train<dc::device_space, dc::inner::adamw, dc::outer::nesterov>(adamw_opts, 4, plain_comm, no_inspect);
  CHECK(sim::launches.scalar == 0);
  for (int m = 0; m < workers; ++m) {
    CAPTURE(m);
    const auto i = static_cast<std::size_t>(m);
    CHECK(same_bits(host.replicas[i], device.replicas[i]));
    CHECK(same_bits(host.globals[i], device.globals[i]));
    CHECK(same_bits(device.replicas[i], device.replicas[0]));
    CHECK(device.stats[i].rounds == 4);
    // Norms are sums in another order: equal to rounding.
    CHECK(device.stats[i].pseudo_gradient_norm ==
          doctest::Approx(host.stats[i].pseudo_gradient_norm).epsilon(1e-6));
  }
}

TEST_CASE("a device communicator receives device views, nothing is staged, same bits") {
  const auto host = train<dc::host_space, dc::inner::adamw, dc::outer::nesterov>(adamw_opts, 3, plain_comm, no_inspect);
  owned_links<device_only_threads> owned;
  const auto device =
      train<dc::device_space, dc::inner::adamw, dc::outer::nesterov>(adamw_opts, 3, owned.wrap(), no_inspect);
  for (int m = 0; m < workers; ++m) {
    CAPTURE(m);
    const auto i = static_cast<std::size_t>(m);
    CHECK(same_bits(host.replicas[i], device.replicas[i]));
    // One broadcast per tensor at construction, one all-reduce per round.
    CHECK(owned[i].broadcasts == static_cast<int>(sizes.size()));
    CHECK(owned[i].all_reduces == 3);
  }
}

TEST_CASE("misaligned device tensors run scalar and give the same bits") {
  const auto host = train<dc::host_space, dc::inner::adamw, dc::outer::nesterov>(adamw_opts, 2, plain_comm, no_inspect);
  sim::launches.reset();
  const auto device = train<dc::device_space, dc::inner::adamw, dc::outer::nesterov>(adamw_opts, 2, plain_comm,
                                                                                     no_inspect, /*misalign=*/1);
  CHECK(sim::launches.scalar > 0);
  for (std::size_t i = 0; i < workers; ++i) CHECK(same_bits(host.replicas[i], device.replicas[i]));
}

TEST_CASE("a world of one over device tensors matches the host engine") {
  auto run = [](auto space) {
    using Space = decltype(space);
    replica<Space> r(0);
    dc::comm::local comm;
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(r.params, comm,
                                                                                               adamw_opts);
    for (int s = 0; s < 12; ++s) {
      r.compute_grads(0);
      t.step(r.grads);
    }
    CHECK(t.stats().rounds == 3);
    return r.flat();
  };
  CHECK(same_bits(run(dc::host_space{}), run(dc::device_space{})));
}

TEST_CASE("device engine: host gradients are a config error; a NaN round is rejected on every rank") {
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    replica<dc::device_space> r(m);
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(r.params, comm,
                                                                                                  adamw_opts);
    std::vector<float> host_grad(sizes[0]);
    CHECK_THROWS_WITH_AS(t.inner_step(host_grad), doctest::Contains("tensors in host memory passed to an algorithm"),
                         dc::config_error);

    // One clean round, then rank 1 produces a NaN.
    for (int s = 0; s < 4; ++s) {
      r.compute_grads(m);
      t.step(r.grads);
    }
    const auto g = t.global_parameters<dc::device_space>();
    const std::vector<float> before(g.data(), g.data() + g.size());
    for (int s = 0; s < 3; ++s) {
      r.compute_grads(m);
      t.step(r.grads);
    }
    if (m == 1) r.params[3][7] = std::nanf("");
    CHECK_THROWS_WITH_AS(t.outer_round(), doctest::Contains("rank 1 (norm nan: the pseudo-gradient holds NaN"), dc::numeric_error);
    // theta_global unchanged, the replica reset to it.
    CHECK(same_bits(std::vector<float>(g.data(), g.data() + g.size()), before));
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i) REQUIRE(r.params[k][i] == g[t.global_offset(k) + i]);
  });
}

TEST_CASE("optimizer<adamw> on device tensors: the host optimizer's bits") {
  auto run = [](auto space, auto exec) {
    using Space = decltype(space);
    replica<Space> r(2);
    dc::optimizer<dc::inner::adamw, decltype(exec)> opt(r.params, {.lr = 0.01f, .max_grad_norm = 1.0f});
    for (int s = 0; s < 7; ++s) {
      r.compute_grads(2);
      opt.step(r.grads);
    }
    return r.flat();
  };
  sim::launches.reset();
  const auto device = run(dc::device_space{}, sim::cuda_executor{});
  CHECK(sim::launches.vector > 0);
  CHECK(same_bits(run(dc::host_space{}, dc::exec::host{}), device));
}

namespace {

// Every schedule over device-space tensors against the host engine: the
// merges run inside the device apply passes (fp32 and decode-apply).
template <class Compressor, class Sync>
void host_and_device_agree(typename Sync::options so, std::uint64_t rounds, typename Compressor::options co = {}) {
  // 3 rounds of H = 6 and 2 steps more (20 steps), then finish().
  const typename dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov, Compressor, Sync> opts{
      .inner_steps = 6, .inner = {.lr = 0.05f, .weight_decay = 0.01f}, .outer = {.lr = 0.7f, .momentum = 0.9f},
      .compress = co, .sync = so};
  const auto host = train<dc::host_space, dc::inner::adamw, dc::outer::nesterov, Compressor, Sync>(
      opts, 3, plain_comm, no_inspect, 0, 2);
  const auto device = train<dc::device_space, dc::inner::adamw, dc::outer::nesterov, Compressor, Sync>(
      opts, 3, plain_comm, no_inspect, 0, 2);
  for (int m = 0; m < workers; ++m) {
    CAPTURE(m);
    const auto i = static_cast<std::size_t>(m);
    CHECK(same_bits(host.replicas[i], device.replicas[i]));
    CHECK(same_bits(host.globals[i], device.globals[i]));
    CHECK(device.stats[i].rounds == rounds);
    CHECK(host.stats[i].rounds == rounds);
  }
  CHECK(same_bits(device.globals[0], device.globals[1]));
}

}  // namespace

TEST_CASE("every schedule over device tensors gives the host engine's bits (fp32 and int8 + error feedback)") {
  using int8_ef = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 16>>;
  // 20 steps of H = 6. streaming P = 3 (s_p = 2, 4, 6), tau = 1: applied
  // after 2,4,6, 8,10,12, 14,16,18, 20, and finish() has none in flight:
  // 10 rounds. Delayed: begins after 6, applies after 12 and 18, finish()
  // applies the third.
  SUBCASE("fp32") {
    host_and_device_agree<dc::compress::none, dc::sync::streaming>({.fragments = 3, .delay = 1, .alpha = 0.5f}, 10);
    host_and_device_agree<dc::compress::none, dc::sync::one_step_delay>({}, 3);
    host_and_device_agree<dc::compress::none, dc::sync::eager>({}, 3);
  }
  SUBCASE("int8 + error feedback") {
    host_and_device_agree<int8_ef, dc::sync::streaming>(
        {.fragments = 2, .delay = 2, .alpha = 0.25f, .assignment = dc::sync::fragment_assignment::strided}, 7);
    host_and_device_agree<int8_ef, dc::sync::one_step_delay>({}, 3);
    host_and_device_agree<int8_ef, dc::sync::eager>({}, 3);
  }
  SUBCASE("adaptive: int4 in the first round, int8 after it (a budget every rung fits)") {
    using int4_ef = dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 16>>;
    using ladder = dc::compress::adaptive<int8_ef, int4_ef>;
    const ladder::options co{.rule = {.budget_seconds = 1e9, .start = 1}};
    host_and_device_agree<ladder, dc::sync::blocking>({}, 3, co);
    host_and_device_agree<ladder, dc::sync::streaming>({.fragments = 2, .delay = 1}, 7, co);
    host_and_device_agree<ladder, dc::sync::one_step_delay>({}, 3, co);
  }
  SUBCASE("chunk_topk + error feedback (sparse, gathered), alone and as an adaptive rung") {
    using sparse = dc::compress::error_feedback<dc::compress::chunk_topk<32, 4, dc::int2>>;
    host_and_device_agree<sparse, dc::sync::streaming>({.fragments = 3, .delay = 1, .alpha = 0.5f}, 10,
                                                       {.decay = 0.95f});
    host_and_device_agree<sparse, dc::sync::one_step_delay>({}, 3);
    host_and_device_agree<sparse, dc::sync::eager>({}, 3);
    using ladder = dc::compress::adaptive<int8_ef, sparse>;
    host_and_device_agree<ladder, dc::sync::streaming>({.fragments = 2, .delay = 1}, 7,
                                                       {.rule = {.budget_seconds = 1e9, .start = 1}});
  }
}

// Checkpoints of device-space state: every buffer is staged through host
// memory by the engine's executor; the round trip gives the bits of the
// uninterrupted run, and the header names the memory space.
TEST_CASE("checkpoint of a device-space engine: save, train on; load into a fresh instance, train on: the same bits") {
  using ef4 = dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 16>>;
  using T = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, ef4, dc::comm::threads, dc::sync::eager>;
  auto state_bytes = [](const T& t, const std::vector<float>& replica) {
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (const auto& e : t.state()) {
      CHECK(e.device == !e.is_scalar);
      out.emplace_back(e.name, e.is_scalar ? std::vector<float>(2, std::bit_cast<float>(static_cast<std::uint32_t>(e.value)))
                                           : std::vector<float>(e.data, e.data + e.size));
    }
    out.emplace_back("replica", replica);
    return out;
  };
  std::mutex mu;
  int compared = 0;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    const typename T::options opts{.inner_steps = 4, .inner = {.lr = 0.05f}};
    replica<dc::device_space> a(m), b(m + 10);
    T t(a.params, comm, opts), u(b.params, comm, opts);
    auto train = [&](T& x, replica<dc::device_space>& r, int steps) {
      for (int s = 0; s < steps; ++s) {
        r.compute_grads(m);
        x.step(r.grads);
      }
    };
    train(t, a, 9);
    const auto bytes = t.save_bytes();
    const auto saved = state_bytes(t, a.flat());
    train(t, a, 8);
    const auto reference = state_bytes(t, a.flat());
    t.finish();
    u.load(std::span<const std::byte>(bytes));
    CHECK(state_bytes(u, b.flat()) == saved);
    train(u, b, 8);
    CHECK(state_bytes(u, b.flat()) == reference);
    CHECK(reference != saved);
    u.finish();
    const auto img = dc::checkpoint::parse(bytes);
    CHECK(img.find("memory_space")->value.str == "device");
    // The same model in host memory is another layout: refused by name.
    std::vector<std::vector<float>> host(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) host[k].assign(sizes[k], 0.0f);
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, ef4, dc::comm::threads, dc::sync::eager> h(host, comm, opts);
    CHECK_THROWS_WITH_AS(h.load(std::span<const std::byte>(bytes)),
                         doctest::Contains("field \"memory_space\" is \"device\" in the file; this instance has \"host\""),
                         dc::format_error);
    std::lock_guard lock(mu);
    ++compared;
  });
  CHECK(compared == workers);
}

namespace {

// Blocked seconds per applied round of 2 workers whose parameters are
// device tensors, under sync::blocking over a link where every collective
// takes `d` longer, on the caller's thread (H = 4, 4 phases). Link:
// slow_link<false> (a host communicator: the wire is staged through host
// memory) or slow_link<true> (a device communicator: handed device views).
template <class Link, class Compressor>
double device_blocking_blocked_per_round(std::chrono::milliseconds d) {
  constexpr std::size_t H = 4;
  std::vector<double> per_round(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& threads) {
    const int m = threads.rank();
    Link link(threads, d);
    replica<dc::device_space> r(m);
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, Compressor, Link, dc::sync::blocking> t(
        r.params, link, {.inner_steps = H, .inner = {.lr = 0.1f}});
    for (std::size_t s = 0; s < 4 * H; ++s) {
      r.compute_grads(m);
      t.step(r.grads);
    }
    per_round[static_cast<std::size_t>(m)] = t.stats().blocked_seconds / static_cast<double>(t.stats().rounds);
    t.finish();
  });
  return std::max(per_round[0], per_round[1]);
}

// What overlap_gate (threads_link.hpp) counted on one rank, after the
// training loop (`loop`) and after finish().
struct device_gate_counts {
  int overlapped = 0, waited = 0, hung = 0;
  std::uint64_t rounds = 0;
};
struct device_gate_run {
  device_gate_counts loop, finished;
};

// Two workers over device tensors and gated_link<Device> (Device: a device
// communicator; else a host one, the wire staged through host memory),
// H = 4, 4 phases, then finish(). Each inner step is announced to the gate
// before step(), and lasts until what it released has completed.
template <bool Device, class Compressor, class Sync>
std::vector<device_gate_run> device_gated_run() {
  constexpr std::size_t H = 4;
  using link_type = gated_link<Device>;
  static_assert(dc::detail::wire_transport<link_type, dc::device_space, sim::cuda_executor>::staged == !Device);
  static_assert(dc::detail::wire_transport<link_type, dc::device_space, sim::cuda_executor>::async);
  std::vector<device_gate_run> out(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& threads) {
    const int m = threads.rank();
    overlap_gate gate;
    link_type link(threads, gate);
    replica<dc::device_space> r(m);
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, Compressor, link_type, Sync> t(
        r.params, link, {.inner_steps = H, .inner = {.lr = 0.1f}});
    gate.restart_counts();
    for (std::size_t s = 0; s < 4 * H; ++s) {
      gate.step();
      r.compute_grads(m);
      t.step(r.grads);
    }
    auto& mine = out[static_cast<std::size_t>(m)];
    mine.loop = {gate.overlapped(), gate.waited(), gate.hung(), t.stats().rounds};
    t.finish();
    mine.finished = {gate.overlapped(), gate.waited(), gate.hung(), t.stats().rounds};
  });
  return out;
}

// `collectives`: a round's (fp32: the all-reduce; the compressed mean:
// all-to-all, all-gather, vote). The exchange is hidden when each of them
// runs while the worker takes inner steps: counted by the gate, an event,
// not a time. one_step_delay begins rounds after steps 4, 8, 12 and 16:
// rounds 1-3 apply inside the loop, each stage released by the inner step
// after it was issued and found complete by the engine's poll after that
// step (3 stages fit in the 4 steps of a phase), so nothing is waited for;
// round 4 is begun by the last step, and finish() waits for all of it.
// sync::blocking over the same link waits for every collective at the
// phase end, with no inner step beside it. The lower bound on a blocking
// round's blocked seconds is what the link's sleeps guarantee.
template <bool Device, class Compressor>
void device_overlap_is_real(int collectives) {
  const auto delayed = device_gated_run<Device, Compressor, dc::sync::one_step_delay>();
  const auto blocking = device_gated_run<Device, Compressor, dc::sync::blocking>();
  for (std::size_t m = 0; m < 2; ++m) {
    CAPTURE(m);
    CHECK(delayed[m].loop.rounds == 3);
    CHECK(delayed[m].loop.overlapped == 3 * collectives);
    CHECK(delayed[m].loop.waited == 0);
    CHECK(delayed[m].finished.rounds == 4);
    CHECK(delayed[m].finished.overlapped == 3 * collectives);
    CHECK(delayed[m].finished.waited == collectives);
    CHECK(delayed[m].finished.hung == 0);
    CHECK(blocking[m].finished.rounds == 4);
    CHECK(blocking[m].finished.overlapped == 0);
    CHECK(blocking[m].finished.waited == 4 * collectives);
    CHECK(blocking[m].finished.hung == 0);
  }
  // d = 30 ms per collective, slept on the caller's thread.
  const double blocked = device_blocking_blocked_per_round<slow_link<Device>, Compressor>(std::chrono::milliseconds(30));
  MESSAGE("blocked per round: blocking ", blocked, " s");
  CHECK(blocked >= 0.9 * static_cast<double>(collectives) * 0.030);
}

}  // namespace

static_assert(dc::detail::wire_transport<slow_link<false>, dc::device_space, sim::cuda_executor>::staged);
static_assert(dc::detail::wire_transport<slow_link<false>, dc::device_space, sim::cuda_executor>::async);
static_assert(!dc::detail::wire_transport<slow_link<true>, dc::device_space, sim::cuda_executor>::staged);
static_assert(dc::detail::wire_transport<slow_link<true>, dc::device_space, sim::cuda_executor>::async);

TEST_CASE("overlap over device tensors: one-step delay hides the exchange that a blocking round waits for") {
  using int8_ef = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 16>>;
  SUBCASE("staged through host memory, fp32") { device_overlap_is_real<false, dc::compress::none>(1); }
  SUBCASE("staged through host memory, int8 + error feedback") { device_overlap_is_real<false, int8_ef>(3); }
  SUBCASE("a device communicator, fp32") { device_overlap_is_real<true, dc::compress::none>(1); }
  SUBCASE("a device communicator, int8 + error feedback") { device_overlap_is_real<true, int8_ef>(3); }
}

// The non-blocking route to a device communicator (issue, poll between
// inner steps, complete) gives the host engine's bits under the
// overlapping schedules.
TEST_CASE("a device communicator with non-blocking operations: overlapped device exchanges, the host engine's bits") {
  using int8_ef = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 16>>;
  const auto agree = []<class Compressor, class Sync>(typename Sync::options so, std::uint64_t rounds) {
    const typename dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov, Compressor, Sync> opts{
        .inner_steps = 6, .inner = {.lr = 0.05f, .weight_decay = 0.01f}, .sync = so};
    const auto host = train<dc::host_space, dc::inner::adamw, dc::outer::nesterov, Compressor, Sync>(
        opts, 3, plain_comm, no_inspect, 0, 2);
    owned_links<slow_link<true>> links(std::chrono::milliseconds(1));
    const auto device = train<dc::device_space, dc::inner::adamw, dc::outer::nesterov, Compressor, Sync>(
        opts, 3, links.wrap(), no_inspect, 0, 2);
    for (int m = 0; m < workers; ++m) {
      CAPTURE(m);
      const auto i = static_cast<std::size_t>(m);
      CHECK(same_bits(host.replicas[i], device.replicas[i]));
      CHECK(same_bits(host.globals[i], device.globals[i]));
      CHECK(device.stats[i].rounds == rounds);
    }
  };
  agree.operator()<dc::compress::none, dc::sync::one_step_delay>({}, 3);
  agree.operator()<int8_ef, dc::sync::streaming>({.fragments = 2, .delay = 2}, 7);
  agree.operator()<int8_ef, dc::sync::eager>({}, 3);
}
