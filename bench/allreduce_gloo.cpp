// SPDX-License-Identifier: Apache-2.0
// All-reduce throughput of diloco::comm::gloo (TCP over loopback) against a
// raw MPI_Allreduce on the same buffers in the same run: the processes are
// started by mpirun, which also hands out ranks; rank 0 makes a file store
// for Gloo's rendezvous and tells the others its path. Also a whole DiLoCo
// round over Gloo in uncompressed-equivalent bytes.
//
//   mpirun -np 4 bench_allreduce_gloo [--min-log2 10] [--max-log2 24] [--reps 9]

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <diloco/comm/gloo.hpp>
#include <diloco/diloco.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_mpi_common.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;


int main(int argc, char** argv) {
  // Parsed before MPI starts: a bad option ends every rank alike.
  long lo = 10, hi = 24;
  int reps = 9;
  bench::cli cli("All-reduce throughput of comm::gloo against raw MPI_Allreduce");
  cli.option("--min-log2", lo, "smallest size, log2 of the element count", 0L, 30L);
  cli.option("--max-log2", hi, "largest size, log2 of the element count", 0L, 30L);
  cli.option("--reps", reps, "timed repetitions per size (the median is reported)", 1, 1000);
  cli.parse(argc, argv);
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    int rank = 0, m = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m);
    char dir[256] = "/tmp/diloco-bench-gloo-XXXXXX";
    if (rank == 0 && mkdtemp(dir) == nullptr) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    try {
      dc::comm::gloo comm({.rank = rank, .size = m, .rendezvous = dc::comm::gloo::file_store{dir},
                           .timeout = std::chrono::seconds(120), .check_arguments = false,
                           .local_world_size = m});
      auto print = [&](const std::string& name, double v) {
        if (rank == 0) bench::print(name, v);
      };
      print("ranks", m);
      for (long k = lo; k <= hi; ++k) {
        const std::size_t n = std::size_t{1} << k;
        const std::string tag = "[2^" + std::to_string(k) + "]";
        std::vector<float> buf(n, 1.0f);
        const double t_raw = bench::raw_allreduce_seconds(buf, reps);
        const double t_gloo = bench::timed_mpi(reps, [&] { comm.all_reduce(buf, dc::reduce_op::sum); });
        const double bytes = 4.0 * static_cast<double>(n);
        print("raw_mpi_allreduce_algbw_gbps" + tag, bytes / t_raw / 1e9);
        print("gloo_allreduce_algbw_gbps" + tag, bytes / t_gloo / 1e9);
        print("gloo_allreduce_vs_raw_mpi" + tag, t_raw / t_gloo);
        if (k >= 12) {
          print("gloo_round_fp32_equiv_gbps" + tag, bytes / bench::outer_round_seconds<cp::none>(comm, n, reps) / 1e9);
          print("gloo_round_int8_ef_equiv_gbps" + tag,
                bytes / bench::outer_round_seconds<cp::error_feedback<cp::blockwise<dc::int8>>>(comm, n, reps) / 1e9);
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      code = 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) std::system(("rm -rf " + std::string(dir)).c_str());
  }
  MPI_Finalize();
  return code;
}
