// SPDX-License-Identifier: Apache-2.0
#pragma once

// The kernels of the compression passes: one that runs a team program
// (kernels/compressed_blocks.hpp) with CUB's warp or block reduction for the
// team max, and the payload checksum (CUB block sum, one atomic add per
// block: a wrapping sum, so the order does not matter).

#if !defined(__CUDACC__)
#error "diloco/exec/cuda/team_kernels.cuh must be compiled with nvcc (it defines CUDA kernels)"
#endif

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>
#include <cuda_runtime_api.h>

#include "diloco/core/error.hpp"
#include "diloco/core/cuda_error.hpp"
#include "diloco/exec/cuda/team_plan.hpp"
#include "diloco/kernels/wire_passes.hpp"

namespace diloco::exec {

namespace kernel {

/// Team `threadIdx.x / team` of the block runs codec block
/// blockIdx.x * teams_per_block + that; the sequence of kernels/
/// compressed_blocks.hpp, with the barriers and the team max in between,
/// and the program's phases (grid::team_phases) before its store.
template <class P>
__global__ void __launch_bounds__(grid::team_plan<P>::threads) run_teams(P p, std::size_t n) {
  using plan = grid::team_plan<P>;
  constexpr unsigned team = plan::team;
  constexpr unsigned teams = plan::teams_per_block;
  __shared__ typename P::shared shared[teams];
  const unsigned slot = threadIdx.x / team;
  const unsigned t = threadIdx.x % team;
  const std::size_t b = static_cast<std::size_t>(blockIdx.x) * teams + slot;
  const bool live = b < n;
  typename P::registers regs{};
  std::int32_t m = live ? p.load(b, t, shared[slot], regs) : 0;
  // A team of at most a warp lies in one warp (teams are powers of two,
  // aligned in the block), so a warp's barrier orders it; larger teams are
  // the whole block.
  constexpr bool warp_team = team <= 32;
  if constexpr (P::team_max && warp_team && grid::team_phases<P> == 0) {
    // The team max by butterfly shuffles: every thread of the team ends with
    // it, no shared memory and no block barrier. Every thread of the block
    // runs this (no early exit), so the full mask holds.
    for (unsigned w = team / 2; w > 0; w /= 2) {
      const std::int32_t other = __shfl_xor_sync(0xffffffffu, m, w);
      m = other > m ? other : m;
    }
  } else if constexpr (P::team_max) {
    __shared__ std::int32_t team_max[teams];
    if constexpr (warp_team) {
      using reduce = cub::WarpReduce<std::int32_t, team>;
      __shared__ typename reduce::TempStorage temp[teams];
      m = reduce(temp[slot]).Reduce(m, cuda::maximum<>{});
    } else {
      using reduce = cub::BlockReduce<std::int32_t, team>;
      __shared__ typename reduce::TempStorage temp;
      m = reduce(temp).Reduce(m, cuda::maximum<>{});
    }
    if (t == 0) team_max[slot] = m;  // the aggregate is valid in the team's first thread
    __syncthreads();
    m = team_max[slot];
  }
  if constexpr (grid::team_phases<P> > 0) {
    for (unsigned s = 0; s < grid::team_phases<P>; ++s) {
      __syncthreads();
      if (live) p.phase(s, b, t, shared[slot], regs);
    }
    __syncthreads();
  }
  if (live) p.store(b, t, shared[slot], regs, m);
  if constexpr (P::norms > 0) {
    // The lanes and their tree (kernels/compressed_blocks.hpp, norm_scratch).
    auto team_barrier = [] {
      if constexpr (warp_team)
        __syncwarp();
      else
        __syncthreads();
    };
    team_barrier();
    if (live && t < P::lane_count) p.lanes(t, shared[slot], regs);
    for (unsigned w = P::lane_count / 2; w > 0; w /= 2) {
      team_barrier();
      if (live) p.lanes_step(t, w, shared[slot]);
    }
    team_barrier();
    if (live && t == 0) p.publish(b, shared[slot]);
  }
}

/// sums[blockIdx.y] += the checksum sum of segment blockIdx.y's payload
/// (sums zeroed before the launch).
template <unsigned Block>
__global__ void __launch_bounds__(Block) checksum_segments(const kernels::segment_ref* segments, std::uint64_t* sums) {
  const kernels::segment_ref s = segments[blockIdx.y];
  const std::uint64_t share = kernels::checksum_share(s, static_cast<std::size_t>(blockIdx.x) * Block + threadIdx.x,
                                                      static_cast<std::size_t>(gridDim.x) * Block);
  using reduce = cub::BlockReduce<std::uint64_t, Block>;
  __shared__ typename reduce::TempStorage temp;
  const std::uint64_t total = reduce(temp).Sum(share);
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  if (threadIdx.x == 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(sums + blockIdx.y), static_cast<unsigned long long>(total));
}

}  // namespace kernel

/// Runs team program p over codec blocks [0, n) on `stream`. Asynchronous;
/// throws cuda_error if the launch fails.
template <class P>
void launch_teams(std::size_t n, const P& p, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  using plan = grid::team_plan<P>;
  const std::size_t blocks = plan::blocks(n);
  if (blocks > static_cast<std::size_t>(INT_MAX))
    detail::raise<config_error>("a compression pass over ", n, " codec blocks needs ", blocks,
                                " CUDA blocks; the grid allows ", INT_MAX);
  kernel::run_teams<P><<<static_cast<unsigned>(blocks), plan::threads, 0, stream>>>(p, n);
  detail::cuda_check(cudaGetLastError(), "diloco::exec::kernel::run_teams launch", " (", n, " codec blocks, ", blocks,
                     " blocks of ", plan::threads, " threads)");
}

/// sums[k] = wire::detail::payload_words_sum of segments[k] for k < count;
/// `max_payload_bytes` bounds their payloads (it sizes the grid).
/// Asynchronous.
inline void launch_checksums(const kernels::segment_ref* segments, std::size_t count, std::size_t max_payload_bytes,
                             std::uint64_t* sums, cudaStream_t stream = nullptr) {
  if (count == 0) return;
  if (count > grid::max_checksum_segments)
    detail::raise<config_error>("a checksum over ", count, " segments; one launch covers at most ",
                                grid::max_checksum_segments);
  detail::cuda_check(cudaMemsetAsync(sums, 0, count * sizeof(std::uint64_t), stream), "cudaMemsetAsync",
                     " (zeroing ", count, " checksum sums)");
  const dim3 blocks(grid::checksum_blocks(max_payload_bytes), static_cast<unsigned>(count));
  kernel::checksum_segments<grid::checksum_block><<<blocks, grid::checksum_block, 0, stream>>>(segments, sums);
  detail::cuda_check(cudaGetLastError(), "diloco::exec::kernel::checksum_segments launch", " (", count,
                     " segments of at most ", max_payload_bytes, " bytes)");
}

}  // namespace diloco::exec
