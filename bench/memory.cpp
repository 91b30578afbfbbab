// SPDX-License-Identifier: Apache-2.0
// The library's own memory per parameter, measured: every allocation goes
// through counting operator new/delete, and the live bytes an algorithm
// instance adds (its construction, then one round) are recorded for n and 2n
// parameters. The difference over n is the cost per parameter
// (`bytes_per_param`); what remains at n is a fixed cost (`fixed_bytes`:
// per-tensor tables, the communicator's bookkeeping) that does not grow with
// the model. The user's parameters and gradients are not counted.
//
//   bench_memory [--log2 22] [--workers 4]

#include <atomic>
#include <cstdlib>
#include <diloco/diloco.hpp>
#include <new>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace {

std::atomic<long long> live{0};

void* counted(std::size_t n, std::size_t align) {
  // Header in front of each block records its size.
  const std::size_t head = align < 16 ? 16 : align;
  void* raw = std::aligned_alloc(head, (n + head + head - 1) / head * head);
  if (!raw) throw std::bad_alloc();
  *static_cast<std::size_t*>(raw) = n;
  live += static_cast<long long>(n);
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

}  // namespace

int main(int argc, char** argv) {
  long log2 = 22, workers = 4;
  bench::cli cli("The library's own memory per parameter, measured by counting allocations");
  cli.option("--log2", log2, "log2 of the parameter count", 4L, 30L);
  cli.option("--workers", workers, "workers M", 1L, 64L);
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
  return 0;
}
