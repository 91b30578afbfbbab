// SPDX-License-Identifier: Apache-2.0
// comm::mpi over device buffers (CTest label `cuda`, under mpirun -np 2):
// every operation, blocking and non-blocking, through pinned staging and,
// when the MPI library is CUDA-aware, with device pointers handed to MPI,
// against the same closed forms as the host conformance test. Compiled by
// the host compiler with DILOCO_WITH_CUDA (diloco::cuda); exits with 77
// (CTest: skipped) on machines without a usable GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <vector>

#include "comm_conformance.hpp"

namespace dc = diloco;
using dc::comm::mpi;
using conformance::pattern;
using conformance::sum_over_ranks;
using conformance::value;

static_assert(dc::communicator<mpi>);
static_assert(dc::device_communicator<mpi>);

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what, " failed: ", cudaGetErrorString(e));
}

// Test-only device memory, filled from and read back into host vectors.
template <class T>
class device_vector {
 public:
  explicit device_vector(const std::vector<T>& host) : n_(host.size()) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p_), (n_ ? n_ : 1) * sizeof(T)), "cudaMalloc");
    if (n_) cuda_ok(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { cudaFree(p_); }
  dc::device_view<T> view() { return {p_, n_}; }
  dc::device_view<const T> cview() const { return {p_, n_}; }
  std::vector<T> to_host() const {
    std::vector<T> out(n_);
    if (n_) cuda_ok(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

void check_device_operations(mpi& comm, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  const auto mm = static_cast<std::size_t>(m);
  for (std::size_t n : conformance::sizes) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = value(r, i);
    device_vector<float> sum(x), mean(x), bcast(x);
    std::vector<std::byte> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = pattern(r, 0, i);
    device_vector<std::byte> bbytes(b);
    const int root = static_cast<int>(n % mm);
    std::vector<std::byte> blocks(n * mm), gather_send(n);
    for (int k = 0; k < m; ++k)
      for (std::size_t j = 0; j < n; ++j) blocks[static_cast<std::size_t>(k) * n + j] = pattern(r, k, j);
    for (std::size_t j = 0; j < n; ++j) gather_send[j] = pattern(r, 5, j);
    device_vector<std::byte> a2a_send(blocks), a2a_recv(std::vector<std::byte>(n * mm)), ag_send(gather_send),
        ag_recv(std::vector<std::byte>(n * mm));
    if (nonblocking) {
      // All in flight at once: each staged operation needs its own slot.
      auto q1 = comm.iall_reduce(sum.view(), dc::reduce_op::sum);
      auto q2 = comm.iall_reduce(mean.view(), dc::reduce_op::mean);
      auto q3 = comm.ibroadcast(bcast.view(), root);
      auto q4 = comm.ibroadcast(bbytes.view(), root);
      auto q5 = comm.iall_to_all(a2a_send.cview(), a2a_recv.view());
      auto q6 = comm.iall_gather(ag_send.cview(), ag_recv.view());
      q6.wait();
      q2.wait();
      q1.wait();
      q5.wait();
      q4.wait();
      q3.wait();
    } else {
      comm.all_reduce(sum.view(), dc::reduce_op::sum);
      comm.all_reduce(mean.view(), dc::reduce_op::mean);
      comm.broadcast(bcast.view(), root);
      comm.broadcast(bbytes.view(), root);
      comm.all_to_all(a2a_send.cview(), a2a_recv.view());
      comm.all_gather(ag_send.cview(), ag_recv.view());
    }
    const auto s = sum.to_host(), mu = mean.to_host(), bc = bcast.to_host();
    const auto bb = bbytes.to_host(), a2a = a2a_recv.to_host(), ag = ag_recv.to_host();
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(s[i] == static_cast<float>(sum_over_ranks(m, i)));
      REQUIRE(mu[i] == doctest::Approx(sum_over_ranks(m, i) / m).epsilon(1e-6));
      REQUIRE(bc[i] == value(root, i));
      REQUIRE(bb[i] == pattern(root, 0, i));
    }
    for (int k = 0; k < m; ++k)
      for (std::size_t j = 0; j < n; ++j) {
        REQUIRE(a2a[static_cast<std::size_t>(k) * n + j] == pattern(k, r, j));
        REQUIRE(ag[static_cast<std::size_t>(k) * n + j] == pattern(k, 5, j));
      }
  }
  comm.barrier();
}

}  // namespace

TEST_CASE("device buffers through pinned staging") {
  mpi comm(MPI_COMM_WORLD, {.device_path = dc::comm::mpi_device_path::staged});
  CHECK_FALSE(comm.passes_device_pointers());
  check_device_operations(comm, false);
  check_device_operations(comm, true);
  // Split into several MPI calls, as counts above INT_MAX are.
  mpi split(MPI_COMM_WORLD, {.max_count_per_call = 1000, .device_path = dc::comm::mpi_device_path::staged});
  check_device_operations(split, false);
  check_device_operations(split, true);
}

TEST_CASE("device buffers on the path the MPI library supports (direct when CUDA-aware)") {
  mpi comm(MPI_COMM_WORLD);
  MESSAGE("device pointers passed to MPI directly: ", comm.passes_device_pointers());
  check_device_operations(comm, false);
  check_device_operations(comm, true);
}

TEST_CASE("host buffers still work in a CUDA build") {
  mpi comm(MPI_COMM_WORLD);
  conformance::check_all_operations(comm);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, gpus = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Any error (no driver, no device) means no GPU. All ranks skip together
  // if any of them has none, so no rank waits for a missing partner.
  const cudaError_t e = cudaGetDeviceCount(&gpus);
  int usable = e == cudaSuccess && gpus > 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!usable) {
    if (rank == 0) std::printf("no usable GPU on every rank (%s): skipping\n", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    MPI_Finalize();
    return 77;
  }
  cudaSetDevice(rank % gpus);
  doctest::Context context;
  context.setOption("abort-after", 1);
  context.applyCommandLine(argc, argv);
  const int failed = context.run();
  if (failed != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return 0;
}
