// SPDX-License-Identifier: Apache-2.0
// Sharded groups (sharded.hpp) on comm::threads: a 2 x 2 mesh whose ranks
// each hold a shard of whole tensors (position 0: tensor 0, position 1:
// tensors 1 and 2 of mesh_problem's model), trained FSDP-style: each step
// the group gathers its shards into the whole model over intra, and every
// gradient element depends on the whole model (a pull towards its group's
// target plus 0.05 x the mean of all weights). The reference is flat
// DiLoCo with 2 workers over the whole model and the same gradients: the
// shards' theta_global and replicas must be its bits (element-wise
// optimizers, block codecs whose blocks lie inside tensors), for every
// schedule but streaming (whose fragment plan follows the tensor list).
// Then: a group whose ranks disagree on H is the same config_error on
// every rank; checkpoints per shard resume bitwise from the newest round
// every rank holds, each with a manifest naming the mesh and the cut; a
// position whose file is damaged makes every rank raise with its state
// unchanged; no common round is a state_error; restoring onto another
// group size is a state_error on every rank naming both meshes.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <diloco/diloco.hpp>
#include <diloco/sharded.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "same_bits.hpp"
#include "sharded_problem.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
namespace fs = std::filesystem;

using namespace sharded_problem;

namespace {

template <class C, class Sync>
using threads_sharded = sharded_sgd<C, Sync, dc::comm::threads>;

template <class C, class Sync>
tensors_of run_sharded() {
  tensors_of out;
  out.replica.resize(R * G);
  out.global.resize(R * G);
  dc::comm::threads::world world(R * G);
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
    auto mine = initial_shard(m.position());
    threads_sharded<C, Sync> a(mine, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
    CHECK(a.shard_algorithm().world_size() == R);
    train_steps(a, m, mine, 0, steps);
    a.finish();
    const auto w = static_cast<std::size_t>(comm.rank());
    out.replica[w] = mine;
    out.global[w] = global_tensors(a.shard_algorithm(), mine);
  });
  return out;
}

template <class C, class Sync>
void check_sharded_equals_flat() {
  INFO(std::string(Sync::name));
  const tensors_of flat = run_flat_coupled<C, Sync>();
  const tensors_of mesh = run_sharded<C, Sync>();
  // Training happened, and the workers' replicas differ (except where
  // finish() makes every replica theta_global).
  CHECK_FALSE(same_bits(flat.global[0][0], initial_params()[0]));
  if constexpr (!std::is_same_v<Sync, dc::sync::delayed>) CHECK_FALSE(same_bits(flat.replica[0][0], flat.replica[1][0]));
  for (int w = 0; w < R * G; ++w) {
    const auto r = static_cast<std::size_t>(w / G), g = static_cast<std::size_t>(w % G);
    const auto& ks = shard_tensors[g];
    for (std::size_t j = 0; j < ks.size(); ++j) {
      INFO("world rank ", w, ", tensor ", ks[j]);
      CHECK(same_bits(mesh.global[static_cast<std::size_t>(w)][j], flat.global[r][ks[j]]));
      CHECK(same_bits(mesh.replica[static_cast<std::size_t>(w)][j], flat.replica[r][ks[j]]));
    }
  }
}

// Every rank's exception message, by world rank ("" when none was thrown).
struct raised {
  std::mutex lock;
  std::vector<std::string> what = std::vector<std::string>(R * G);
  std::vector<std::string> type = std::vector<std::string>(R * G);
  template <class F>
  void on(int w, F&& f) {
    try {
      f();
    } catch (const dc::format_error& e) {
      note(w, "format_error", e.what());
    } catch (const dc::config_error& e) {
      note(w, "config_error", e.what());
    } catch (const dc::state_error& e) {
      note(w, "state_error", e.what());
    }
  }
  void note(int w, const char* t, const char* m) {
    std::lock_guard<std::mutex> g(lock);
    type[static_cast<std::size_t>(w)] = t;
    what[static_cast<std::size_t>(w)] = m;
  }
};

}  // namespace

TEST_CASE("sharded 2 x 2 (FSDP-style shards of whole tensors) equals flat DiLoCo with 2 workers over the whole model") {
  check_sharded_equals_flat<cp::none, dc::sync::blocking>();
  check_sharded_equals_flat<int4_ef, dc::sync::blocking>();
  check_sharded_equals_flat<int4_ef, dc::sync::one_step_delay>();
  check_sharded_equals_flat<int4_ef, dc::sync::eager>();
  check_sharded_equals_flat<cp::none, dc::sync::delayed>();
  check_sharded_equals_flat<cp::error_feedback<cp::chunk_topk<128, 8, dc::int4>>, dc::sync::blocking>();
}

TEST_CASE("sharded: ranks of one group that disagree on H raise the same config_error on every rank of the world") {
  raised r;
  dc::comm::threads::world world(R * G);
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
    auto mine = initial_shard(m.position());
    // Group 0's position 1 runs H = 4; everyone else H = 3.
    const std::size_t h = m.group() == 0 && m.position() == 1 ? 4 : H;
    r.on(comm.rank(), [&] { threads_sharded<cp::none, dc::sync::blocking> a(mine, m, {.inner_steps = h}); });
  });
  for (int w = 0; w < R * G; ++w) {
    INFO("world rank ", w, ": ", r.what[static_cast<std::size_t>(w)]);
    CHECK(r.type[static_cast<std::size_t>(w)] == "config_error");
    CHECK(r.what[static_cast<std::size_t>(w)] == r.what[0]);
  }
  CHECK(r.what[0].find("group 0") != std::string::npos);
  CHECK(r.what[0].find("'options.inner_steps' is 3 on rank 0 but 4 on rank 1") != std::string::npos);
}

TEST_CASE("sharded: inner clipping with the library's inner optimizer is a config_error") {
  dc::comm::threads::world world(R * G);
  std::atomic<int> refused{0};
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
    auto mine = initial_shard(m.position());
    try {
      dc::sharded<dc::inner::adamw, dc::outer::nesterov, cp::none, dc::comm::threads> a(
          mine, m, {.inner_steps = H, .inner = {.max_grad_norm = 1.0f}});
    } catch (const dc::config_error& e) {
      if (std::string(e.what()).find("max_grad_norm = 1") != std::string::npos) ++refused;
    }
  });
  CHECK(refused == R * G);
}

TEST_CASE("sharded: checkpoints per shard resume bitwise from the newest round every rank saved") {
  const fs::path dir = fs::temp_directory_path() / ("diloco_test_sharded_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  using S = threads_sharded<int4_ef, dc::sync::one_step_delay>;
  // Run A: 12 steps, saving at steps 6 and 9: under one-step delay the
  // rounds applied by then are 1 and 2 (a phase's mean lands at the next
  // phase's end).
  tensors_of a_out;
  a_out.replica.resize(R * G);
  a_out.global.resize(R * G);
  {
    dc::comm::threads::world world(R * G);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      auto mine = initial_shard(m.position());
      S a(mine, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
      train_steps(a, m, mine, 0, 6);
      const std::string path = a.save_round(dir.string());
      CHECK(path == (dir / ("position-" + std::to_string(m.position())) / ("rank-" + std::to_string(m.group())) /
                     "round-1.ckpt")
                        .string());
      // The manifest beside it, by hand: position 0 holds tensor 0 (700
      // elements), position 1 tensors 1 and 2 (77 + 190).
      std::ifstream in(dir / ("position-" + std::to_string(m.position())) / ("rank-" + std::to_string(m.group())) /
                           "round-1.mesh");
      const std::string manifest{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      CHECK(manifest == "diloco mesh manifest 1\nkind sharded\ngroups 2\ngroup_size 2\ngroup " +
                            std::to_string(m.group()) + "\nposition " + std::to_string(m.position()) +
                            "\nmodel_elements 967\ngroup_cut 700 267\n" +
                            (m.position() == 0 ? "shard_elements 700\nshard_tensors 700\n"
                                               : "shard_elements 267\nshard_tensors 77 190\n"));
      train_steps(a, m, mine, 6, 9);
      a.save_round(dir.string());
      train_steps(a, m, mine, 9, 12);
      a.finish();
      const auto w = static_cast<std::size_t>(comm.rank());
      a_out.replica[w] = mine;
      a_out.global[w] = global_tensors(a.shard_algorithm(), mine);
    });
  }
  // Position 1 of group 1 lost round 2: every rank resumes from round 1.
  CHECK(fs::remove(dir / "position-1" / "rank-1" / "round-2.ckpt"));
  std::atomic<int> resumed_at_1{0};
  {
    dc::comm::threads::world world(R * G);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      auto mine = initial_shard(m.position());
      S b(mine, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
      if (b.load_latest_common(dir.string()) == 1) ++resumed_at_1;
      train_steps(b, m, mine, 6, 12);
      b.finish();
      const auto w = static_cast<std::size_t>(comm.rank());
      INFO("world rank ", w);
      for (std::size_t j = 0; j < mine.size(); ++j) CHECK(same_bits(mine[j], a_out.replica[w][j]));
      const auto g = global_tensors(b.shard_algorithm(), mine);
      for (std::size_t j = 0; j < g.size(); ++j) CHECK(same_bits(g[j], a_out.global[w][j]));
    });
  }
  CHECK(resumed_at_1 == R * G);

  // A damaged file at position 1 of group 0: every rank raises, and every
  // rank's state is what it was (after 2 steps of its own: before the
  // first phase end, so nothing is in flight, which load would refuse).
  {
    const fs::path victim = dir / "position-1" / "rank-0" / "round-1.ckpt";
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    f.put('\x5a');
  }
  raised r;
  {
    dc::comm::threads::world world(R * G);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      auto mine = initial_shard(m.position());
      S c(mine, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
      train_steps(c, m, mine, 0, 2);
      const auto replica_before = mine;
      const auto global_before = global_tensors(c.shard_algorithm(), mine);
      r.on(comm.rank(), [&] { c.load_latest_common(dir.string()); });
      INFO("world rank ", comm.rank());
      for (std::size_t j = 0; j < mine.size(); ++j) CHECK(same_bits(mine[j], replica_before[j]));
      const auto g = global_tensors(c.shard_algorithm(), mine);
      for (std::size_t j = 0; j < g.size(); ++j) CHECK(same_bits(g[j], global_before[j]));
    });
  }
  CHECK(r.type[1] == "format_error");  // world rank 1: group 0, position 1 (the damaged file)
  CHECK(r.type[3] == "state_error");   // its position in group 1 (algorithm::load's verdict)
  CHECK(r.type[0] == "state_error");   // position 0 of both groups (sharded's verdict)
  CHECK(r.type[2] == "state_error");
  CHECK(r.what[0].find("position 1") != std::string::npos);

  // No round common to every rank: the same state_error everywhere.
  fs::remove_all(dir / "position-0" / "rank-1");
  raised none;
  {
    dc::comm::threads::world world(R * G);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      auto mine = initial_shard(m.position());
      S d(mine, m, {.inner_steps = H});
      none.on(comm.rank(), [&] { d.load_latest_common(dir.string()); });
    });
  }
  for (int w = 0; w < R * G; ++w) {
    CHECK(none.type[static_cast<std::size_t>(w)] == "state_error");
    CHECK(none.what[static_cast<std::size_t>(w)] == none.what[0]);
  }
  CHECK(none.what[0].find("no round has a checkpoint on every rank") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("sharded: restoring onto another group size is the same state_error on every rank, naming both meshes") {
  const fs::path dir = fs::temp_directory_path() / ("diloco_test_sharded_regroup_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    dc::comm::threads::world world(R * G);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      auto mine = initial_shard(m.position());
      threads_sharded<int4_ef, dc::sync::blocking> a(mine, m, {.inner_steps = H});
      a.save_round(dir.string());
    });
  }
  // 2 groups x 1 rank, each rank holding the whole model: rank-0 and rank-1
  // under position-0 hold round 0, saved by a 2 x 2 mesh.
  raised r;
  {
    dc::comm::threads::world world(R);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = 1});
      auto whole = initial_params();
      threads_sharded<int4_ef, dc::sync::blocking> b(whole, m, {.inner_steps = H});
      const auto before = global_tensors(b.shard_algorithm(), whole);
      r.on(comm.rank(), [&] { b.load_latest_common(dir.string()); });
      const auto after = global_tensors(b.shard_algorithm(), whole);
      for (std::size_t j = 0; j < after.size(); ++j) CHECK(same_bits(after[j], before[j]));
    });
  }
  for (int w = 0; w < R; ++w) {
    CHECK(r.type[static_cast<std::size_t>(w)] == "state_error");
    CHECK(r.what[static_cast<std::size_t>(w)] == r.what[0]);
  }
  INFO(r.what[0]);
  CHECK(r.what[0].find("diloco::sharded::load_latest_common: the checkpoints under") != std::string::npos);
  CHECK(r.what[0].find("group 1: position 0: round 0 was saved by a mesh of 2 groups x 2 ranks (group 1, position "
                       "0): group_size: saved 2, here 1; group_cut: saved 700 267, here 967; shard_elements: saved "
                       "700, here 967") != std::string::npos);
  CHECK(r.what[0].find("this mesh: 2 groups x 1 ranks") != std::string::npos);
  fs::remove_all(dir);
}
