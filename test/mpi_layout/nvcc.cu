// SPDX-License-Identifier: Apache-2.0
// Compiled by nvcc: comm::mpi with its device operations.
#include "layout.hpp"

static_assert(DILOCO_MPI_DEVICE_BUFFERS, "nvcc turns the device operations on");

namespace mpi_layout {

layout nvcc() { return layout_here(); }

void nvcc_wait(diloco::comm::mpi::request& request) { request.wait(); }

}  // namespace mpi_layout
