// SPDX-License-Identifier: Apache-2.0
// comm::nccl under mpirun. Two suites, picked on the command line:
//   bootstrap  the ncclUniqueId over MPI_Bcast, node-local ranks, and clean
//              failure without a GPU; needs no GPU, runs everywhere.
//   --gpu      every conformance check over from_mpi, one device per process;
//              every rank exits 77 (CTest: skipped) unless each has a device.
// A failed check aborts the whole job, so no rank waits on a failed one.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <diloco/comm/nccl_mpi.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_comm_conformance.hpp"
#include "test_probes.hpp"

namespace dc = diloco;
using dc::comm::nccl;

TEST_SUITE("bootstrap") {
  TEST_CASE("every rank receives the id rank 0 made") {
    const int r = world_rank(), m = world_size();
    ncclUniqueId made{};
    const ncclUniqueId got = dc::comm::detail_nccl::broadcast_unique_id(MPI_COMM_WORLD, [&] {
      made = nccl::make_unique_id();
      return made;
    });
    // Compare what every rank received, gathered with plain MPI.
    std::vector<char> all(sizeof(ncclUniqueId) * static_cast<std::size_t>(m));
    REQUIRE(MPI_Allgather(got.internal, sizeof got.internal, MPI_BYTE, all.data(), sizeof got.internal, MPI_BYTE,
                          MPI_COMM_WORLD) == MPI_SUCCESS);
    for (int k = 0; k < m; ++k)
      CHECK(std::memcmp(all.data() + static_cast<std::size_t>(k) * sizeof(ncclUniqueId), got.internal,
                        sizeof got.internal) == 0);
    if (r == 0) CHECK(std::memcmp(got.internal, made.internal, sizeof made.internal) == 0);
  }

  TEST_CASE("rank 0's failure to make the id is a comm_error on every rank") {
    CHECK_THROWS_WITH_AS(dc::comm::detail_nccl::broadcast_unique_id(
                             MPI_COMM_WORLD, []() -> ncclUniqueId { throw std::runtime_error("simulated: no interface"); }),
                         doctest::Contains("rank 0 could not create the NCCL unique id: simulated: no interface"),
                         dc::comm_error);
  }

  TEST_CASE("node-local ranks number the processes of each node from 0") {
    const int m = world_size();
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    REQUIRE(MPI_Get_processor_name(name, &length) == MPI_SUCCESS);
    const int local = dc::comm::node_local_rank(MPI_COMM_WORLD);
    std::vector<char> names(static_cast<std::size_t>(m) * MPI_MAX_PROCESSOR_NAME);
    std::vector<int> locals(static_cast<std::size_t>(m));
    REQUIRE(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD) == MPI_SUCCESS);
    REQUIRE(MPI_Allgather(&local, 1, MPI_INT, locals.data(), 1, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS);
    // On my node, the local ranks of its processes are exactly 0..count-1.
    std::vector<int> mine;
    for (int k = 0; k < m; ++k)
      if (std::strncmp(names.data() + static_cast<std::size_t>(k) * MPI_MAX_PROCESSOR_NAME, name,
                       MPI_MAX_PROCESSOR_NAME) == 0)
        mine.push_back(locals[static_cast<std::size_t>(k)]);
    std::sort(mine.begin(), mine.end());
    for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == static_cast<int>(i));
  }

  TEST_CASE("without a GPU, from_mpi fails on every rank with an error, and nobody hangs") {
    // Every rank must take the same branch: from_mpi is collective.
    int gpus = device_count(), most = 0;
    MPI_Allreduce(&gpus, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (most > 0) {
      MESSAGE("a CUDA device is present: the gpu suite covers creation");
      return;
    }
    CHECK_THROWS_WITH_AS(nccl::from_mpi(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(30)}),
                         doctest::Contains("no usable CUDA device"), dc::error);
  }
}

namespace {

// This process's device (node-local rank), made current so the test's
// buffers are allocated there too.
int use_local_device() {
  const int device = dc::comm::node_local_rank(MPI_COMM_WORLD) % device_count();
  device_conformance::cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("every conformance check, one device per process, bootstrapped over MPI") {
    nccl comm = nccl::from_mpi(MPI_COMM_WORLD, {.device = use_local_device(), .timeout = std::chrono::seconds(60)});
    CHECK(comm.rank() == world_rank());
    CHECK(comm.size() == world_size());
    device_conformance::check_all_operations(comm);
  }

  TEST_CASE("a size mismatch across processes is a comm_error on every rank") {
    nccl comm = nccl::from_mpi(MPI_COMM_WORLD, {.device = use_local_device(), .timeout = std::chrono::seconds(60)});
    device_conformance::device_array<float> x(std::vector<float>(static_cast<std::size_t>(3 + comm.rank()), 1.0f));
    CHECK_THROWS_WITH_AS(comm.all_reduce(x.view(), dc::reduce_op::sum),
                         doctest::Contains("buffer sizes differ across ranks"), dc::comm_error);
    comm.barrier();  // still usable
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool gpu = false;
  for (int i = 1; i < argc; ++i) gpu = gpu || std::string(argv[i]) == "--gpu";
  if (gpu) {
    // Every process needs a device of its own on its node.
    const int devices = device_count();
    const int usable = devices > 0 && dc::comm::node_local_rank(MPI_COMM_WORLD) < devices ? 1 : 0;
    int all_usable = 0;
    MPI_Allreduce(&usable, &all_usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_usable) {
      if (world_rank() == 0) std::printf("not every process has a CUDA device of its own: skipping\n");
      MPI_Finalize();
      return 77;
    }
  }
  doctest::Context context(argc, argv);
  context.setOption("test-suite", gpu ? "gpu" : "bootstrap");
  if (gpu && world_size() < 2) {
    // One device on its own (mpirun -np 1): no peer to disagree with.
    std::printf("a world of one: the size mismatch across processes is not run\n");
    context.setOption("test-case-exclude", "*size mismatch across processes*");
  }
  context.setOption("abort-after", 1);
  // Only rank 0 reports successes; every rank reports its failures.
  if (world_rank() != 0) context.setOption("minimal", true);
  const int failures = context.run();
  if (failures != 0) {
    std::fprintf(stderr, "rank %d: %d failure(s); aborting the job\n", world_rank(), failures);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
