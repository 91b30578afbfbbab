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

#include <chrono>
#include <concepts>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <diloco/comm/mesh_gloo.hpp>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <diloco/sharded.hpp>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mesh_problem.hpp"
#include "process_harness.hpp"
#include "same_bits.hpp"
#include "sharded_problem.hpp"

using namespace mesh_problem;

namespace {

constexpr const char* role_env = "DILOCO_TEST_MESH_GLOO";  // "<sync>" in a rank process

// The rank programs' outputs: ints and float vectors, raw.
template <class T>
void put(std::ofstream& out, const std::vector<T>& v) {
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}
template <class T>
std::vector<T> get(std::ifstream& in, std::size_t n) {
  std::vector<T> v(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  return v;
}

// Runs `call`, which must raise config_error with `want` in its message;
// anything else ends the rank program with an exception (a failed run).
template <class Call>
void refused(Call&& call, const char* want) {
  try {
    call();
  } catch (const dc::config_error& e) {
    if (std::string(e.what()).find(want) != std::string::npos) return;
    throw std::runtime_error(std::string("refused with another message: ") + e.what());
  }
  throw std::runtime_error(std::string("not refused: ") + want);
}

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
  put(out, std::vector<int>{m.group()});
  put(out, rep);
  put(out, glob);
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
  put(out, std::vector<int>{m.group(), m.position()});
  for (std::size_t j = 0; j < mine.size(); ++j) {
    put(out, mine[j]);
    put(out, global[j]);
  }
}

// An elastic 3 x 2 mesh (six processes): group 1's rank at position 1
// kills itself (SIGKILL) at the start of step kill_step, inside round 3's
// inner phase (H = 3: rounds end at steps 2, 5, 8, 11). Its group's other
// rank finds out at its next collective over intra (the gradients'
// all_reduce of that step), writes "left" and the error, and ends; the
// other two groups go on. Each of those writes its group, the final inter
// size, its replica and theta_global.
constexpr int kill_step = 7;

template <class Inner>
auto options() {
  using algo = dc::algorithm<Inner, dc::outer::nesterov, int4_ef, dc::comm::threads, dc::sync::blocking>;
  typename algo::options o{.inner_steps = H};
  if constexpr (!std::same_as<Inner, dc::inner::external>) o.inner.lr = 0.1f;
  return o;
}

// Inner: inner::sgd (lr 0.1), or inner::external with the user's SGD of the
// same lr on the full replica (then the replica's gather follows the step
// count, replicated.hpp's rule for elastic meshes).
template <class Inner, class A>
void take_step(A& a, std::vector<std::vector<float>>& p, std::vector<std::vector<float>>& g) {
  if constexpr (std::same_as<Inner, dc::inner::external>) {
    for (std::size_t k = 0; k < p.size(); ++k)
      for (std::size_t i = 0; i < p[k].size(); ++i) p[k][i] -= 0.1f * g[k][i];
    a.step();
  } else {
    a.step(g);
  }
}

template <class Inner>
void elastic_rank_program(const std::string& out_path) {
  auto world = dc::comm::gloo::from_env();
  dc::mesh<dc::comm::gloo> m(world, {.group_size = 2});
  if (!m.elastic()) throw std::runtime_error("the mesh of an elastic world is not elastic");
  // Refused, before any collective: a split of an elastic world that is not
  // a mesh's part, and checkpoints of an elastic mesh.
  refused([&] { (void)dc::comm::split_communicator(world, 0, 0); }, "only a mesh's parts are split off an elastic world");
  auto p = initial_params();
  dc::replicated<Inner, dc::outer::nesterov, int4_ef, dc::comm::gloo, dc::sync::blocking> a(p, m, options<Inner>());
  refused([&] { (void)a.save_round(out_path + ".ckpt"); }, "save_round: checkpoints of an elastic mesh are not supported");
  refused([&] { (void)a.load_latest_common(out_path + ".ckpt"); },
          "load_latest_common: checkpoints of an elastic mesh are not supported");
  std::vector<std::vector<float>> g(p.size());
  std::ofstream out(out_path, std::ios::binary);
  for (int s = 0; s < steps; ++s) {
    if (m.group() == 1 && m.position() == 1 && s == kill_step) std::raise(SIGKILL);
    gradients_into(g, m.group(), s, p);
    try {
      dc::all_reduce_gradients(m, g);
      take_step<Inner>(a, p, g);
    } catch (const dc::comm_error& e) {
      out << "left at step " << s << ": " << e.what();
      return;
    }
  }
  a.finish();
  put(out, std::vector<int>{m.group(), m.inter().size()});
  put(out, concat_all(p));
  put(out, whole_global(a, p));
}

// The same kill on sharded groups (FSDP-style, tensor 0 at position 0,
// tensors 1 and 2 at position 1) whose gradients need no collective inside
// the group (each element's own pull, as flat DiLoCo's): nothing but
// sharded's check before a round runs over intra, so group 1's position-0
// rank learns of the loss there, at step 8 (the step that ends round 3),
// and leaves before the round. Each rank writes its group, the final inter
// size, then each of its tensors' replica and theta_global.
void elastic_sharded_program(const std::string& out_path) {
  namespace sp = sharded_problem;
  auto world = dc::comm::gloo::from_env();
  dc::mesh<dc::comm::gloo> m(world, {.group_size = 2});
  const auto& ks = sp::shard_tensors[static_cast<std::size_t>(m.position())];
  auto mine = sp::initial_shard(m.position());
  sp::sharded_sgd<int4_ef, dc::sync::blocking, dc::comm::gloo> a(mine, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
  refused([&] { (void)a.save_round(out_path + ".ckpt"); }, "save_round: checkpoints of an elastic mesh are not supported");
  std::vector<std::vector<float>> g(mine.size());
  std::ofstream out(out_path, std::ios::binary);
  for (int s = 0; s < steps; ++s) {
    if (m.group() == 1 && m.position() == 1 && s == kill_step) std::raise(SIGKILL);
    for (std::size_t j = 0; j < mine.size(); ++j) {
      g[j].resize(mine[j].size());
      for (std::size_t i = 0; i < mine[j].size(); ++i) g[j][i] = grad_of(m.group(), s, ks[j], i, mine[j][i]);
    }
    try {
      a.step(g);
    } catch (const dc::comm_error& e) {
      out << "left at step " << s << ": " << e.what();
      return;
    }
  }
  a.finish();
  const auto global = sp::global_tensors(a.shard_algorithm(), mine);
  put(out, std::vector<int>{m.group(), m.inter().size()});
  for (std::size_t j = 0; j < mine.size(); ++j) {
    put(out, mine[j]);
    put(out, global[j]);
  }
}

// The flat reference of the elastic case: DiLoCo with 3 workers on an
// elastic comm::threads world, worker 1 leaving right after round 2 (the
// last round it took part in), workers 0 and 2 going on; each worker's
// gradients are those of its group (a stable id, not its rank, which
// renumbers). Returns the replica and theta_global of workers 0 and 2.
template <class Inner>
flat_result run_flat_leaving() {
  using algo = dc::algorithm<Inner, dc::outer::nesterov, int4_ef, dc::comm::threads, dc::sync::blocking>;
  flat_result out;
  out.replica.resize(3);
  out.global.resize(3);
  dc::comm::threads::world world(3, std::chrono::seconds(60), dc::comm::threads::membership::elastic);
  world.run([&](dc::comm::threads& comm) {
    const int id = comm.rank();
    auto p = initial_params();
    algo a(p, comm, options<Inner>());
    std::vector<std::vector<float>> g(p.size());
    for (int s = 0; s < steps; ++s) {
      gradients_into(g, id, s, p);
      take_step<Inner>(a, p, g);
      if (id == 1 && s == 5) {
        a.leave();
        return;
      }
    }
    a.finish();
    std::vector<std::vector<float>> th(p.size());
    for (std::size_t k = 0; k < p.size(); ++k) th[k].resize(p[k].size());
    a.copy_global_to(th);
    out.replica[static_cast<std::size_t>(id)] = concat_all(p);
    out.global[static_cast<std::size_t>(id)] = concat_all(th);
  });
  return out;
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
    const int group = get<int>(in, 1)[0];
    const std::vector<float> rep = get<float>(in, n), glob = get<float>(in, n);
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
  if (std::string(role) == "elastic")
    elastic_rank_program<dc::inner::sgd>(out);
  else if (std::string(role) == "elastic_sharded")
    elastic_sharded_program(out);
  else if (std::string(role) == "elastic_external")
    elastic_rank_program<dc::inner::external>(out);
  else if (std::string(role) == "blocking")
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
    const std::vector<int> where = get<int>(in, 2);
    INFO("rank ", r);
    REQUIRE(in.good());
    CHECK(where[0] == r / 2);
    CHECK(where[1] == r % 2);
    const auto group = static_cast<std::size_t>(r / 2);
    for (std::size_t k : sp::shard_tensors[static_cast<std::size_t>(r % 2)]) {
      const std::vector<float> rep = get<float>(in, sizes[k]), glob = get<float>(in, sizes[k]);
      INFO("tensor ", k);
      REQUIRE(in.good());
      CHECK(same_bits(rep, flat.replica[group][k]));
      CHECK(same_bits(glob, flat.global[group][k]));
    }
  }
  CHECK_FALSE(same_bits(flat.global[0][0], initial_params()[0]));
}

// Starts the six rank processes of an elastic 3 x 2 mesh with `role` and
// reaps them (within 90 s, else kills them and fails); their wait statuses.
std::vector<int> run_elastic_ranks(const std::string& role, harness::temp_dir& dir) {
  std::vector<pid_t> pids;
  for (int r = 0; r < 6; ++r)
    pids.push_back(harness::spawn({harness::self_exe(), "-tc=mesh gloo: rank program", "--minimal"},
                                  {std::string(role_env) + "=" + role, "DILOCO_RANK=" + std::to_string(r),
                                   "DILOCO_WORLD_SIZE=6", "DILOCO_STORE=file://" + dir.file("store"),
                                   "DILOCO_ELASTIC=1", "DILOCO_TIMEOUT_MS=5000",
                                   "DILOCO_TEST_MESH_OUT=" + dir.file("rank" + std::to_string(r))}));
  // Bounded: every process is reaped within 90 s, or killed and failed.
  std::vector<int> status(6, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (int left = 6; left > 0 && std::chrono::steady_clock::now() < deadline;) {
    for (int r = 0; r < 6; ++r)
      if (status[static_cast<std::size_t>(r)] < 0 &&
          waitpid(pids[static_cast<std::size_t>(r)], &status[static_cast<std::size_t>(r)], WNOHANG) > 0)
        --left;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < 6; ++r)
    if (status[static_cast<std::size_t>(r)] < 0) {
      kill(pids[static_cast<std::size_t>(r)], SIGKILL);
      waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
      FAIL("rank ", r, " still ran after 90 s");
    }
  return status;
}

template <class Inner>
void check_elastic(const std::string& role) {
  const flat_result flat = run_flat_leaving<Inner>();
  harness::temp_dir dir;
  const std::vector<int> status = run_elastic_ranks(role, dir);
  // World rank 3 is group 1, position 1: killed; rank 2 (group 1, position 0) left.
  CHECK((WIFSIGNALED(status[3]) && WTERMSIG(status[3]) == SIGKILL));
  REQUIRE((WIFEXITED(status[2]) && WEXITSTATUS(status[2]) == 0));
  const std::string left = harness::read_file(dir.file("rank2"));
  INFO(left);
  CHECK(left.rfind("left at step 7: ", 0) == 0);
  CHECK(left.find("group 1 lost a rank") != std::string::npos);
  CHECK(left.find("leaves the run as a whole") != std::string::npos);
  const std::size_t n = concat_all(initial_params()).size();
  for (int r : {0, 1, 4, 5}) {
    INFO("rank ", r);
    REQUIRE((WIFEXITED(status[static_cast<std::size_t>(r)]) && WEXITSTATUS(status[static_cast<std::size_t>(r)]) == 0));
    std::ifstream in(dir.file("rank" + std::to_string(r)), std::ios::binary);
    const std::vector<int> head = get<int>(in, 2);
    const std::vector<float> rep = get<float>(in, n), glob = get<float>(in, n);
    REQUIRE(in.good());
    CHECK(head[0] == r / 2);
    CHECK(head[1] == 2);  // two groups at every position
    CHECK(same_bits(rep, flat.replica[static_cast<std::size_t>(r / 2)]));
    CHECK(same_bits(glob, flat.global[static_cast<std::size_t>(r / 2)]));
  }
  // The leaving group changed the outcome: the run without a departure differs.
  const flat_result all_three = run_flat<int4_ef, dc::sync::blocking>(3);
  CHECK_FALSE(same_bits(flat.global[0], all_three.global[0]));
}

TEST_CASE("mesh gloo 3 x 2 (6 processes), elastic: a group that loses a rank leaves as a whole, the others go on") {
  if (std::getenv(role_env)) return;
  check_elastic<dc::inner::sgd>("elastic");
}

TEST_CASE("mesh gloo 3 x 2 (6 processes), elastic, inner::external: the group leaves, the replicas gather by step count") {
  if (std::getenv(role_env)) return;
  check_elastic<dc::inner::external>("elastic_external");
}

TEST_CASE("mesh gloo 3 x 2 (6 processes), elastic, sharded: the group checks itself before a round and leaves whole") {
  if (std::getenv(role_env)) return;
  namespace sp = sharded_problem;
  const flat_result flat = run_flat_leaving<dc::inner::sgd>();
  harness::temp_dir dir;
  const std::vector<int> status = run_elastic_ranks("elastic_sharded", dir);
  CHECK((WIFSIGNALED(status[3]) && WTERMSIG(status[3]) == SIGKILL));
  REQUIRE((WIFEXITED(status[2]) && WEXITSTATUS(status[2]) == 0));
  const std::string left = harness::read_file(dir.file("rank2"));
  INFO(left);
  CHECK(left.rfind("left at step 8: ", 0) == 0);  // at the check before round 3, not earlier
  CHECK(left.find("diloco::sharded (the group's check before a round)") != std::string::npos);
  CHECK(left.find("group 1 lost a rank") != std::string::npos);
  std::vector<std::size_t> at(sizes.size(), 0);  // tensor k's offset in the concatenated model
  for (std::size_t k = 1; k < sizes.size(); ++k) at[k] = at[k - 1] + sizes[k - 1];
  for (int r : {0, 1, 4, 5}) {
    INFO("rank ", r);
    REQUIRE((WIFEXITED(status[static_cast<std::size_t>(r)]) && WEXITSTATUS(status[static_cast<std::size_t>(r)]) == 0));
    std::ifstream in(dir.file("rank" + std::to_string(r)), std::ios::binary);
    const std::vector<int> head = get<int>(in, 2);
    REQUIRE(in.good());
    CHECK(head[0] == r / 2);
    CHECK(head[1] == 2);
    const auto w = static_cast<std::size_t>(r / 2);
    for (std::size_t k : sp::shard_tensors[static_cast<std::size_t>(r % 2)]) {
      const std::vector<float> rep = get<float>(in, sizes[k]), glob = get<float>(in, sizes[k]);
      INFO("tensor ", k);
      REQUIRE(in.good());
      const auto from = static_cast<std::ptrdiff_t>(at[k]), to = static_cast<std::ptrdiff_t>(at[k] + sizes[k]);
      CHECK(same_bits(rep, std::vector<float>(flat.replica[w].begin() + from, flat.replica[w].begin() + to)));
      CHECK(same_bits(glob, std::vector<float>(flat.global[w].begin() + from, flat.global[w].begin() + to)));
    }
  }
}
