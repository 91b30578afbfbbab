// SPDX-License-Identifier: Apache-2.0
// Compiled by the host compiler without CUDA (no DILOCO_WITH_CUDA): comm::mpi
// without its device operations.
#include "layout.hpp"

static_assert(!DILOCO_MPI_DEVICE_BUFFERS, "this translation unit must be compiled without CUDA");

namespace mpi_layout {

layout host_only() { return layout_here(); }

diloco::comm::mpi::request host_only_start_mean(diloco::comm::mpi& comm, std::span<float> values) {
  return comm.iall_reduce(values, diloco::reduce_op::mean);
}

}  // namespace mpi_layout
