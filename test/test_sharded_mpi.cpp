// SPDX-License-Identifier: Apache-2.0
// Sharded groups (sharded.hpp) over comm::mpi (mpirun -np 4; a 2 x 2 mesh
// split with MPI_Comm_split): each process holds whole tensors of the
// model (test/sharded_problem.hpp), gathers the group's shards over intra
// every step for gradients that need the whole model, and must end with
// exactly (memcmp) the theta_global and replica of flat DiLoCo with 2
// workers over the whole model, which each process computes in-process on
// comm::threads: blocking with compress::none, one_step_delay and eager
// with int4 + error feedback. A group whose ranks disagree on H is the
// same config_error on every process.
#include <doctest/doctest.h>
#include <mpi.h>

#include <diloco/comm/mesh_mpi.hpp>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <diloco/sharded.hpp>
#include <string>
#include <vector>

#include "same_bits.hpp"
#include "sharded_problem.hpp"
#include "test_probes.hpp"

using namespace sharded_problem;

namespace {

template <class C, class Sync>
void check_sharded_mpi_equals_flat() {
  if (world_size() != R * G) return;  // registered with -np 4
  const tensors_of flat = run_flat_coupled<C, Sync>();
  dc::comm::mpi world(MPI_COMM_WORLD);
  dc::mesh<dc::comm::mpi> m(world, {.group_size = G});
  auto mine = initial_shard(m.position());
  sharded_sgd<C, Sync, dc::comm::mpi> a(mine, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
  CHECK(a.shard_algorithm().world_size() == R);
  train_steps(a, m, mine, 0, steps);
  a.finish();
  const auto r = static_cast<std::size_t>(m.group());
  const auto& ks = shard_tensors[static_cast<std::size_t>(m.position())];
  const auto global = global_tensors(a.shard_algorithm(), mine);
  CHECK_FALSE(same_bits(flat.global[r][0], initial_params()[0]));
  for (std::size_t j = 0; j < ks.size(); ++j) {
    INFO("rank ", world.rank(), ", ", Sync::name, ", tensor ", ks[j]);
    CHECK(same_bits(global[j], flat.global[r][ks[j]]));
    CHECK(same_bits(mine[j], flat.replica[r][ks[j]]));
  }
}

}  // namespace

TEST_CASE("mpi mesh 2 x 2, sharded: blocking, compress::none, equals flat DiLoCo on threads") {
  check_sharded_mpi_equals_flat<cp::none, dc::sync::blocking>();
}

TEST_CASE("mpi mesh 2 x 2, sharded: one_step_delay and eager, int4 + error feedback, equal flat DiLoCo on threads") {
  check_sharded_mpi_equals_flat<int4_ef, dc::sync::one_step_delay>();
  check_sharded_mpi_equals_flat<int4_ef, dc::sync::eager>();
}

TEST_CASE("mpi mesh 2 x 2, sharded: a group whose ranks disagree on H is the same config_error on every process") {
  if (world_size() != R * G) return;
  dc::comm::mpi world(MPI_COMM_WORLD);
  dc::mesh<dc::comm::mpi> m(world, {.group_size = G});
  auto mine = initial_shard(m.position());
  const std::size_t h = m.group() == 1 && m.position() == 0 ? 5 : H;  // group 1's position 0
  std::string what;
  try {
    sharded_sgd<cp::none, dc::sync::blocking, dc::comm::mpi> a(mine, m, {.inner_steps = h});
  } catch (const dc::config_error& e) {
    what = e.what();
  }
  INFO("rank ", world.rank(), ": ", what);
  CHECK(what.find("group 1") != std::string::npos);
  CHECK(what.find("'options.inner_steps' is 5 on rank 0 but 3 on rank 1") != std::string::npos);
}
