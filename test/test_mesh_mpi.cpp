// SPDX-License-Identifier: Apache-2.0
// A 2 x 2 mesh over comm::mpi (mpirun -np 4; comm/mesh_mpi.hpp splits with
// MPI_Comm_split) with replicated groups and sharded outer state
// (replicated.hpp) gives exactly (memcmp) the replicas and theta_global of
// flat DiLoCo with 2 workers, which each process computes in-process on
// comm::threads (test/mesh_problem.hpp): sync::blocking and one_step_delay,
// compress::none and int4 + error feedback. A bad mesh is the same
// config_error on every rank.
#include <doctest/doctest.h>
#include <mpi.h>

#include <diloco/comm/mesh_mpi.hpp>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <string>
#include <vector>

#include "mesh_problem.hpp"
#include "same_bits.hpp"
#include "test_probes.hpp"

using namespace mesh_problem;

namespace {

template <class C, class Sync>
void check_mpi_mesh_equals_flat() {
  if (world_size() != 4) return;  // registered with -np 4
  constexpr int R = 2, G = 2;
  const flat_result flat = run_flat<C, Sync>(R);
  dc::comm::mpi world(MPI_COMM_WORLD);
  dc::mesh<dc::comm::mpi> m(world, {.group_size = G});
  CHECK(m.group() == world.rank() / G);
  CHECK(m.intra().size() == G);
  CHECK(m.inter().size() == R);
  train_on_mesh<C, Sync>(m, [&](auto& a, const std::vector<float>& replica, const std::vector<float>& global) {
    const auto r = static_cast<std::size_t>(m.group());
    INFO("rank ", world.rank(), ", ", Sync::name);
    CHECK_FALSE(same_bits(flat.global[r], concat_all(initial_params())));
    CHECK(same_bits(replica, flat.replica[r]));
    CHECK(same_bits(global, flat.global[r]));
    CHECK(a.shard_elements(m.position()) < a.parameter_count());
  });
}

}  // namespace

TEST_CASE("mpi mesh 2 x 2, replicated: blocking, compress::none, equals flat DiLoCo on threads") {
  check_mpi_mesh_equals_flat<cp::none, dc::sync::blocking>();
}

TEST_CASE("mpi mesh 2 x 2, replicated: blocking, int4 + error feedback, equals flat DiLoCo on threads") {
  check_mpi_mesh_equals_flat<int4_ef, dc::sync::blocking>();
}

TEST_CASE("mpi mesh 2 x 2, replicated: one_step_delay, int4 + error feedback, equals flat DiLoCo on threads") {
  check_mpi_mesh_equals_flat<int4_ef, dc::sync::one_step_delay>();
}

TEST_CASE("mpi mesh: a group size not dividing the world is a config_error on every rank") {
  dc::comm::mpi world(MPI_COMM_WORLD);
  const int bad = world.size() + 1;
  std::string what;
  try {
    dc::mesh<dc::comm::mpi> m(world, {.group_size = bad});
  } catch (const dc::config_error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("which is not a multiple of the group size G = " + std::to_string(bad)) != std::string::npos);
}
