// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::mesh over comm::mpi (the optional MPI component, target
// diloco::mpi): the intra- and inter-group communicators are
// MPI_Comm_split's of the world's communicator, each wrapped in a comm::mpi
// with the world's options (timeout, argument checks, device path; no
// expected size). Include it with comm/mesh.hpp's mesh<comm::mpi>:
//
//   diloco::comm::mpi world(MPI_COMM_WORLD);
//   diloco::mesh<diloco::comm::mpi> m(world, {.group_size = 8});
//   // m.intra(): the 8 ranks of this node; m.inter(): one rank per node.

#include <memory>

#include "diloco/comm/mesh.hpp"
#include "diloco/comm/mpi.hpp"

namespace diloco::comm {

/// comm::mpi splits with MPI_Comm_split over its (duplicated) communicator;
/// the result is duplicated again by comm::mpi's constructor and the split
/// one freed, so the new communicator owns its MPI communicator alone.
inline std::unique_ptr<mpi> split_communicator(mpi& parent, int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  detail_mpi::check(MPI_Comm_split(parent.native_handle(), color, key, &part), "MPI_Comm_split", "mesh split",
                    parent.rank());
  mpi::options opts = parent.settings();
  opts.expected_size = 0;
  std::unique_ptr<mpi> out;
  try {
    out = std::make_unique<mpi>(part, opts);
  } catch (...) {
    MPI_Comm_free(&part);
    throw;
  }
  MPI_Comm_free(&part);
  return out;
}

}  // namespace diloco::comm
