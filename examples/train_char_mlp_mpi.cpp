// SPDX-License-Identifier: Apache-2.0
// The main demo across processes: the same experiment as train_char_mlp,
// with every MPI rank a worker. Rank 0 prints the table.
//
//   mpirun -np 4 train_char_mlp_mpi [same options as train_char_mlp]
//
// This is user code: it owns MPI's lifetime (MPI_Init / MPI_Finalize) and
// hands MPI_COMM_WORLD to diloco::comm::mpi.

#include <mpi.h>

#include <cstdio>
#include <diloco/comm/mpi.hpp>
#include <exception>
#include <string>
#include <vector>

#include "char_mlp/cli.hpp"
#include "char_mlp/experiment.hpp"

namespace {

int run(int argc, char** argv) {
  diloco::comm::mpi comm(MPI_COMM_WORLD);
  char_mlp::cli defaults;
  defaults.c.workers = comm.size();
  const auto opts = char_mlp::parse_cli(argc, argv, defaults, "must equal the number of MPI ranks (mpirun -np M)",
                                        comm.rank() == 0);
  if (opts.help) return 0;
  char_mlp::run_one_worker_per_process(comm, opts, " (MPI ranks)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    // The other ranks may be waiting in a collective this one left.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
