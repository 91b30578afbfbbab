// SPDX-License-Identifier: Apache-2.0
// The library's own memory per parameter, measured: every allocation goes
// through counting operator new/delete, and the live bytes an algorithm
// instance adds (its construction, then one round) are recorded for n and 2n
// parameters. The difference over n is the cost per parameter
// (`bytes_per_param`); what remains at n is a fixed cost (`fixed_bytes`:
// per-tensor tables, the communicator's bookkeeping) that does not grow with
// the model. The user's parameters and gradients are not counted.
//
// Groups (diloco::replicated over a mesh of R = 2 groups of G ranks, the
// quiet world's rank 0): the bytes per parameter of one rank after
// construction, after a round, and at the peak during the round (`peak_`:
// transient buffers included), for G = 1, 2, 4, at 2^24 and 2^25
// parameters (smaller models cross the engine's fixed-size staging buffers
// between the two sizes, which bends the slope). Sharded outer state should
// cost 1/G of G = 1's at every G, and the peak no more than the steady
// state (the replica's gather travels in fixed-size chunks).
//
//   bench_memory [--log2 22] [--workers 4] [--groups-log2 24] [--max-group 4]

#include <atomic>
#include <cstdlib>
#include <memory>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <new>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace {

std::atomic<long long> live{0};
std::atomic<long long> peak{0};  // the most live bytes since reset_peak()

void reset_peak() { peak = live.load(); }

void* counted(std::size_t n, std::size_t align) {
  // Header in front of each block records its size.
  const std::size_t head = align < 16 ? 16 : align;
  void* raw = std::aligned_alloc(head, (n + head + head - 1) / head * head);
  if (!raw) throw std::bad_alloc();
  *static_cast<std::size_t*>(raw) = n;
  const long long now = live += static_cast<long long>(n);
  long long seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
  return static_cast<char*>(raw) + head;
}
void uncounted(void* p, std::size_t align) {
  if (!p) return;
  const std::size_t head = align < 16 ? 16 : align;
  void* raw = static_cast<char*>(p) - head;
  live -= static_cast<long long>(*static_cast<std::size_t*>(raw));
  std::free(raw);
}

}  // namespace

void* operator new(std::size_t n) { return counted(n, 16); }
void* operator new[](std::size_t n) { return counted(n, 16); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { uncounted(p, 16); }
void operator delete[](void* p) noexcept { uncounted(p, 16); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p, 16); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p, 16); }
void operator delete(void* p, std::align_val_t a) noexcept { uncounted(p, static_cast<std::size_t>(a)); }
void operator delete[](void* p, std::align_val_t a) noexcept { uncounted(p, static_cast<std::size_t>(a)); }
void operator delete(void* p, std::size_t, std::align_val_t a) noexcept { uncounted(p, static_cast<std::size_t>(a)); }
void operator delete[](void* p, std::size_t, std::align_val_t a) noexcept { uncounted(p, static_cast<std::size_t>(a)); }

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

// A world of M ranks in which nothing is exchanged: enough to build an
// algorithm instance for any M (the buffers depend on M) without the cost of
// M real workers. Its collectives leave buffers as they are.
struct quiet_world {
  int m;
  // The sizes of the communicators split from this one, in the order
  // comm/mesh.hpp splits them: intra (G ranks), then inter (R ranks).
  std::vector<int> split_sizes{};
  using request = dc::comm::local::request;
  int rank() const { return 0; }
  int size() const { return m; }
  dc::traffic_counters traffic() const { return {}; }
  void all_reduce(std::span<float>, dc::reduce_op) {}
  void broadcast(std::span<float>, int) {}
  void broadcast(std::span<std::byte>, int) {}
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) {
    // Every rank "sends" this rank's own encodings: valid segments for the
    // rank-0 shard checks, so the round runs its real passes.
    const std::size_t slot = s.size() / static_cast<std::size_t>(m);
    for (int k = 0; k < m; ++k) std::copy_n(s.data(), slot, r.data() + static_cast<std::size_t>(k) * slot);
  }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) {
    for (int k = 0; k < m; ++k) std::copy_n(s.data(), s.size(), r.data() + static_cast<std::size_t>(k) * s.size());
  }
  void barrier() {}
  request iall_reduce(std::span<float>, dc::reduce_op) { return {}; }
  request ibroadcast(std::span<float>, int) { return {}; }
  request ibroadcast(std::span<std::byte>, int) { return {}; }
  request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) { return all_to_all(s, r), request{}; }
  request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) { return all_gather(s, r), request{}; }
  request ibarrier() { return {}; }
};

// mesh<quiet_world> splits through this (found by argument-dependent
// lookup): this rank (rank 0 everywhere) in a world of the next size.
std::unique_ptr<quiet_world> split_communicator(quiet_world& parent, int, int) {
  const int size = parent.split_sizes.front();
  parent.split_sizes.erase(parent.split_sizes.begin());
  return std::make_unique<quiet_world>(quiet_world{size});
}

struct live_bytes {
  long long constructed, after_round;
};

template <class Inner, class Compressor>
live_bytes measure_at(std::size_t n, int world) {
  std::vector<float> params(n, 1.0f), grads(n, 0.001f);
  quiet_world comm{world};
  const long long before = live.load();
  long long after_construction = 0, after_round = 0;
  {
    dc::algorithm<Inner, dc::outer::nesterov, Compressor, quiet_world> t(params, comm,
                                                                         {.inner_steps = 1, .broadcast_initial = false});
    after_construction = live.load();
    try {
      t.step(grads);
    } catch (const dc::error&) {
      // The quiet world's segments all claim to come from rank 0; shard
      // checks for other senders may reject the round. The buffers are the
      // same either way.
    }
    after_round = live.load();
  }
  return {after_construction - before, after_round - before};
}

template <class Inner, class Compressor>
void measure(const char* name, std::size_t n, int world) {
  const live_bytes at_n = measure_at<Inner, Compressor>(n, world);
  const live_bytes at_2n = measure_at<Inner, Compressor>(2 * n, world);
  const double np = static_cast<double>(n);
  const auto report = [&](const std::string& what, long long b1, long long b2) {
    const double per_param = static_cast<double>(b2 - b1) / np;
    bench::print(std::string(name) + what + "bytes_per_param", per_param);
    bench::print(std::string(name) + what + "fixed_bytes", static_cast<double>(b1) - per_param * np);
  };
  report(".", at_n.constructed, at_2n.constructed);
  report(".after_round_", at_n.after_round, at_2n.after_round);
}

// ------------------------------------------------------------------ groups
struct group_bytes {
  long long constructed, after_round, peak;  // above what was live before
};

// Rank 0 of a mesh of R = 2 groups of G ranks over the quiet world, with
// its replica of n parameters (allocated before counting); one round (H = 1).
// The quiet world copies nothing of its own, so every byte counted is the
// library's (a real communicator's staging is not).
template <class Compressor>
group_bytes measure_groups_at(std::size_t n, int gsize) {
  quiet_world world{2 * gsize, {gsize, 2}};
  dc::mesh<quiet_world> m(world, {.group_size = gsize});
  std::vector<float> params(n, 1.0f), grads(n, 0.001f);
  group_bytes out{};
  const long long before = live.load();
  reset_peak();
  {
    dc::replicated<dc::inner::sgd, dc::outer::nesterov, Compressor, quiet_world> t(params, m, {.inner_steps = 1,
                                                                                               .broadcast_initial = false});
    out.constructed = live.load() - before;
    try {
      t.step(grads);
    } catch (const dc::error&) {
      // As measure_at: the quiet world's segments may fail the shard checks.
    }
    out.after_round = live.load() - before;
    out.peak = peak.load() - before;
  }
  return out;
}

// Prints name.G<g>.{bytes_per_param,after_round_bytes_per_param,peak_bytes_per_param}
// per rank, and each against G = 1's (`_vs_G1`; sharded outer state: 1/G).
template <class Compressor>
void measure_groups(const char* name, std::size_t n, int max_group) {
  std::vector<double> first;
  for (int g = 1; g <= max_group; g *= 2) {
    const group_bytes a = measure_groups_at<Compressor>(n, g), b = measure_groups_at<Compressor>(2 * n, g);
    const double per_rank = static_cast<double>(n);
    const std::vector<double> v{static_cast<double>(b.constructed - a.constructed) / per_rank,
                                static_cast<double>(b.after_round - a.after_round) / per_rank,
                                static_cast<double>(b.peak - a.peak) / per_rank};
    if (g == 1) first = v;
    const char* what[] = {"bytes_per_param", "after_round_bytes_per_param", "peak_bytes_per_param"};
    for (std::size_t k = 0; k < v.size(); ++k) {
      const std::string key = std::string("groups.") + name + ".G" + std::to_string(g) + "." + what[k];
      bench::print(key, v[k]);
      if (g > 1 && first[k] > 0.0) bench::print(key + "_vs_G1", v[k] / first[k]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  long log2 = 22, workers = 4, max_group = 4, groups_log2 = 24;
  bench::cli cli("The library's own memory per parameter, measured by counting allocations");
  cli.option("--log2", log2, "log2 of the parameter count", 4L, 30L);
  cli.option("--workers", workers, "workers M", 1L, 64L);
  cli.option("--groups-log2", groups_log2, "log2 of the parameter count of the groups section", 4L, 30L);
  cli.option("--max-group", max_group, "the largest group size G of the groups section (1, 2, 4, ...)", 1L, 16L);
  cli.parse(argc, argv);
  const std::size_t n = std::size_t{1} << log2;
  const int world = static_cast<int>(workers);
  bench::print("parameters", static_cast<double>(n));
  bench::print("parameters_second_size", static_cast<double>(2 * n));
  bench::print("workers", world);
  // Inner SGD without momentum keeps no state: what remains is DiLoCo's.
  measure<dc::inner::sgd, cp::none>("none", n, world);
  measure<dc::inner::sgd, cp::cast<dc::bf16>>("bf16", n, world);
  measure<dc::inner::sgd, cp::blockwise<dc::int8>>("int8", n, world);
  measure<dc::inner::sgd, cp::error_feedback<cp::blockwise<dc::int8>>>("int8_ef", n, world);
  measure<dc::inner::sgd, cp::error_feedback<cp::blockwise<dc::int4>>>("int4_ef", n, world);
  // For reference: AdamW's own state (m, v) on top.
  measure<dc::inner::adamw, cp::none>("none_with_adamw_state", n, world);
  // Replicated groups with sharded outer state: per rank, for G = 1, 2, 4.
  const std::size_t gn = std::size_t{1} << groups_log2;
  bench::print("groups.parameters", static_cast<double>(gn));
  measure_groups<cp::none>("none", gn, static_cast<int>(max_group));
  measure_groups<cp::error_feedback<cp::blockwise<dc::int4>>>("int4_ef", gn, static_cast<int>(max_group));
  return 0;
}
