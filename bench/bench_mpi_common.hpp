// SPDX-License-Identifier: Apache-2.0
#pragma once

// Timing across MPI processes for the communication benchmarks: the
// slowest rank's time, median over repetitions, and a whole DiLoCo outer
// round over any communicator.

#include <mpi.h>

#include <algorithm>
#include <diloco/diloco.hpp>
#include <vector>

namespace bench {

// Median over repetitions of the slowest rank's time for one call of f
// (after one warm-up call).
template <class F>
double timed_mpi(int reps, F&& f) {
  std::vector<double> t;
  f();
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    f();
    double dt = MPI_Wtime() - t0, worst = 0.0;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t.push_back(worst);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median seconds of a raw in-place MPI_Allreduce (sum) of buf: the
// baseline every communicator is compared against in the same run.
inline double raw_allreduce_seconds(std::vector<float>& buf, int reps) {
  return timed_mpi(reps, [&] {
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
}

// Seconds of one outer round (pseudo-gradient, exchange, outer step) over
// `comm`, on n parameters after one inner SGD step.
template <class Compressor, class Comm>
double outer_round_seconds(Comm& comm, std::size_t n, int reps) {
  std::vector<float> theta(n, 0.0f), grad(n);
  for (std::size_t i = 0; i < n; ++i) grad[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 1000) - 0.5f;
  diloco::algorithm<diloco::inner::sgd, diloco::outer::nesterov, Compressor, Comm> t(
      theta, comm, {.inner_steps = 1000000, .inner = {.lr = 1e-3f}});
  t.inner_step(grad);
  return timed_mpi(reps, [&] { t.outer_round(); });
}

}  // namespace bench
