// SPDX-License-Identifier: Apache-2.0
#pragma once

// The generic kernels: one grid-stride launch for element-wise functors and
// one for reductions. Each thread runs exec/cuda/launch_plan.hpp's
// per-thread function, the code the host tests simulate.

#if !defined(__CUDACC__)
#error "diloco/exec/cuda/kernels.cuh must be compiled with nvcc (it defines CUDA kernels)"
#endif

#include <cstddef>
#include <cuda_runtime_api.h>

#include "diloco/exec/cuda/launch_plan.hpp"
#include "diloco/core/cuda_error.hpp"

namespace diloco::exec {

namespace kernel {

/// This thread's index in the grid.
DILOCO_FORCEINLINE __device__ std::size_t thread_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
/// The threads in the grid.
DILOCO_FORCEINLINE __device__ std::size_t thread_count() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

/// The element-wise kernel: this thread's share of f over the plan (grid::for_each_thread).
template <class F>
__global__ void __launch_bounds__(grid::block_size) for_each(F f, grid::plan p) {
  grid::for_each_thread(f, p, thread_index(), thread_count());
}

/// Writes the block's sum into partials[blockIdx.x]; blockDim.x must be
/// grid::block_size.
template <class F>
__global__ void __launch_bounds__(grid::block_size) reduce(F f, grid::plan p, double* partials) {
  __shared__ double sums[grid::block_size];
  sums[threadIdx.x] = grid::reduce_thread(f, p, thread_index(), thread_count());
  __syncthreads();
  for (unsigned width = grid::block_size / 2; width > 0; width /= 2) {
    grid::tree_step(sums, threadIdx.x, width);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

}  // namespace kernel

/// Runs f(i) for every i in [0, n) on `stream` (4 elements at a time where
/// the functor allows it and its pointers are aligned). Asynchronous: returns
/// once the kernel is queued. Throws cuda_error if the launch fails.
template <class F>
void launch_for_each(std::size_t n, const F& f, cudaStream_t stream = nullptr) {
  const grid::plan p = grid::make_plan(n, grid::use_vector_path(f));
  if (p.blocks == 0) return;
  kernel::for_each<F><<<p.blocks, p.block, 0, stream>>>(f, p);
  detail::cuda_check(cudaGetLastError(), "diloco::exec::kernel::for_each launch", " (", n, " elements, ", p.blocks,
                     " blocks)");
}

/// Runs f(i) for every i in [0, n) on `stream` and returns the sum of what it
/// returns, as double. Deterministic: the grid depends only on n and the
/// pointers' alignment, every block sums in a fixed tree, and the partials
/// are added in block order on the host. `device_partials` and
/// `host_partials` (pinned) hold at least grid::max_reduce_blocks doubles.
/// Synchronizes the stream.
template <class F>
double launch_transform_reduce(std::size_t n, const F& f, double* device_partials, double* host_partials,
                               cudaStream_t stream = nullptr) {
  const grid::plan p = grid::make_plan(n, grid::use_vector_path(f), grid::block_size, grid::max_reduce_blocks);
  if (p.blocks == 0) return 0.0;
  kernel::reduce<F><<<p.blocks, p.block, 0, stream>>>(f, p, device_partials);
  detail::cuda_check(cudaGetLastError(), "diloco::exec::kernel::reduce launch", " (", n, " elements, ", p.blocks,
                     " blocks)");
  detail::cuda_check(cudaMemcpyAsync(host_partials, device_partials, p.blocks * sizeof(double),
                                     cudaMemcpyDeviceToHost, stream),
                     "cudaMemcpyAsync", " (reduction partials to the host)");
  detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", " (after a reduction)");
  return grid::sum_partials(host_partials, p.blocks);
}

}  // namespace diloco::exec
