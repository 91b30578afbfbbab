// SPDX-License-Identifier: Apache-2.0
// comm::mpi has one layout whatever the translation unit: compiled without
// CUDA, by the host compiler with DILOCO_WITH_CUDA (this file), and by nvcc.
// A program may mix them, so a request made in one is waited on in
// another: here a mean started in the host-only file completes in the nvcc
// one, and every rank checks it against the closed form (the mean of
// 1, 3, 5, ... over M ranks is M).
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "layout.hpp"

static_assert(DILOCO_MPI_DEVICE_BUFFERS, "this translation unit is compiled with DILOCO_WITH_CUDA");

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    using mpi_layout::layout;
    const layout with_cuda = mpi_layout::layout_here();
    const layout host_only = mpi_layout::host_only();
    const layout nvcc = mpi_layout::nvcc();
    diloco::comm::mpi comm(MPI_COMM_WORLD);
    if (comm.rank() == 0) {
      host_only.print("host compiler, no CUDA:");
      with_cuda.print("host compiler, DILOCO_WITH_CUDA:");
      nvcc.print("nvcc:");
    }
    if (!(host_only == with_cuda) || !(nvcc == with_cuda)) {
      std::printf("rank %d: comm::mpi's layout differs between translation units\n", comm.rank());
      ++failures;
    }
    std::vector<float> values(1000, static_cast<float>(2 * comm.rank() + 1));
    auto request = mpi_layout::host_only_start_mean(comm, values);
    mpi_layout::nvcc_wait(request);
    const auto expected = static_cast<float>(comm.size());
    for (float v : values)
      if (v != expected) {
        std::printf("rank %d: mean %g, expected %g\n", comm.rank(), static_cast<double>(v),
                    static_cast<double>(expected));
        ++failures;
        break;
      }
    if (comm.rank() == 0 && failures == 0) std::printf("one layout; the request crossed translation units\n");
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
