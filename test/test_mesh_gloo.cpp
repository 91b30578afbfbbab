// SPDX-License-Identifier: Apache-2.0
// A 2 x 2 mesh over comm::gloo: four real processes over loopback TCP that
// meet in one file store; the mesh's parts meet there again under their own
// prefixes (comm/mesh_gloo.hpp). With replicated groups and sharded outer
// state (replicated.hpp) each process's replica and theta_global must equal
// (memcmp) those of flat DiLoCo with 2 workers, computed here on
// comm::threads (test/mesh_problem.hpp); with sharded groups (sharded.hpp,
// FSDP-style shards of whole tensors, test/sharded_problem.hpp) each
// process's shard must equal flat DiLoCo's over the whole model. The
// processes are copies of this binary running the test case "mesh gloo:
// rank program" (which does nothing when started by CTest).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <diloco/comm/mesh_gloo.hpp>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <diloco/sharded.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "mesh_problem.hpp"
#include "process_harness.hpp"
#include "same_bits.hpp"
#include "sharded_problem.hpp"

using namespace mesh_problem;

namespace {

constexpr const char* role_env = "DILOCO_TEST_MESH_GLOO";  // "<sync>" in a rank process

template <class C, class Sync>
void rank_program(const std::string& out_path) {
  auto world = dc::comm::gloo::from_env();
  dc::mesh<dc::comm::gloo> m(world, {.group_size = 2});
  std::vector<float> rep, glob;
  train_on_mesh<C, Sync>(m, [&](auto&, std::vector<float> replica, std::vector<float> global) {
    rep = std::move(replica);
    glob = std::move(global);
  });
  std::ofstream out(out_path, std::ios::binary);
  const int group = m.group();
  out.write(reinterpret_cast<const char*>(&group), sizeof group);
  out.write(reinterpret_cast<const char*>(rep.data()), static_cast<std::streamsize>(rep.size() * sizeof(float)));
  out.write(reinterpret_cast<const char*>(glob.data()), static_cast<std::streamsize>(glob.size() * sizeof(float)));
}

// Sharded groups: this process's shard trained FSDP-style; writes its group
// and position, then each of its tensors' replica and theta_global.
void sharded_rank_program(const std::string& out_path) {
  namespace sp = sharded_problem;
  auto world = dc::comm::gloo::from_env();
  dc::mesh<dc::comm::gloo> m(world, {.group_size = 2});
  auto mine = sp::initial_shard(m.position());
  sp::sharded_sgd<int4_ef, dc::sync::one_step_delay, dc::comm::gloo> a(mine, m,
                                                                       {.inner_steps = H, .inner = {.lr = 0.1f}});
  sp::train_steps(a, m, mine, 0, steps);
  a.finish();
  const auto global = sp::global_tensors(a.shard_algorithm(), mine);
  std::ofstream out(out_path, std::ios::binary);
  const int where[2] = {m.group(), m.position()};
  out.write(reinterpret_cast<const char*>(where), sizeof where);
  for (std::size_t j = 0; j < mine.size(); ++j) {
    out.write(reinterpret_cast<const char*>(mine[j].data()), static_cast<std::streamsize>(mine[j].size() * sizeof(float)));
    out.write(reinterpret_cast<const char*>(global[j].data()), static_cast<std::streamsize>(global[j].size() * sizeof(float)));
  }
}

// Starts the four rank processes with `role` and waits for them to exit 0.
void run_ranks(const char* role, harness::temp_dir& dir) {
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r)
    pids.push_back(harness::spawn({harness::self_exe(), "-tc=mesh gloo: rank program", "--minimal"},
                                  {std::string(role_env) + "=" + role, "DILOCO_RANK=" + std::to_string(r),
                                   "DILOCO_WORLD_SIZE=4", "DILOCO_STORE=file://" + dir.file("store"),
                                   "DILOCO_TIMEOUT_MS=60000", "DILOCO_TEST_MESH_OUT=" + dir.file("rank" + std::to_string(r))}));
  for (int r = 0; r < 4; ++r) {
    int st = 0;
    waitpid(pids[static_cast<std::size_t>(r)], &st, 0);
    INFO("rank ", r);
    REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  }
}

template <class C, class Sync>
void check_gloo_mesh(const char* sync_name) {
  const flat_result flat = run_flat<C, Sync>(2);
  harness::temp_dir dir;
  run_ranks(sync_name, dir);
  const std::size_t n = concat_all(initial_params()).size();
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(dir.file("rank" + std::to_string(r)), std::ios::binary);
    int group = -1;
    std::vector<float> rep(n), glob(n);
    in.read(reinterpret_cast<char*>(&group), sizeof group);
    in.read(reinterpret_cast<char*>(rep.data()), static_cast<std::streamsize>(n * sizeof(float)));
    in.read(reinterpret_cast<char*>(glob.data()), static_cast<std::streamsize>(n * sizeof(float)));
    INFO("rank ", r, ", ", sync_name);
    REQUIRE(in.good());
    CHECK(group == r / 2);
    CHECK(same_bits(rep, flat.replica[static_cast<std::size_t>(r / 2)]));
    CHECK(same_bits(glob, flat.global[static_cast<std::size_t>(r / 2)]));
  }
}

}  // namespace

TEST_CASE("mesh gloo: rank program") {
  const char* role = std::getenv(role_env);
  if (role == nullptr) return;  // only in the processes the cases below start
  const std::string out = std::getenv("DILOCO_TEST_MESH_OUT");
  if (std::string(role) == "blocking")
    rank_program<int4_ef, dc::sync::blocking>(out);
  else if (std::string(role) == "sharded")
    sharded_rank_program(out);
  else
    rank_program<cp::none, dc::sync::one_step_delay>(out);
}

TEST_CASE("mesh gloo 2 x 2 (4 processes), replicated: blocking, int4 + error feedback, equals flat DiLoCo") {
  if (std::getenv(role_env)) return;
  check_gloo_mesh<int4_ef, dc::sync::blocking>("blocking");
}

TEST_CASE("mesh gloo 2 x 2 (4 processes), replicated: one_step_delay, compress::none, equals flat DiLoCo") {
  if (std::getenv(role_env)) return;
  check_gloo_mesh<cp::none, dc::sync::one_step_delay>("one_step_delay");
}

TEST_CASE("mesh gloo 2 x 2 (4 processes), sharded: one_step_delay, int4 + error feedback, equals flat DiLoCo") {
  if (std::getenv(role_env)) return;
  namespace sp = sharded_problem;
  const sp::tensors_of flat = sp::run_flat_coupled<int4_ef, dc::sync::one_step_delay>();
  harness::temp_dir dir;
  run_ranks("sharded", dir);
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(dir.file("rank" + std::to_string(r)), std::ios::binary);
    int where[2] = {-1, -1};
    in.read(reinterpret_cast<char*>(where), sizeof where);
    INFO("rank ", r);
    REQUIRE(in.good());
    CHECK(where[0] == r / 2);
    CHECK(where[1] == r % 2);
    const auto group = static_cast<std::size_t>(r / 2);
    for (std::size_t k : sp::shard_tensors[static_cast<std::size_t>(r % 2)]) {
      std::vector<float> rep(sizes[k]), glob(sizes[k]);
      in.read(reinterpret_cast<char*>(rep.data()), static_cast<std::streamsize>(rep.size() * sizeof(float)));
      in.read(reinterpret_cast<char*>(glob.data()), static_cast<std::streamsize>(glob.size() * sizeof(float)));
      INFO("tensor ", k);
      REQUIRE(in.good());
      CHECK(same_bits(rep, flat.replica[group][k]));
      CHECK(same_bits(glob, flat.global[group][k]));
    }
  }
  CHECK_FALSE(same_bits(flat.global[0][0], initial_params()[0]));
}
