// SPDX-License-Identifier: Apache-2.0
// All-reduce throughput across MPI processes: diloco::comm::mpi (with and
// without its cross-rank argument check) against a raw MPI_Allreduce on the
// same buffers in the same run, and the compressed mean's effective
// throughput in uncompressed-equivalent bytes (fp32 bytes of the model per
// second, for a whole exchange: encode, all-to-all, reduce, all-gather,
// agreement, decode + outer step).
//
//   mpirun -np 4 bench_allreduce_mpi [--min-log2 10] [--max-log2 24] [--reps 9]
//
// Lines `name[2^k]: value`; algbw = fp32 bytes / seconds, the ratio is
// raw time / comm::mpi time (1 = no overhead).

#include <mpi.h>

#include <algorithm>
#include <diloco/comm/mpi.hpp>
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
  bench::cli cli("All-reduce throughput of comm::mpi against raw MPI_Allreduce");
  cli.option("--min-log2", lo, "smallest size, log2 of the element count", 0L, 30L);
  cli.option("--max-log2", hi, "largest size, log2 of the element count", 0L, 30L);
  cli.option("--reps", reps, "timed repetitions per size (the median is reported)", 1, 1000);
  cli.parse(argc, argv);
  MPI_Init(&argc, &argv);
  {
    int rank = 0, m = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m);
    dc::comm::mpi checked(MPI_COMM_WORLD);
    dc::comm::mpi unchecked(MPI_COMM_WORLD, {.check_arguments = false});
    auto print = [&](const std::string& name, double v) {
      if (rank == 0) bench::print(name, v);
    };
    print("ranks", m);
    for (long k = lo; k <= hi; ++k) {
      const std::size_t n = std::size_t{1} << k;
      const std::string tag = "[2^" + std::to_string(k) + "]";
      std::vector<float> buf(n, 1.0f);
      const double t_raw = bench::raw_allreduce_seconds(buf, reps);
      const double t_checked = bench::timed_mpi(reps, [&] { checked.all_reduce(buf, dc::reduce_op::sum); });
      const double t_unchecked = bench::timed_mpi(reps, [&] { unchecked.all_reduce(buf, dc::reduce_op::sum); });
      const double bytes = 4.0 * static_cast<double>(n);
      print("raw_allreduce_algbw_gbps" + tag, bytes / t_raw / 1e9);
      print("mpi_allreduce_algbw_gbps" + tag, bytes / t_checked / 1e9);
      print("mpi_allreduce_vs_raw" + tag, t_raw / t_checked);
      print("mpi_allreduce_unchecked_vs_raw" + tag, t_raw / t_unchecked);
      if (k >= 12) {
        const double t_none = bench::outer_round_seconds<cp::none>(unchecked, n, reps);
        const double t_i8 = bench::outer_round_seconds<cp::error_feedback<cp::blockwise<dc::int8>>>(unchecked, n, reps);
        const double t_i4 = bench::outer_round_seconds<cp::error_feedback<cp::blockwise<dc::int4>>>(unchecked, n, reps);
        print("round_fp32_equiv_gbps" + tag, bytes / t_none / 1e9);
        print("round_int8_ef_equiv_gbps" + tag, bytes / t_i8 / 1e9);
        print("round_int4_ef_equiv_gbps" + tag, bytes / t_i4 / 1e9);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
