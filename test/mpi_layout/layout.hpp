// SPDX-License-Identifier: Apache-2.0
#pragma once

// The sizes and alignments of comm::mpi's classes as one translation unit
// sees them. Each translation unit of test_mpi_layout calls layout_here()
// (internal linkage: the linker cannot merge the copies) from a function of
// its own, and main compares them.
#include <diloco/comm/mpi.hpp>

#include <cstddef>
#include <cstdio>

namespace mpi_layout {

struct layout {
  std::size_t communicator_size, communicator_align;
  std::size_t request_size, request_align;
  std::size_t context_size, completion_size;
  bool operator==(const layout&) const = default;
  void print(const char* where) const {
    std::printf("%-34s comm::mpi %zu/%zu, request %zu/%zu, context %zu, completion %zu\n", where,
                communicator_size, communicator_align, request_size, request_align, context_size, completion_size);
  }
};

namespace {
layout layout_here() {
  namespace c = diloco::comm;
  return {sizeof(c::mpi), alignof(c::mpi), sizeof(c::mpi::request), alignof(c::mpi::request),
          sizeof(c::detail_mpi::context), sizeof(c::detail_mpi::completion)};
}
}  // namespace

// Defined by the translation unit compiled without CUDA.
layout host_only();
diloco::comm::mpi::request host_only_start_mean(diloco::comm::mpi& comm, std::span<float> values);
// Defined by the translation unit compiled by nvcc.
layout nvcc();
void nvcc_wait(diloco::comm::mpi::request& request);

}  // namespace mpi_layout
