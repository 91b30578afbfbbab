// SPDX-License-Identifier: Apache-2.0
// comm::nccl on real GPUs, in one process: a world of one on one device,
// and with two or more devices a world of one thread per device,
// bootstrapped through a Gloo store. Exits with 77 (CTest: skipped) when no
// CUDA device is usable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <diloco/comm/elastic_nccl.hpp>
#include <diloco/comm/nccl_gloo.hpp>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "device_comm_conformance.hpp"
#include "process_harness.hpp"
#include "rank_threads.hpp"
#include "test_probes.hpp"

namespace dc = diloco;
using dc::comm::nccl;
using device_conformance::device_array;

static_assert(dc::device_communicator<nccl>);

namespace {

// Generous enough for a loaded machine, short enough that a bug fails the
// test instead of hanging it.
constexpr std::chrono::seconds test_timeout{60};

// Runs fn(comm) on one thread per rank, rank r on device r (also the
// thread's current device, where its test buffers are allocated), and
// rethrows the first failure.
template <class F>
void run_world(int size, F fn, nccl::options base = {.timeout = test_timeout}) {
  gloo::rendezvous::HashStore store;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        device_conformance::cuda_ok(cudaSetDevice(r), "cudaSetDevice");
        nccl::options opts = base;
        opts.device = r;
        nccl comm = nccl::from_store(store, r, size, opts);
        fn(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

int multi_gpu_world() { return std::min(device_count(), 4); }

}  // namespace

TEST_CASE("a world of one passes every conformance check on device 0") {
  nccl comm(nccl::make_unique_id(), 0, 1, {.device = 0, .timeout = test_timeout});
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(comm.device() == 0);
  device_conformance::check_all_operations(comm);
  CHECK(comm.traffic().bytes_sent == 0);  // a world of one moves nothing
  CHECK_FALSE(comm.aborted());
}

TEST_CASE("a world of one device per thread passes every conformance check") {
  const int m = multi_gpu_world();
  if (m < 2) {
    MESSAGE("fewer than 2 CUDA devices: skipped");
    return;
  }
  run_world(m, [](nccl& comm) { device_conformance::check_all_operations(comm); });
}

TEST_CASE("arguments that are not device memory of the communicator's device are config errors") {
  nccl comm(nccl::make_unique_id(), 0, 1, {.device = 0, .timeout = test_timeout});
  std::vector<float> pageable(8, 1.0f);
  CHECK_THROWS_WITH_AS(comm.all_reduce(dc::device_view<float>(pageable.data(), pageable.size()), dc::reduce_op::sum),
                       doctest::Contains("pageable host memory"), dc::config_error);
  float* pinned = nullptr;
  device_conformance::cuda_ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), 8 * sizeof(float)), "cudaMallocHost");
  CHECK_THROWS_WITH_AS(comm.broadcast(dc::device_view<float>(pinned, 8), 0), doctest::Contains("pinned host memory"),
                       dc::config_error);
  (void)cudaFreeHost(pinned);
  CHECK_THROWS_WITH_AS(comm.all_reduce(dc::device_view<float>(nullptr, 4), dc::reduce_op::sum),
                       doctest::Contains("null pointer"), dc::config_error);
  device_array<std::byte> a(8), b(3);
  CHECK_THROWS_WITH_AS(comm.all_gather(a.const_view(), b.view()), doctest::Contains("recv has 3 bytes, expected 8"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(comm.all_gather(a.const_view().subview(0, 4), a.view().subview(2, 4)),
                       doctest::Contains("overlap"), dc::config_error);
  CHECK_THROWS_WITH_AS(comm.broadcast(a.view(), 1), doctest::Contains("root 1 is not a rank"), dc::config_error);
  // None of that touched the communicator.
  device_array<float> x(std::vector<float>{2.0f});
  comm.all_reduce(x.view(), dc::reduce_op::sum);
  CHECK(x.download()[0] == 2.0f);
}

TEST_CASE("buffers on another device are rejected") {
  if (device_count() < 2) {
    MESSAGE("fewer than 2 CUDA devices: skipped");
    return;
  }
  nccl comm(nccl::make_unique_id(), 0, 1, {.device = 0, .timeout = test_timeout});
  device_conformance::cuda_ok(cudaSetDevice(1), "cudaSetDevice");
  device_array<float> elsewhere(std::vector<float>(4, 1.0f));
  CHECK_THROWS_WITH_AS(comm.all_reduce(elsewhere.view(), dc::reduce_op::sum),
                       doctest::Contains("is on CUDA device 1, this communicator on device 0"), dc::config_error);
  // The communicator works on device 0 and leaves the caller on device 1.
  device_conformance::cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  device_array<float> here(std::vector<float>(4, 1.0f));
  device_conformance::cuda_ok(cudaSetDevice(1), "cudaSetDevice");
  comm.all_reduce(here.view(), dc::reduce_op::sum);
  int current = -1;
  device_conformance::cuda_ok(cudaGetDevice(&current), "cudaGetDevice");
  CHECK(current == 1);
  device_conformance::cuda_ok(cudaSetDevice(0), "cudaSetDevice");
}

TEST_CASE("a stream passed in options is used and left alive") {
  cudaStream_t mine = nullptr;
  device_conformance::cuda_ok(cudaStreamCreate(&mine), "cudaStreamCreate");
  {
    nccl comm(nccl::make_unique_id(), 0, 1, {.device = 0, .stream = mine, .timeout = test_timeout});
    CHECK(comm.stream() == mine);
    device_array<float> x(std::vector<float>{3.0f});
    comm.all_reduce(x.view(), dc::reduce_op::mean);
    CHECK(x.download()[0] == 3.0f);
  }
  CHECK(cudaStreamQuery(mine) == cudaSuccess);  // still a valid stream
  device_conformance::cuda_ok(cudaStreamDestroy(mine), "cudaStreamDestroy");
}

TEST_CASE("ranks disagreeing on sizes, roots or operations get comm_error, and the communicator stays usable") {
  const int m = multi_gpu_world();
  if (m < 2) {
    MESSAGE("fewer than 2 CUDA devices: skipped");
    return;
  }
  run_world(m, [](nccl& comm) {
    const int r = comm.rank();
    device_array<float> x(std::vector<float>(static_cast<std::size_t>(4 + r), 1.0f));
    CHECK_THROWS_WITH_AS(comm.all_reduce(x.view(), dc::reduce_op::sum),
                         doctest::Contains("buffer sizes differ across ranks"), dc::comm_error);
    device_array<float> y(std::vector<float>(4, 1.0f));
    CHECK_THROWS_WITH_AS(comm.broadcast(y.view(), r), doctest::Contains("ranks disagree on the root"), dc::comm_error);
    if (r == 0)
      CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("entered all_reduce instead"), dc::comm_error);
    else
      CHECK_THROWS_WITH_AS(comm.all_reduce(y.view(), dc::reduce_op::sum), doctest::Contains("entered barrier instead"),
                           dc::comm_error);
    CHECK_FALSE(comm.aborted());
    comm.all_reduce(y.view(), dc::reduce_op::sum);
    for (float v : y.download()) CHECK(v == static_cast<float>(comm.size()));
  });
}

TEST_CASE("a collective a peer never joins times out with comm_error and aborts the communicator") {
  if (device_count() < 2) {
    MESSAGE("fewer than 2 CUDA devices: skipped");
    return;
  }
  std::atomic<bool> rank0_done{false};
  const auto start = std::chrono::steady_clock::now();
  run_world(
      2,
      [&](nccl& comm) {
        if (comm.rank() == 1) {
          // Joins nothing; its destructor must not hang either.
          while (!rank0_done.load() && std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        device_array<float> x(std::vector<float>(16, 1.0f));
        CHECK_THROWS_WITH_AS(comm.all_reduce(x.view(), dc::reduce_op::sum), doctest::Contains("ms (a peer"),
                             dc::comm_error);
        CHECK(comm.aborted());
        CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("was aborted earlier"), dc::comm_error);
        rank0_done.store(true);
      },
      {.timeout = std::chrono::seconds(3)});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(45));
}

// ----------------------------------------------------------- elastic_nccl
namespace {

dc::comm::gloo::options elastic_member(const harness::temp_dir& d, int rank, int size,
                                       std::chrono::milliseconds timeout = test_timeout) {
  dc::comm::gloo::options o;
  o.rank = rank;
  o.size = size;
  o.rendezvous = dc::comm::gloo::file_store{d.file("store")};
  o.run_id = "elastic-nccl";
  o.timeout = timeout;
  o.elastic = true;
  return o;
}

// The id rank 0 of generation g published (a real ncclUniqueId's bytes).
std::vector<char> published_id(const harness::temp_dir& d, std::uint64_t g) {
  const auto o = elastic_member(d, 0, 1);
  dc::comm::detail_gloo::rendezvous_store store(o, "elastic", "test");
  const auto record = store.store().get(dc::comm::detail_regroup::id_key(g, "nccl"));
  return dc::comm::detail_regroup::decode_group_id(record, {g, 0, 1, "r0", o.timeout}, "nccl");
}

// Each member's sum of ones over its group, on its device.
float sum_of_ones(dc::comm::elastic_nccl& comm) {
  device_array<float> x(std::vector<float>(8, 1.0f));
  comm.all_reduce(x.view(), dc::reduce_op::sum);
  const auto v = x.download();
  for (float e : v) CHECK(e == v[0]);
  return v[0];
}

}  // namespace

TEST_CASE("elastic_nccl on one device: recover() aborts the NCCL communicator and makes generation 1's from a "
          "new id") {
  harness::temp_dir d;
  dc::comm::elastic_nccl comm(elastic_member(d, 0, 1), {.options = {.device = 0}});
  REQUIRE(comm.data() != nullptr);
  CHECK(sum_of_ones(comm) == 1.0f);
  comm.recover();
  CHECK(comm.generation() == 1);
  REQUIRE(comm.data() != nullptr);
  CHECK_FALSE(comm.data()->aborted());
  CHECK(sum_of_ones(comm) == 1.0f);
  CHECK(published_id(d, 0) != published_id(d, 1));
}

TEST_CASE("elastic_nccl, one device per thread: a member that leaves, then one that stops answering; the others "
          "re-make NCCL for each smaller group") {
  const int m = multi_gpu_world();
  if (m < 2) {
    MESSAGE("fewer than 2 CUDA devices: skipped");
    return;
  }
  harness::temp_dir d;
  std::atomic<bool> done{false};
  const auto errors = run_ranks(m, [&](int r) {
    try {
      device_conformance::cuda_ok(cudaSetDevice(r), "cudaSetDevice");
      dc::comm::elastic_nccl comm(elastic_member(d, r, m, std::chrono::seconds(3)), {.options = {.device = r}});
      CHECK(sum_of_ones(comm) == static_cast<float>(m));
      const bool leaver = r == m - 1;
      CHECK(comm.at_boundary(leaver, dc::boundary_kind::round_end));
      if (leaver) return;
      CHECK(comm.generation() == 1);
      CHECK(sum_of_ones(comm) == static_cast<float>(m - 1));
      if (m - 1 < 2) return;
      // The last member stops answering: the others' NCCL all-reduce times
      // out, they recover without it and the group goes on.
      if (comm.rank() == comm.size() - 1) {
        while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      }
      device_array<float> x(std::vector<float>(8, 1.0f));
      CHECK_THROWS_AS(comm.all_reduce(x.view(), dc::reduce_op::sum), dc::comm_error);
      comm.recover();
      CHECK(comm.size() == m - 2);
      CHECK(sum_of_ones(comm) == static_cast<float>(m - 2));
      if (comm.rank() == 0) done.store(true);
    } catch (...) {
      done.store(true);  // the member waiting for the others must not wait forever
      throw;
    }
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

int main(int argc, char** argv) {
  const int devices = device_count();
  if (devices == 0) {
    std::printf("no usable CUDA device: skipping the NCCL device tests\n");
    return 77;
  }
  std::printf("%d CUDA device(s)\n", devices);
  doctest::Context context(argc, argv);
  return context.run();
}
