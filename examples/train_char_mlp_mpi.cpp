// The main demo across processes: the same experiment as train_char_mlp,
// with every MPI rank a worker. Rank 0 also runs the one-worker baseline and
// prints the table.
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
  const bool lead = comm.rank() == 0;
  char_mlp::cli defaults;
  defaults.c.workers = comm.size();
  const auto opts = char_mlp::parse_cli(argc, argv, defaults, "must equal the number of MPI ranks (mpirun -np M)", lead);
  if (opts.help) return 0;
  auto c = opts.c;
  if (c.workers != comm.size())
    throw diloco::config_error("demo: --workers " + std::to_string(c.workers) + " but " +
                               std::to_string(comm.size()) + " MPI ranks: under MPI each rank is one worker");
  char_mlp::check(c);
  const auto data = char_mlp::load_dataset(c);  // every rank builds the same data from the seed
  c.dims.vocab = data.vocab();
  if (lead) char_mlp::print_header(c, data, " (MPI ranks)");

  std::vector<char_mlp::result> rows;
  const char_mlp::result* ddp = nullptr;
  const char_mlp::result* dl = nullptr;
  rows.reserve(8);
  // The one-worker baseline needs no communication: rank 0 runs it while
  // the others wait at the barrier.
  if (opts.wants("single") && lead) rows.push_back(char_mlp::run_single(c, data));
  comm.barrier();
  if (opts.wants("ddp")) {
    rows.push_back(char_mlp::run_data_parallel(c, data, comm));
    ddp = &rows.back();
  }
  if (opts.wants("diloco"))
    dl = char_mlp::run_diloco_rows(c, data, opts.compressors, rows, [&](auto run) { return run(comm); });
  if (lead) char_mlp::print_report(rows, ddp, dl);
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
