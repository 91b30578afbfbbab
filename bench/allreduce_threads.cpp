// SPDX-License-Identifier: Apache-2.0
// All-reduce throughput of the in-process threads communicator for M = 2
// and 4 workers, and a whole DiLoCo outer round (fp32 and compressed) in
// uncompressed-equivalent bytes.
//
//   bench_allreduce_threads [--min-log2 10] [--max-log2 24] [--reps 9]

#include <algorithm>
#include <chrono>
#include <diloco/diloco.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

// Median over repetitions of the slowest worker's time for one call of f.
template <class F>
double timed(dc::comm::threads::world& world, int reps, F&& make) {
  std::vector<double> t(static_cast<std::size_t>(reps));
  world.run([&](dc::comm::threads& comm) {
    auto f = make(comm);
    f();
    for (int r = 0; r < reps; ++r) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      f();
      comm.barrier();
      if (comm.rank() == 0) t[static_cast<std::size_t>(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  });
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class Compressor>
double round_seconds(dc::comm::threads::world& world, std::size_t n, int reps) {
  return timed(world, reps, [n](dc::comm::threads& comm) {
    struct state {
      std::vector<float> theta, grad;
      std::unique_ptr<dc::algorithm<dc::inner::sgd, dc::outer::nesterov, Compressor, dc::comm::threads>> t;
    };
    auto s = std::make_shared<state>();
    s->theta.assign(n, 0.0f);
    s->grad.resize(n);
    for (std::size_t i = 0; i < n; ++i) s->grad[i] = 1e-3f * static_cast<float>((i * 2654435761u + comm.rank()) % 1000) - 0.5f;
    s->t = std::make_unique<typename decltype(s->t)::element_type>(
        s->theta, comm, typename decltype(s->t)::element_type::options{.inner_steps = 1000000, .inner = {.lr = 1e-3f}});
    s->t->inner_step(s->grad);
    return [s] { s->t->outer_round(); };
  });
}

}  // namespace

int main(int argc, char** argv) {
  long lo = 10, hi = 24;
  int reps = 9;
  bench::cli cli("All-reduce and outer-round throughput of the threads communicator");
  cli.option("--min-log2", lo, "smallest size, log2 of the element count", 0L, 30L);
  cli.option("--max-log2", hi, "largest size, log2 of the element count", 0L, 30L);
  cli.option("--reps", reps, "timed repetitions per size (the median is reported)", 1, 1000);
  cli.parse(argc, argv);
  for (int m : {2, 4}) {
    dc::comm::threads::world world(m);
    const std::string w = "threads" + std::to_string(m);
    for (long k = lo; k <= hi; ++k) {
      const std::size_t n = std::size_t{1} << k;
      const std::string tag = "[2^" + std::to_string(k) + "]";
      const double t = timed(world, reps, [n](dc::comm::threads& comm) {
        auto buf = std::make_shared<std::vector<float>>(n, 1.0f);
        return [buf, &comm] { comm.all_reduce(*buf, dc::reduce_op::sum); };
      });
      const double bytes = 4.0 * static_cast<double>(n);
      bench::print(w + "_allreduce_algbw_gbps" + tag, bytes / t / 1e9);
      if (k >= 12) {
        bench::print(w + "_round_fp32_equiv_gbps" + tag, bytes / round_seconds<cp::none>(world, n, reps) / 1e9);
        bench::print(w + "_round_int8_ef_equiv_gbps" + tag,
                     bytes / round_seconds<cp::error_feedback<cp::blockwise<dc::int8>>>(world, n, reps) / 1e9);
      }
    }
  }
  return 0;
}
