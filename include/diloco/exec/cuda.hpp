// SPDX-License-Identifier: Apache-2.0
#pragma once

// exec::cuda: the device executor. Runs the library's DILOCO_HD functors on
// a CUDA stream with the same interface as exec::host (see exec/host.hpp),
// and is the executor the algorithm picks for device tensors.

#if !defined(__CUDACC__)
#error "diloco/exec/cuda.hpp must be compiled with nvcc; include <diloco/cuda.hpp> from a .cu file"
#endif

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

#include "diloco/core/memory_space.hpp"
#include "diloco/exec/chunks.hpp"
#include "diloco/exec/executor_for.hpp"
#include "diloco/exec/cuda/chunk_kernels.cuh"
#include "diloco/exec/cuda/kernels.cuh"
#include "diloco/exec/cuda/launch_plan.hpp"
#include "diloco/core/cuda_error.hpp"
#include "diloco/exec/cuda/team_kernels.cuh"
#include "diloco/memory/device_buffer.hpp"

namespace diloco::exec {

/// Bound to one stream (default: the default stream). Element-wise passes and
/// device-to-device copies are queued and return at once; reductions,
/// to_host and from_host wait for the stream, since their results (or the
/// host source) are used as soon as they return. Not thread-safe: one
/// executor per worker.
class cuda {
 public:
  using memory_space = device_space;  ///< the memory its passes read and write
  /// Host memory that device data is staged through (to a host communicator).
  template <class T>
  using staging_buffer = pinned_buffer<T>;

  /// Queues every pass and copy on `stream` (nullptr: the legacy default stream).
  explicit cuda(cudaStream_t stream = nullptr) : stream_(stream) {}
  /// From algorithm_options::device_stream (a cudaStream_t held as void*).
  static cuda on_stream(void* stream) { return cuda(static_cast<cudaStream_t>(stream)); }

  /// The stream the passes are queued on.
  cudaStream_t stream() const { return stream_; }

  /// f(i) for every i in [0, n), queued (4 elements at a time where the functor allows it).
  template <class F>
  void for_each(std::size_t n, const F& f) const {
    launch_for_each(n, f, stream_);
  }

  /// The sum of f(i) over [0, n), as double, in a fixed order (the grid depends only on n and
  /// alignment); waits for the stream.
  template <class F>
  double transform_reduce(std::size_t n, const F& f) {
    if (n == 0) return 0.0;
    // Sized once, on first use: the steady state allocates nothing.
    if (device_partials_.size() == 0) {
      device_partials_ = device_buffer<double>(grid::max_reduce_blocks);
      host_partials_ = pinned_buffer<double>(grid::max_reduce_blocks);
    }
    return launch_transform_reduce(n, f, device_partials_.data(), host_partials_.data(), stream_);
  }

  /// Multi-tensor passes (exec/chunks.hpp): one launch over every tensor of
  /// a chunk table in device memory (tensor/tensor_list.hpp).
  template <class M>
  void for_each_chunked(const chunk_view& t, const M& m) const {
    launch_for_each_chunked(t, m, stream_);
  }
  /// The sum over every element of every tensor of t, in exec/chunks.hpp's order; waits for the
  /// stream.
  template <class M>
  chunk_sum_t<M> transform_reduce_chunked(const chunk_view& t, const M& m) {
    using R = chunk_sum_t<M>;
    const std::size_t bytes = t.chunks * sizeof(R);
    // Grown to the largest table seen: the steady state allocates nothing.
    if (chunk_partials_device_.size() < bytes) {
      chunk_partials_device_ = device_buffer<std::byte>(bytes);
      chunk_partials_host_ = pinned_buffer<std::byte>(bytes);
    }
    return launch_transform_reduce_chunked(t, m, reinterpret_cast<R*>(chunk_partials_device_.data()),
                                           reinterpret_cast<R*>(chunk_partials_host_.data()), stream_);
  }

  /// The compression passes (the device operations of compress/compressed_mean.hpp
  /// and gathered_mean.hpp): a team program over n codec blocks, and the
  /// checksum sums of `count` payloads.
  /// Both are queued and return at once.
  template <class P>
  void run_teams(std::size_t n, const P& p) const {
    launch_teams(n, p, stream_);
  }
  /// Queues the checksum sums of `count` payloads (kernels::segment_ref) into sums[0, count).
  void checksum_segments(const kernels::segment_ref* segments, std::size_t count, std::size_t max_payload_bytes,
                         std::uint64_t* sums) const {
    launch_checksums(segments, count, max_payload_bytes, sums, stream_);
  }

  /// Copies n elements between device buffers, queued.
  template <class T>
  void copy(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    detail::cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
                       "cudaMemcpyAsync", " (device to device, ", n * sizeof(T), " bytes)");
  }
  /// Copies n elements from device to host memory; returns once they are there.
  template <class T>
  void to_host(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    detail::cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync",
                       " (device to host, ", n * sizeof(T), " bytes)");
    synchronize();
  }
  /// Copies n elements from host to device memory; returns once the host source is no longer
  /// needed.
  template <class T>
  void from_host(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    detail::cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync",
                       " (host to device, ", n * sizeof(T), " bytes)");
    synchronize();
  }
  /// Waits for everything queued on the stream; throws cuda_error if any of it failed.
  void synchronize() const { detail::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
  device_buffer<double> device_partials_;
  pinned_buffer<double> host_partials_;
  device_buffer<std::byte> chunk_partials_device_;
  pinned_buffer<std::byte> chunk_partials_host_;
};

}  // namespace diloco::exec

namespace diloco::detail {

// Device tensors run their passes through exec::cuda.
template <>
struct executor_for<device_space> {
  using type = exec::cuda;
};

}  // namespace diloco::detail
