// SPDX-License-Identifier: Apache-2.0
// Trains y = 3x - 1 with one worker per MPI rank; every rank exits non-zero
// unless its replica fits the line, so the test checks that the package
// works across processes, not just that it links.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <vector>

namespace dc = diloco;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ok = 0;
  {
    using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::mpi>;
    dc::comm::mpi comm(MPI_COMM_WORLD);
    std::vector<float> w{0.0f, 0.0f};  // slope, intercept
    trainer t(w, comm, {.inner_steps = 10, .inner = {.lr = 0.3f, .momentum = 0.5f}});
    std::vector<float> g(2);
    for (int step = 0; step < 1000; ++step) {
      g = {0.0f, 0.0f};
      for (int i = 0; i < 8; ++i) {
        const float x = static_cast<float>(comm.rank() * 8 + i) / (8.0f * static_cast<float>(comm.size()));
        const float err = w[0] * x + w[1] - (3.0f * x - 1.0f);
        g[0] += err * x / 8.0f;
        g[1] += err / 8.0f;
      }
      t.step(g);
    }
    std::printf("rank %d of %d: slope %.4f intercept %.4f after %llu rounds\n", comm.rank(), comm.size(), w[0], w[1],
                static_cast<unsigned long long>(t.stats().rounds));
    ok = comm.size() > 1 && std::abs(w[0] - 3.0f) < 1e-2f && std::abs(w[1] + 1.0f) < 1e-2f;
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
