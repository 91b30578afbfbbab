// SPDX-License-Identifier: Apache-2.0
// A 2 x 2 mesh over comm::mpi (mpirun -np 4; comm/mesh_mpi.hpp splits with
// MPI_Comm_split) with replicated groups and sharded outer state
// (replicated.hpp) gives exactly (memcmp) the replicas and theta_global of
// flat DiLoCo with 2 workers, which each process computes in-process on
// comm::threads (test/mesh_problem.hpp): sync::blocking and one_step_delay,
// compress::none and int4 + error feedback. A bad mesh is the same
// config_error on every rank. Checkpoints per shard resume bitwise, and a
// mesh of another G is refused with the same state_error on every rank.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <diloco/comm/mesh_mpi.hpp>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <filesystem>
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

TEST_CASE("mpi mesh 2 x 2, replicated: checkpoints per shard resume bitwise; a 1 x 4 mesh is refused on every rank") {
  if (world_size() != 4) return;  // registered with -np 4
  namespace fs = std::filesystem;
  using T = dc::replicated<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::mpi, dc::sync::one_step_delay>;
  const T::options opts{.inner_steps = H, .inner = {.lr = 0.1f, .momentum = 0.9f}};
  dc::comm::mpi world(MPI_COMM_WORLD);
  int token = static_cast<int>(::getpid());  // rank 0's: one folder for the 4 processes
  MPI_Bcast(&token, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const fs::path dir = fs::temp_directory_path() / ("diloco_test_mesh_mpi_" + std::to_string(token));
  dc::mesh<dc::comm::mpi> m(world, {.group_size = 2});
  // Run A: 14 steps, saved at step 6 (round 1 applied under one-step delay).
  std::vector<float> replica_end, global_end;
  {
    auto p = initial_params();
    T a(p, m, opts);
    train_range(a, m, p, 0, 6);
    a.save_round(dir.string());
    train_range(a, m, p, 6, steps);
    a.finish();
    replica_end = concat_all(p);
    global_end = whole_global(a, p);
  }
  // Run B: a fresh instance resumes at round 1 and trains the same steps.
  {
    auto p = initial_params();
    T b(p, m, opts);
    CHECK(b.load_latest_common(dir.string()) == 1);
    train_range(b, m, p, 6, steps);
    b.finish();
    INFO("rank ", world.rank());
    CHECK_FALSE(same_bits(replica_end, concat_all(initial_params())));
    CHECK(same_bits(concat_all(p), replica_end));
    CHECK(same_bits(whole_global(b, p), global_end));
  }
  // One group of 4: positions 2 and 3 have no files, 0 and 1 files of G = 2.
  {
    dc::mesh<dc::comm::mpi> one(world, {.group_size = 4});
    auto p = initial_params();
    T c(p, one, opts);
    std::string what;
    try {
      c.load_latest_common(dir.string());
    } catch (const dc::state_error& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("position 0: round 1 was saved by a mesh of 2 groups x 2 ranks (group 0, position 0): "
                    "groups: saved 2, here 1; group_size: saved 2, here 4") != std::string::npos);
    CHECK(what.find("this mesh: 1 groups x 4 ranks") != std::string::npos);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}
