#pragma once

// The CUDA executor's launches replayed on the host: every thread of the
// grid the launcher would start runs the per-thread function the kernels run
// (exec/cuda/launch_plan.hpp), the reduction's blocks combine their threads'
// sums through the same tree steps, and the partials are added in block
// order. With no GPU here, this is how the tests execute the device code
// paths: the plan, the grid-stride visit, the 4-wide bodies, the tail.

#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include <diloco/diloco.hpp>
#include <diloco/exec/cuda/launch_plan.hpp>

namespace sim {

namespace grid = diloco::exec::grid;

// Launch counts, by path taken (all simulated executors together).
struct launch_counters {
  std::atomic<long> vector{0};
  std::atomic<long> scalar{0};
  void reset() {
    vector = 0;
    scalar = 0;
  }
};
inline launch_counters launches;

template <class F>
void run_for_each(const grid::plan& p, const F& f) {
  const std::size_t threads = p.threads();
  for (std::size_t t = 0; t < threads; ++t) grid::for_each_thread(f, p, t, threads);
}

// The reduce kernel and the host's final sum, step by step.
template <class F>
double run_reduce(const grid::plan& p, const F& f) {
  const std::size_t threads = p.threads();
  std::vector<double> partials(p.blocks);
  std::vector<double> shared(p.block);
  for (unsigned b = 0; b < p.blocks; ++b) {
    for (unsigned t = 0; t < p.block; ++t)
      shared[t] = grid::reduce_thread(f, p, static_cast<std::size_t>(b) * p.block + t, threads);
    for (unsigned width = p.block / 2; width > 0; width /= 2)
      for (unsigned t = 0; t < p.block; ++t) grid::tree_step(shared.data(), t, width);  // then __syncthreads()
    partials[b] = shared[0];
  }
  return grid::sum_partials(partials.data(), p.blocks);
}

// exec::cuda's interface and launch decisions, over host memory standing in
// for device memory.
class cuda_executor {
 public:
  using memory_space = diloco::device_space;
  template <class T>
  using staging_buffer = diloco::host_buffer<T>;

  template <class F>
  void for_each(std::size_t n, const F& f) const {
    const auto p = grid::make_plan(n, grid::use_vector_path(f));
    count(p);
    run_for_each(p, f);
  }
  template <class F>
  double transform_reduce(std::size_t n, const F& f) const {
    const auto p = grid::make_plan(n, grid::use_vector_path(f), grid::block_size, grid::max_reduce_blocks);
    count(p);
    return run_reduce(p, f);
  }
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }
  template <class T>
  static void to_host(T* dst, const T* src, std::size_t n) {
    copy(dst, src, n);
  }
  template <class T>
  static void from_host(T* dst, const T* src, std::size_t n) {
    copy(dst, src, n);
  }
  static void synchronize() {}

 private:
  static void count(const grid::plan& p) {
    if (p.n == 0) return;
    (p.vectorized ? launches.vector : launches.scalar) += 1;
  }
};

}  // namespace sim
