// SPDX-License-Identifier: Apache-2.0
// The doctest main of the MPI tests: every rank runs the same test cases
// (their collectives pair up across ranks), and a failure on any rank fails
// the job.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context;
  // After a failed assertion a rank leaves its test case early and its
  // collectives no longer pair up with the others': stop at the first one
  // and abort the job below rather than let the others wait for it.
  context.setOption("abort-after", 1);
  if (rank != 0) context.setOption("minimal", true);  // one summary, every failure
  context.applyCommandLine(argc, argv);
  const int failed = context.run();
  if (failed != 0) {
    std::fprintf(stderr, "rank %d: test failures; aborting the MPI job\n", rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
