// SPDX-License-Identifier: Apache-2.0
#pragma once

// The multi-tensor launches (exec/chunks.hpp): one block of chunk_lanes
// threads per chunk (grid-stride over the chunks), thread l running lane l's
// share of every piece of the chunk. Reductions leave one partial per chunk,
// added in chunk order on the host, so a multi-tensor sum has the host
// executor's bits. The per-thread work is exec/chunks.hpp's, which the host
// tests replay.

#if !defined(__CUDACC__)
#error "diloco/exec/cuda/chunk_kernels.cuh must be compiled with nvcc (it defines CUDA kernels)"
#endif

#include <cstddef>
#include <cuda_runtime_api.h>

#include "diloco/exec/chunks.hpp"
#include "diloco/exec/cuda/launch_plan.hpp"
#include "diloco/core/cuda_error.hpp"

namespace diloco::exec {

namespace kernel {

/// The multi-tensor element-wise kernel: one block per chunk, grid-striding over the chunks,
/// a lane per thread (chunk_for_each_lane).
template <class M>
__global__ void __launch_bounds__(chunk_lanes) chunk_for_each(M m, chunk_view t) {
  for (std::size_t c = blockIdx.x; c < t.chunks; c += gridDim.x) chunk_for_each_lane(m, t, c, threadIdx.x);
}

/// partials[c] = chunk c's sum. The lanes' sums meet in shared memory (raw
/// storage: a sum type may have default member initializers, which
/// __shared__ variables cannot run).
template <class M>
__global__ void __launch_bounds__(chunk_lanes) chunk_reduce(M m, chunk_view t, chunk_sum_t<M>* partials) {
  using R = chunk_sum_t<M>;
  __shared__ alignas(R) unsigned char storage[sizeof(R) * chunk_lanes];
  R* lanes = reinterpret_cast<R*>(storage);
  for (std::size_t c = blockIdx.x; c < t.chunks; c += gridDim.x) {
    lanes[threadIdx.x] = chunk_reduce_lane(m, t, c, threadIdx.x);
    __syncthreads();
    for (unsigned width = chunk_lanes / 2; width > 0; width /= 2) {
      chunk_tree_step(lanes, threadIdx.x, width);
      __syncthreads();
    }
    if (threadIdx.x == 0) partials[c] = lanes[0];
    __syncthreads();
  }
}

}  // namespace kernel

/// Blocks of a multi-tensor launch over `chunks` chunks.
inline unsigned chunk_blocks(std::size_t chunks) {
  return static_cast<unsigned>(chunks < grid::max_blocks ? chunks : grid::max_blocks);
}

/// m.bind(k)(i) for every element of every tensor of t, in one launch on
/// `stream`. Asynchronous; throws cuda_error if the launch fails.
template <class M>
void launch_for_each_chunked(const chunk_view& t, const M& m, cudaStream_t stream = nullptr) {
  if (t.chunks == 0) return;
  kernel::chunk_for_each<M><<<chunk_blocks(t.chunks), chunk_lanes, 0, stream>>>(m, t);
  detail::cuda_check(cudaGetLastError(), "diloco::exec::kernel::chunk_for_each launch", " (", t.chunks, " chunks, ",
                     t.elements, " elements)");
}

/// The sum over every element of every tensor of t in exec/chunks.hpp's
/// order: the chunks' partials (device_partials, then host_partials, pinned;
/// both hold t.chunks sums) added in chunk order. Synchronizes the stream.
template <class M>
chunk_sum_t<M> launch_transform_reduce_chunked(const chunk_view& t, const M& m, chunk_sum_t<M>* device_partials,
                                               chunk_sum_t<M>* host_partials, cudaStream_t stream = nullptr) {
  using R = chunk_sum_t<M>;
  if (t.chunks == 0) return R{};
  kernel::chunk_reduce<M><<<chunk_blocks(t.chunks), chunk_lanes, 0, stream>>>(m, t, device_partials);
  detail::cuda_check(cudaGetLastError(), "diloco::exec::kernel::chunk_reduce launch", " (", t.chunks, " chunks, ",
                     t.elements, " elements)");
  detail::cuda_check(cudaMemcpyAsync(host_partials, device_partials, t.chunks * sizeof(R), cudaMemcpyDeviceToHost,
                                     stream),
                     "cudaMemcpyAsync", " (chunk partials to the host)");
  detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", " (after a multi-tensor reduction)");
  R total{};
  for (std::size_t c = 0; c < t.chunks; ++c) total += host_partials[c];
  return total;
}

}  // namespace diloco::exec
