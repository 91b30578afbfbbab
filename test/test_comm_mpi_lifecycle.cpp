// SPDX-License-Identifier: Apache-2.0
// comm::mpi and the MPI lifetime, which belongs to the user: before MPI_Init
// and after MPI_Finalize constructing one is a config_error (diloco never
// initializes MPI behind the user's back), and an object destroyed after
// MPI_Finalize must not touch MPI. Runs under mpirun -np 2; the test cases
// run in file order and MPI_Init / MPI_Finalize happen inside them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <diloco/comm/mpi.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dc = diloco;

namespace {
// Survives MPI_Finalize on purpose: its destructor runs at exit.
std::optional<dc::comm::mpi> outliving;

bool mentions(const dc::config_error& e, const char* part) { return std::string(e.what()).find(part) != std::string::npos; }
}  // namespace

TEST_CASE("1: before MPI_Init: config_error, and MPI is still not initialized") {
  try {
    dc::comm::mpi comm(MPI_COMM_WORLD);
    FAIL("constructed a communicator before MPI_Init");
  } catch (const dc::config_error& e) {
    CHECK(mentions(e, "MPI is not initialized"));
  }
  int initialized = 1;
  MPI_Initialized(&initialized);
  CHECK(initialized == 0);
}

TEST_CASE("2: between MPI_Init and MPI_Finalize: works, and may outlive MPI_Finalize") {
  int argc = 0;
  char** argv = nullptr;
  REQUIRE(MPI_Init(&argc, &argv) == MPI_SUCCESS);
  {
    dc::comm::mpi comm(MPI_COMM_WORLD);
    std::vector<float> x(4, static_cast<float>(comm.rank() + 1));
    comm.all_reduce(x, dc::reduce_op::sum);
    const int m = comm.size();
    for (float v : x) CHECK(v == static_cast<float>(m * (m + 1) / 2));
  }
  outliving.emplace(MPI_COMM_WORLD);
  outliving->barrier();
  REQUIRE(MPI_Finalize() == MPI_SUCCESS);
}

TEST_CASE("3: after MPI_Finalize: config_error") {
  try {
    dc::comm::mpi comm(MPI_COMM_WORLD);
    FAIL("constructed a communicator after MPI_Finalize");
  } catch (const dc::config_error& e) {
    CHECK(mentions(e, "MPI is already finalized"));
  }
  outliving.reset();  // must not call MPI_Comm_free now
}

int main(int argc, char** argv) {
  doctest::Context context;
  context.setOption("order-by", "file");
  context.applyCommandLine(argc, argv);
  return context.run();
}
