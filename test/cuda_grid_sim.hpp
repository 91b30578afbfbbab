// SPDX-License-Identifier: Apache-2.0
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

#include <algorithm>
#include <diloco/diloco.hpp>
#include <diloco/exec/cuda/launch_plan.hpp>
#include <diloco/exec/cuda/team_plan.hpp>
#include <diloco/kernels/wire_passes.hpp>

namespace sim {

namespace grid = diloco::exec::grid;

// Launch counts, by path taken (all simulated executors together).
struct launch_counters {
  std::atomic<long> vector{0};
  std::atomic<long> scalar{0};
  std::atomic<long> chunked{0};  // multi-tensor launches (exec/chunks.hpp)
  void reset() {
    vector = 0;
    scalar = 0;
    chunked = 0;
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

// exec/cuda/chunk_kernels.cuh's launches: every chunk's block, lane by
// lane; the reduction's lanes meet through the same tree steps and the
// chunks' partials are added in chunk order.
template <class M>
void run_for_each_chunked(const diloco::exec::chunk_view& t, const M& m) {
  for (std::size_t c = 0; c < t.chunks; ++c)
    for (unsigned lane = 0; lane < diloco::exec::chunk_lanes; ++lane) diloco::exec::chunk_for_each_lane(m, t, c, lane);
}
template <class M>
diloco::exec::chunk_sum_t<M> run_reduce_chunked(const diloco::exec::chunk_view& t, const M& m) {
  using R = diloco::exec::chunk_sum_t<M>;
  constexpr unsigned lanes = diloco::exec::chunk_lanes;
  std::vector<R> partials(t.chunks), shared(lanes);
  for (std::size_t c = 0; c < t.chunks; ++c) {
    for (unsigned lane = 0; lane < lanes; ++lane) shared[lane] = diloco::exec::chunk_reduce_lane(m, t, c, lane);
    for (unsigned width = lanes / 2; width > 0; width /= 2)
      for (unsigned lane = 0; lane < lanes; ++lane) diloco::exec::chunk_tree_step(shared.data(), lane, width);
    partials[c] = shared[0];
  }
  R total{};
  for (const R& p : partials) total += p;
  return total;
}

// exec/cuda/team_kernels.cuh's run_teams, block by block and phase by
// phase: every team's threads load, the team max is taken (CUB's reduction
// on the device; max is exact in any order), the program's phases run
// thread by thread, they store, then the norms' lanes, their tree level by
// level and the block's sums after the barriers.
template <class P>
void run_teams(std::size_t n, const P& p) {
  using plan = grid::team_plan<P>;
  const std::size_t blocks = plan::blocks(n);
  std::vector<typename P::registers> regs(plan::team);
  std::vector<std::int32_t> m(plan::team);
  for (std::size_t block = 0; block < blocks; ++block) {
    for (unsigned slot = 0; slot < plan::teams_per_block; ++slot) {
      const std::size_t b = block * plan::teams_per_block + slot;
      const bool live = b < n;
      typename P::shared shared{};
      for (unsigned t = 0; t < plan::team; ++t) {
        regs[t] = typename P::registers{};
        m[t] = live ? p.load(b, t, shared, regs[t]) : 0;
      }
      if constexpr (P::team_max) {
        const std::int32_t team_max = *std::max_element(m.begin(), m.end());
        std::fill(m.begin(), m.end(), team_max);
      }
      if (!live) continue;
      if constexpr (grid::team_phases<P> > 0)
        for (unsigned s = 0; s < grid::team_phases<P>; ++s)  // each after __syncthreads()
          for (unsigned t = 0; t < plan::team; ++t) p.phase(s, b, t, shared, regs[t]);
      for (unsigned t = 0; t < plan::team; ++t) p.store(b, t, shared, regs[t], m[t]);
      if constexpr (P::norms > 0) {
        for (unsigned t = 0; t < P::lane_count; ++t) p.lanes(t, shared, regs[t]);  // then a barrier
        for (unsigned w = P::lane_count / 2; w > 0; w /= 2)
          for (unsigned t = 0; t < plan::team; ++t) p.lanes_step(t, w, shared);  // then a barrier
        p.publish(b, shared);
      }
    }
  }
}

// team_kernels.cuh's checksum: every thread of the grid its share, the
// shares added (wrapping) per segment.
inline void checksum_segments(const diloco::kernels::segment_ref* segments, std::size_t count, std::size_t max_bytes,
                              std::uint64_t* sums) {
  const std::size_t threads = static_cast<std::size_t>(grid::checksum_blocks(max_bytes)) * grid::checksum_block;
  for (std::size_t k = 0; k < count; ++k) {
    sums[k] = 0;
    for (std::size_t t = 0; t < threads; ++t) sums[k] += diloco::kernels::checksum_share(segments[k], t, threads);
  }
}

// Launches of the team programs (all simulated executors together).
inline std::atomic<long> team_launches{0};

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
  // A multi-tensor launch counts as vector when every piece took the 4-wide
  // path (its functor has one and its pointers allow it).
  template <class M>
  void for_each_chunked(const diloco::exec::chunk_view& t, const M& m) const {
    if (t.chunks == 0) return;
    launches.chunked += 1;
    bool vector = true;
    for (std::size_t p = 0; p < t.first[t.chunks]; ++p) {
      const auto f = m.bind(t.pieces[p].tensor);
      if constexpr (requires { f.vec4(std::size_t{0}); f.vec4_aligned(); })
        vector = vector && f.vec4_aligned();
      else
        vector = false;
    }
    (vector ? launches.vector : launches.scalar) += 1;
    run_for_each_chunked(t, m);
  }
  template <class M>
  auto transform_reduce_chunked(const diloco::exec::chunk_view& t, const M& m) const {
    if (t.chunks) launches.chunked += 1;
    return run_reduce_chunked(t, m);
  }
  template <class P>
  void run_teams(std::size_t n, const P& p) const {
    if (n) team_launches += 1;
    sim::run_teams(n, p);
  }
  void checksum_segments(const diloco::kernels::segment_ref* segments, std::size_t count, std::size_t max_bytes,
                         std::uint64_t* sums) const {
    sim::checksum_segments(segments, count, max_bytes, sums);
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
