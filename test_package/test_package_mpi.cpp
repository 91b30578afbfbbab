// SPDX-License-Identifier: Apache-2.0
// The package's MPI component: one round of model averaging with one worker
// per MPI rank, checked against its closed form. Rank m sees the constant
// gradient -(m + 1); H = 4 inner SGD steps of lr 0.5 take its replica from 0
// to 2(m + 1), and the outer step sets every replica to their mean, M + 1
// over M ranks (every value exact in binary floating point).
#include <mpi.h>

#include <cstdio>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::mpi>;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool ok = false;
  {
    dc::comm::mpi comm(MPI_COMM_WORLD);
    std::vector<float> w(3, 0.0f);
    const std::vector<float> grad(3, -static_cast<float>(comm.rank() + 1));
    trainer t(w, comm, {.inner_steps = 4, .inner = {.lr = 0.5f}});
    for (int step = 0; step < 4; ++step) t.step(grad);
    const float expected = static_cast<float>(comm.size() + 1);
    ok = w[0] == expected && w[1] == expected && w[2] == expected;
    std::printf("diloco from Conan over MPI: rank %d of %d holds %g after one averaging round (expected %g)\n",
                comm.rank(), comm.size(), static_cast<double>(w[0]), static_cast<double>(expected));
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
