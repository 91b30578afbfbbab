// SPDX-License-Identifier: Apache-2.0
// comm::regrouped (the elastic device communicator behind comm::elastic_nccl)
// without a GPU: its membership is a real elastic comm::gloo, and its data
// communicator, which NCCL is in production, is substituted by one that
// runs comm::gloo's host collectives on device views (in this program device
// memory is host memory: sim_device.hpp). Each generation's substitute is a
// new comm::gloo that meets its peers under a run id made from the id rank 0
// of the generation published, so a member holding another generation's id
// would never meet the others. Real processes over loopback: a worker
// SIGKILLs itself (DILOCO_FAULT, compiled in here), the survivors finish
// with identical theta_global, and every process's record shows the data
// communicator aborted and made again at each re-forming, for the new
// generation, rank and size, from the id its rank 0 published. The binary
// is its own rank program (DILOCO_TEST_ROLE=train).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <diloco/comm/regrouped.hpp>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_link.hpp"
#include "elastic_by_hand.hpp"
#include "process_harness.hpp"
#include "rank_threads.hpp"
#include "sim_device.hpp"

namespace dc = diloco;
using gloo_comm = dc::comm::gloo;
using namespace std::chrono_literals;

namespace {

using harness::env_or;

std::string hex_of(std::span<const char> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
}

// The substitute data communicator: a comm::gloo of its own, over device
// views. abort() is recorded (regrouped calls it when the group re-forms).
class gloo_data_link : public comm_link<true, gloo_comm> {
 public:
  gloo_data_link(std::unique_ptr<gloo_comm> c, std::string log, std::uint64_t generation)
      : comm_link(*c), owner_(std::move(c)), log_(std::move(log)), generation_(generation) {}
  void abort(const std::string& /*reason*/) {
    if (!log_.empty()) append_line(log_, "abort " + std::to_string(generation_));
  }

 private:
  std::unique_ptr<gloo_comm> owner_;
  std::string log_;
  std::uint64_t generation_;
};

// Makes each generation's gloo_data_link; records in `log` (one file per
// process) the id it made ("made <hex>") and each creation
// ("create <generation> <rank> <size> <member> <hex>").
struct sim_factory {
  using communicator = gloo_data_link;
  static constexpr std::string_view name = "gloo_sim";

  gloo_comm::options base;  // the membership's: store, host
  std::string log;

  std::vector<char> make_id() {
    std::random_device rd;
    std::vector<char> id(16);
    for (char& c : id) c = static_cast<char>(rd() & 0xff);
    if (!log.empty()) append_line(log, "made " + hex_of(id));
    return id;
  }

  communicator create(std::span<const char> id, const dc::comm::data_group& g) {
    const std::string hex = hex_of(id);
    if (!log.empty())
      append_line(log, "create " + std::to_string(g.generation) + " " + std::to_string(g.rank) + " " +
                           std::to_string(g.size) + " " + g.member + " " + hex);
    gloo_comm::options o = base;
    o.elastic = false;
    o.min_workers = 1;
    o.rank = g.rank;
    o.size = g.size;
    o.timeout = g.timeout;
    o.run_id = base.run_id + "-data-" + hex;
    return gloo_data_link(std::make_unique<gloo_comm>(o), log, g.generation);
  }
};

using regrouped_sim = dc::comm::regrouped<sim_factory>;
static_assert(dc::device_communicator<regrouped_sim> && dc::async_device_communicator<regrouped_sim> &&
              dc::elastic_communicator<regrouped_sim> && !dc::communicator<regrouped_sim>);

constexpr std::size_t n = 256;
constexpr std::size_t H = 4;

// The objective 0.5 * |x - c|^2 of the worker started with rank `rank`,
// in outer round `round` (counted from 1): a function of both, so the test
// can replay the rounds by hand and see a lost contribution or a frozen
// theta_global.
float target(int rank, std::uint64_t round, std::size_t i) {
  return static_cast<float>(rank + 1) * 0.3f + static_cast<float>(round % 5) * 0.2f + static_cast<float>(i % 13) * 0.05f;
}

constexpr float inner_lr = 0.1f, outer_lr = 0.7f, mu = 0.9f;  // outer: nesterov's defaults

// The blocking rounds by hand (elastic_by_hand.hpp).
std::vector<double> by_hand(const std::vector<std::vector<int>>& members_per_round) {
  return elastic_by_hand(n, H, inner_lr, outer_lr, mu, members_per_round, target);
}

// theta_global's tensors (not the device layout's padding), hashed.
template <class Trainer>
std::string global_hash(const Trainer& t) {
  const auto g = t.template global_parameters<dc::device_space>();
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t k = 0; k < 2; ++k) {
    const auto* b = reinterpret_cast<const unsigned char*>(g.data() + t.global_offset(k));
    for (std::size_t i = 0; i < n / 2 * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
    for (std::size_t i = 0; i < n / 2; ++i)
      if (!std::isfinite(g.data()[t.global_offset(k) + i])) return "nonfinite";
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// One worker over device tensors: trains until DILOCO_TEST_ROUNDS rounds
// are applied (and the group has DILOCO_TEST_WANT_SIZE workers, when set),
// then writes "<hash> <size> <rounds> <generation> <member>" to
// <dir>/theta.<pid>; its data communicators' record goes to
// <dir>/data.<pid>. DILOCO_TEST_SYNC: blocking or streaming (P = 2, tau =
// 1, alpha = 0.5); DILOCO_TEST_LEAVE_AT=k leaves after round k. Exit 0 on
// success, 3 on a comm_error, 4 otherwise.
template <class Sync>
int train_with(typename Sync::options so) {
  const std::string dir = env_or("DILOCO_TEST_DIR", ".");
  const auto rounds = static_cast<std::uint64_t>(std::atoi(env_or("DILOCO_TEST_ROUNDS", "6").c_str()));
  const int want_size = std::atoi(env_or("DILOCO_TEST_WANT_SIZE", "0").c_str());
  const auto leave_at = static_cast<std::uint64_t>(std::atoi(env_or("DILOCO_TEST_LEAVE_AT", "0").c_str()));
  const std::string me = std::to_string(getpid());
  const int start_rank = std::atoi(env_or("DILOCO_RANK", "0").c_str());
  try {
    const auto o = gloo_comm::options_from_env();
    regrouped_sim comm(o, sim_factory{o, dir + "/data." + me});
    using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, regrouped_sim, Sync>;
    typename trainer::options opts;
    opts.inner_steps = H;
    opts.inner = {.lr = inner_lr};
    opts.outer = {.lr = outer_lr, .momentum = mu};
    opts.sync = so;
    // "Device" memory is host memory in this program.
    std::vector<std::vector<float>> x(2, std::vector<float>(n / 2, 0.5f)), g(2, std::vector<float>(n / 2));
    std::vector<dc::device_view<float>> params, grads;
    for (std::size_t k = 0; k < 2; ++k) {
      params.emplace_back(x[k].data(), x[k].size());
      grads.emplace_back(g[k].data(), g[k].size());
    }
    trainer t(params, comm, opts);
    std::uint64_t steps = 0;
    while (t.stats().rounds < rounds || t.world_size() < want_size) {
      for (std::size_t k = 0; k < 2; ++k)
        for (std::size_t i = 0; i < n / 2; ++i) g[k][i] = x[k][i] - target(start_rank, t.stats().rounds + 1, k * n / 2 + i);
      t.step(grads);
      ++steps;
      if (leave_at > 0 && steps == leave_at * H) {
        t.leave();
        harness::write_file(dir + "/left." + me, std::to_string(t.stats().rounds));
        return 0;
      }
    }
    t.finish();
    {
      std::string values;  // theta_global's tensors, exactly (hexadecimal floats)
      const auto gl = t.template global_parameters<dc::device_space>();
      for (std::size_t k = 0; k < 2; ++k)
        for (std::size_t i = 0; i < n / 2; ++i) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%a\n", static_cast<double>(gl.data()[t.global_offset(k) + i]));
          values += buf;
        }
      harness::write_file(dir + "/values." + me, values);
    }
    harness::write_file(dir + "/theta." + me, global_hash(t) + " " + std::to_string(t.world_size()) + " " +
                                                   std::to_string(t.stats().rounds) + " " +
                                                   std::to_string(comm.generation()) + " " +
                                                   comm.membership().member_id());
    return 0;
  } catch (const dc::comm_error& e) {
    harness::write_file(dir + "/error." + me, e.what());
    return 3;
  } catch (const std::exception& e) {
    harness::write_file(dir + "/error." + me, e.what());
    return 4;
  }
}

int train() {
  const std::string sync = env_or("DILOCO_TEST_SYNC", "blocking");
  if (sync == "blocking") return train_with<dc::sync::blocking>({});
  if (sync == "streaming") return train_with<dc::sync::streaming>({.fragments = 2, .delay = 1, .alpha = 0.5f});
  std::fprintf(stderr, "unknown DILOCO_TEST_SYNC '%s'\n", sync.c_str());
  return 2;
}

// ------------------------------------------------------------ the checks
struct creation {
  std::uint64_t generation = 0;
  int rank = 0, size = 0;
  std::string member, id;
  std::string made;  // the id this process made just before, if it did
  bool aborted_before = true;  // the previous creation was aborted first
};

struct process_record {
  std::string pid;
  std::vector<creation> creations;
  std::vector<std::uint64_t> aborted;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

// Every process's data.<pid> record.
std::map<std::string, process_record> data_records(const std::string& dir) {
  std::map<std::string, process_record> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("data.", 0) != 0) continue;
    process_record r;
    r.pid = name.substr(5);
    std::string made;
    bool aborted = true;
    for (const auto& line : lines_of(harness::read_file(e.path().string()))) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      if (kind == "made") {
        in >> made;
      } else if (kind == "abort") {
        std::uint64_t g = 0;
        in >> g;
        r.aborted.push_back(g);
        if (!r.creations.empty() && r.creations.back().generation == g) aborted = true;
      } else if (kind == "create") {
        creation c;
        in >> c.generation >> c.rank >> c.size >> c.member >> c.id;
        c.made = std::exchange(made, "");
        c.aborted_before = aborted;
        aborted = false;
        r.creations.push_back(c);
      }
    }
    out[r.pid] = r;
  }
  return out;
}

struct finished {
  std::string hash, member;
  int size = 0;
  std::uint64_t rounds = 0, generation = 0;
};

std::map<std::string, finished> results(const std::string& dir, std::vector<std::string>& errors) {
  std::map<std::string, finished> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("error.", 0) == 0) errors.push_back(harness::read_file(e.path().string()));
    if (name.rfind("theta.", 0) != 0) continue;
    finished f;
    std::istringstream in(harness::read_file(e.path().string()));
    in >> f.hash >> f.size >> f.rounds >> f.generation >> f.member;
    out[name.substr(6)] = f;
  }
  return out;
}

gloo_comm::options store_options(const std::string& dir) {
  gloo_comm::options o;
  o.rank = 0;
  o.size = 1;
  o.rendezvous = gloo_comm::file_store{dir + "/store"};
  o.run_id = "elastic";
  o.timeout = 5s;
  return o;
}

// Generation g's member ids in rank order, as the membership wrote them in
// the store ("r0,r1,r3,\n<next joiner slot>").
std::vector<std::string> members_of(const std::string& dir, std::uint64_t g) {
  dc::comm::detail_gloo::rendezvous_store store(store_options(dir), "elastic", "test");
  const std::vector<char> bytes = store.store().get("g" + std::to_string(g) + "/members");
  const std::string text(bytes.begin(), bytes.end());
  std::vector<std::string> ids;
  std::string cur;
  for (char c : text.substr(0, text.find('\n'))) {
    if (c == ',') {
      ids.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return ids;
}

// The records agree with the membership the store holds: every creation
// of generation g used g's id as rank 0 of g made it (rank 0 made it just
// before its own creation), with the rank and size the store's member list
// gives that member; each member of g made its communicator once; ids of
// different generations differ; a process made a new one only after
// aborting the last.
void check_records(const std::string& dir, const std::map<std::string, process_record>& records) {
  std::map<std::uint64_t, std::vector<creation>> by_generation;
  for (const auto& entry : records) {
    const auto& pid = entry.first;  // not a structured binding: Clang 14 cannot capture one (CAPTURE)
    const auto& r = entry.second;
    CAPTURE(pid);
    for (std::size_t i = 0; i < r.creations.size(); ++i) {
      const creation& c = r.creations[i];
      by_generation[c.generation].push_back(c);
      if (i > 0) {
        CHECK(c.generation > r.creations[i - 1].generation);
        CHECK(c.aborted_before);
      }
      CHECK((c.rank == 0) == !c.made.empty());
      if (c.rank == 0) CHECK(c.made == c.id);
    }
  }
  std::map<std::string, std::uint64_t> generation_of_id;
  for (const auto& entry : by_generation) {
    const auto& g = entry.first;  // not a structured binding: Clang 14 cannot capture one (CAPTURE)
    const auto& cs = entry.second;
    CAPTURE(g);
    const std::vector<std::string> list = members_of(dir, g);
    REQUIRE(cs.size() == list.size());
    std::vector<int> ranks;
    for (const creation& c : cs) {
      CAPTURE(c.member);
      CHECK(c.size == static_cast<int>(list.size()));
      REQUIRE(c.rank >= 0);
      REQUIRE(c.rank < static_cast<int>(list.size()));
      CHECK(list[static_cast<std::size_t>(c.rank)] == c.member);
      CHECK(c.id == cs[0].id);
      ranks.push_back(c.rank);
    }
    std::sort(ranks.begin(), ranks.end());
    for (std::size_t r = 0; r < ranks.size(); ++r) CHECK(ranks[r] == static_cast<int>(r));
    CHECK(generation_of_id.emplace(cs[0].id, g).second);
  }
}

std::vector<std::uint64_t> generations_made(const process_record& r) {
  std::vector<std::uint64_t> out;
  for (const auto& c : r.creations) out.push_back(c.generation);
  return out;
}

std::vector<std::string> env_for(const std::string& dir, int rank, int size, const std::string& fault) {
  return {"DILOCO_TEST_ROLE=train",
          "DILOCO_TEST_DIR=" + dir,
          "DILOCO_RANK=" + std::to_string(rank),
          "DILOCO_WORLD_SIZE=" + std::to_string(size),
          "DILOCO_STORE=file://" + dir + "/store",
          "DILOCO_RUN_ID=elastic",
          "DILOCO_ELASTIC=1",
          "DILOCO_TIMEOUT_MS=1500",
          "DILOCO_TEST_ROUNDS=6",
          "DILOCO_FAULT=" + fault};
}

void check_exits(const harness::processes& ps, int skip) {
  for (std::size_t p = 0; p < ps.count(); ++p) {
    if (static_cast<int>(p) == skip) continue;
    INFO("process ", p, " ", harness::describe(ps.status(p)));
    CHECK((ps.status(p).exited && ps.status(p).code == 0));
  }
}

// The finished workers: all `workers` of them, bitwise equal theta_global,
// in a group of `size`, in the same final generation.
void check_finished(const std::map<std::string, finished>& done, const std::vector<std::string>& errors,
                    std::size_t workers, int size) {
  for (const auto& e : errors) MESSAGE("error: ", e);
  REQUIRE(done.size() == workers);
  const finished& first = done.begin()->second;
  for (const auto& entry : done) {
    const auto& pid = entry.first;  // not a structured binding: Clang 14 cannot capture one (CAPTURE)
    const auto& f = entry.second;
    CAPTURE(pid);
    CHECK(f.hash.size() == 16);
    CHECK(f.hash == first.hash);
    CHECK(f.size == size);
    CHECK(f.rounds >= 6);
    CHECK(f.generation == first.generation);
  }
}

// Every finished worker's theta_global (values.<pid>) against the blocking
// rounds replayed by hand with these members (by starting rank) in each
// round: fp32 against double, to 1e-5 relative, as test_elastic_threads.cpp
// (a lost contribution or a frozen theta_global moves it by more than 1e-2).
void check_by_hand(const std::string& dir, std::size_t workers, const std::vector<std::vector<int>>& members_per_round) {
  const auto want = by_hand(members_per_round);
  std::size_t seen = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("values.", 0) != 0) continue;
    ++seen;
    const std::string text = harness::read_file(e.path().string());
    std::vector<double> v;
    const char* p = text.c_str();
    char* end = nullptr;
    for (double x = std::strtod(p, &end); end != p; x = std::strtod(p, &end)) v.push_back(x), p = end;
    REQUIRE(v.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(v[i] == doctest::Approx(want[i]).epsilon(1e-5));
    }
  }
  CHECK(seen == workers);
}

// What the workers of a finished run left in `dir`, checked: `workers`
// finished in a group of `size` with the same theta_global, and the data
// communicators' records agree with the store (check_records).
struct run_outcome {
  std::map<std::string, finished> done;
  std::map<std::string, process_record> records;
};
run_outcome check_run(const std::string& dir, std::size_t workers, int size) {
  std::vector<std::string> errors;
  run_outcome out{results(dir, errors), data_records(dir)};
  check_finished(out.done, errors, workers, size);
  check_records(dir, out.records);
  return out;
}

}  // namespace

TEST_SUITE_BEGIN("processes");

TEST_CASE("4 workers over regrouped device communicators, one SIGKILLed: the 3 survivors agree, and each "
          "re-forming aborted and re-made the data communicator from the new rank 0's id") {
  const int m = 4, victim = 2;
  struct scenario {
    std::string sync, fault;
    std::vector<std::uint64_t> survivors_made;  // the generations each survivor made a communicator for
  };
  // A death mid-round (inside the data communicator's all-reduce) or during
  // inner steps: generation 0, then 1 without the victim. At start-up
  // generation 0 never connects: the survivors' first is generation 1.
  for (const scenario& s : {scenario{"blocking", "all_reduce:2", {0, 1}}, scenario{"blocking", "inner:2", {0, 1}},
                            scenario{"blocking", "startup:0", {1}}, scenario{"streaming", "all_reduce:3", {0, 1}}}) {
    CAPTURE(s.sync);
    CAPTURE(s.fault);
    harness::temp_dir d;
    const std::string dir = d.path().string();
    harness::processes ps;
    for (int r = 0; r < m; ++r) {
      auto env = env_for(dir, r, m, r == victim ? s.fault : std::string("none:0"));
      env.push_back("DILOCO_TEST_SYNC=" + s.sync);
      ps.start(env);
    }
    ps.wait_all(60s);
    CHECK(ps.status(victim).signal == SIGKILL);
    check_exits(ps, victim);
    const auto [done, records] = check_run(dir, 3, 3);
    for (const auto& entry : done) {
      const auto& pid = entry.first;  // not a structured binding: Clang 14 cannot capture one (CAPTURE)
      const auto& f = entry.second;
      CAPTURE(pid);
      REQUIRE(records.count(pid) == 1);
      CHECK(generations_made(records.at(pid)) == s.survivors_made);
      CHECK(f.generation == s.survivors_made.back());
      if (s.sync == "blocking") CHECK(f.rounds == 6);
    }
    // Blocking: the victim's contribution is in the rounds before the one
    // it died in (core/fault.hpp: stage:round; 0 = start-up), the survivors
    // run that round again without it (docs/internals.md, "Elastic
    // membership").
    if (s.sync == "blocking") {
      const int with_victim = s.fault == "startup:0" ? 0 : 1;
      std::vector<std::vector<int>> members;
      for (int k = 1; k <= 6; ++k) members.push_back(k <= with_victim ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1, 3});
      check_by_hand(dir, 3, members);
    }
  }
}

TEST_CASE("a killed worker started again rejoins: the members re-make their data communicator for the "
          "generation that admits it, and all 4 end with the same theta_global") {
  const int m = 4, victim = 1;
  harness::temp_dir d;
  const std::string dir = d.path().string();
  harness::processes ps;
  for (int r = 0; r < m; ++r) {
    auto env = env_for(dir, r, m, r == victim ? "inner:2" : "none:0");
    env.push_back("DILOCO_TEST_WANT_SIZE=4");
    ps.start(env);
  }
  // Start the victim again, as the launcher would, once it is dead.
  CHECK(harness::wait_for([&] { return harness::proc_state(ps.pid(victim)) == 'Z'; }, 30s));
  auto env = env_for(dir, victim, m, "none:0");
  env.push_back("DILOCO_TEST_WANT_SIZE=4");
  const auto again = ps.start(env);
  ps.wait_all(60s);
  check_exits(ps, victim);
  const auto [done, records] = check_run(dir, 4, 4);
  const std::string joiner = std::to_string(ps.pid(again));
  for (const auto& entry : done) {
    const auto& pid = entry.first;  // not a structured binding: Clang 14 cannot capture one (CAPTURE)
    const auto& f = entry.second;
    CAPTURE(pid);
    // Generation 0 of 4, 1 of the 3 survivors, 2 with the joiner.
    CHECK(generations_made(records.at(pid)) ==
          (pid == joiner ? std::vector<std::uint64_t>{2} : std::vector<std::uint64_t>{0, 1, 2}));
    CHECK(f.generation == 2);
  }
  CHECK(done.at(joiner).member == "j0");
}

TEST_CASE("a worker that leaves aborts its data communicator and makes none; the others re-make theirs") {
  const int m = 4, leaver = 3;
  harness::temp_dir d;
  const std::string dir = d.path().string();
  harness::processes ps;
  for (int r = 0; r < m; ++r) {
    auto env = env_for(dir, r, m, "none:0");
    if (r == leaver) env.push_back("DILOCO_TEST_LEAVE_AT=2");
    ps.start(env);
  }
  ps.wait_all(60s);
  check_exits(ps, -1);
  const auto [done, records] = check_run(dir, 3, 3);
  REQUIRE(records.size() == 4);
  for (const auto& entry : records) {
    const auto& pid = entry.first;  // not a structured binding: Clang 14 cannot capture one (CAPTURE)
    const auto& r = entry.second;
    CAPTURE(pid);
    const bool left = done.count(pid) == 0;
    CHECK(generations_made(r) == (left ? std::vector<std::uint64_t>{0} : std::vector<std::uint64_t>{0, 1}));
    if (left) CHECK(r.aborted == std::vector<std::uint64_t>{0});
  }
  // Rank 3 left after round 2: its contribution is in rounds 1 and 2 only.
  check_by_hand(dir, 3, {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2}});
}

TEST_SUITE_END();

// ----------------------------------------------- in one process, threads
namespace {

dc::comm::data_group group(std::uint64_t generation, int rank, int size, std::chrono::milliseconds timeout = 5s) {
  return {generation, rank, size, "r" + std::to_string(rank), timeout};
}

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

gloo_comm::options member_options(const std::string& dir, int rank, int size) {
  gloo_comm::options o = store_options(dir);
  o.rank = rank;
  o.size = size;
  o.elastic = true;
  o.timeout = 1500ms;
  return o;
}

}  // namespace

TEST_SUITE_BEGIN("threads");

TEST_CASE("each generation's id travels under its own key of a real file store") {
  harness::temp_dir d;
  dc::comm::detail_gloo::rendezvous_store store(store_options(d.path().string()), "elastic", "test");
  for (std::uint64_t g : {0u, 1u, 7u}) {
    CAPTURE(g);
    const std::string id = "id of generation " + std::to_string(g);
    std::vector<std::vector<char>> got(3);
    const auto errors = run_ranks(3, [&](int r) {
      const auto record =
          dc::comm::detail_regroup::group_id_record(store.store(), group(g, r, 3), "test", [&] { return bytes(id); });
      got[static_cast<std::size_t>(r)] = dc::comm::detail_regroup::decode_group_id(record, group(g, r, 3), "test");
    });
    for (int r = 0; r < 3; ++r) {
      REQUIRE_FALSE(errors[static_cast<std::size_t>(r)]);
      CHECK(got[static_cast<std::size_t>(r)] == bytes(id));
    }
    // The key names the generation (under the run's scope of the store).
    CHECK(dc::comm::detail_regroup::id_key(g, "test") == "g" + std::to_string(g) + "/data/test");
    CHECK(store.has({"g" + std::to_string(g) + "/data/test"}));
  }
}

TEST_CASE("a member of a generation whose rank 0 never publishes gets comm_error naming the generation, never "
          "an older generation's id") {
  harness::temp_dir d;
  dc::comm::detail_gloo::rendezvous_store store(store_options(d.path().string()), "elastic", "test");
  // Generation 1's id is in the store; generation 2's rank 0 never comes.
  (void)dc::comm::detail_regroup::group_id_record(store.store(), group(1, 0, 2), "test", [] { return bytes("g1"); });
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      dc::comm::detail_regroup::group_id_record(store.store(), group(2, 1, 2, 300ms), "test",
                                                [] { return bytes("never called"); }),
      doctest::Contains("test (generation 2) rank 1: waited up to 300 ms for rank 0 to publish the id of generation 2 "
                        "under store key 'g2/data/test'"),
      dc::comm_error);
  CHECK(std::chrono::steady_clock::now() - start >= 300ms);
  CHECK_FALSE(store.has({"g2/data/test"}));
}

TEST_CASE("rank 0's failure to make the id, or a foreign value under the key, ends the exchange with the "
          "generation named") {
  harness::temp_dir d;
  dc::comm::detail_gloo::rendezvous_store store(store_options(d.path().string()), "elastic", "test");
  const auto errors = run_ranks(2, [&](int r) {
    const auto record = dc::comm::detail_regroup::group_id_record(store.store(), group(3, r, 2), "test",
                                                                  []() -> std::vector<char> {
                                                                    throw std::runtime_error("no network interface");
                                                                  });
    (void)dc::comm::detail_regroup::decode_group_id(record, group(3, r, 2), "test");
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    CHECK(message_of(e).find("test (generation 3): rank 0 could not make the id of the generation's communicator: "
                             "no network interface") != std::string::npos);
  }
  store.store().set("g4/data/test", bytes("left here by someone else"));
  const auto record = dc::comm::detail_regroup::group_id_record(store.store(), group(4, 1, 2), "test",
                                                                [] { return bytes("unused"); });
  CHECK_THROWS_WITH_AS(dc::comm::detail_regroup::decode_group_id(record, group(4, 1, 2), "test"),
                       doctest::Contains("test id of generation 4 from store key 'g4/data/test': bad magic"),
                       dc::format_error);
}

TEST_CASE("recover() on every member aborts the data communicator and makes the next generation's from a new id") {
  harness::temp_dir d;
  const std::string dir = d.path().string();
  std::vector<std::vector<float>> sums(2);
  const auto errors = run_ranks(2, [&](int r) {
    const auto o = member_options(dir, r, 2);
    regrouped_sim comm(o, sim_factory{o, dir + "/data." + std::to_string(r)});
    for (int round = 0; round < 2; ++round) {
      std::vector<float> v{static_cast<float>(r + 1), 10.0f * static_cast<float>(round + 1)};
      comm.all_reduce(dc::device_view<float>(v.data(), v.size()), dc::reduce_op::sum);
      sums[static_cast<std::size_t>(r)].insert(sums[static_cast<std::size_t>(r)].end(), v.begin(), v.end());
      if (round == 0) comm.recover();
    }
    CHECK(comm.generation() == 1);
    // Both generations' all-reduces of 8 bytes count: a ring moves
    // 2 (M - 1) / M = 1 times the buffer each way at M = 2.
    CHECK(comm.traffic().bytes_sent == 16);
    CHECK(comm.traffic().bytes_received == 16);
  });
  for (const auto& e : errors)
    if (e) FAIL(message_of(e));
  // 1 + 2 and 10 + 10, then 1 + 2 and 20 + 20, on both.
  for (const auto& s : sums) CHECK(s == std::vector<float>{3, 20, 3, 40});
  const auto records = data_records(dir);
  check_records(dir, records);
  for (const auto& [pid, r] : records) {
    CHECK(generations_made(r) == std::vector<std::uint64_t>{0, 1});
    CHECK(r.aborted == std::vector<std::uint64_t>{0});
  }
}

namespace {
// A data communicator that can never be made (every member alive): the
// retry after one recovery fails too, and that is raised.
struct broken_factory : sim_factory {
  using communicator = gloo_data_link;
  communicator create(std::span<const char>, const dc::comm::data_group& g) {
    dc::detail::raise<dc::comm_error>("simulated failure of generation ", g.generation);
  }
};
// Rank 0 cannot make an id: every member learns it at once.
struct no_id_factory : sim_factory {
  std::vector<char> make_id() { throw std::runtime_error("ncclGetUniqueId: no network interface"); }
};
}  // namespace

TEST_CASE("a data communicator that fails with every member alive ends with comm_error, not a loop") {
  harness::temp_dir d;
  const std::string dir = d.path().string();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](int r) {
    const auto o = member_options(dir, r, 2);
    dc::comm::regrouped<broken_factory> comm(o, broken_factory{{o, ""}});
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    const std::string what = message_of(e);
    INFO(what);
    CHECK(what.find("failed in two generations in a row with all 2 members alive (last, generation 1)") !=
          std::string::npos);
    CHECK(what.find("simulated failure of generation 1") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 20s);
}

TEST_CASE("rank 0 failing to make the id ends every member's construction with its reason") {
  harness::temp_dir d;
  const std::string dir = d.path().string();
  const auto errors = run_ranks(3, [&](int r) {
    const auto o = member_options(dir, r, 3);
    dc::comm::regrouped<no_id_factory> comm(o, no_id_factory{{o, ""}});
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    CHECK(message_of(e).find("gloo_sim (generation 0): rank 0 could not make the id of the generation's "
                             "communicator: ncclGetUniqueId: no network interface") != std::string::npos);
  }
}

TEST_SUITE_END();

int main(int argc, char** argv) {
  if (const char* role = std::getenv("DILOCO_TEST_ROLE")) {
    if (std::string(role) == "train") return train();
    std::fprintf(stderr, "unknown DILOCO_TEST_ROLE '%s'\n", role);
    return 2;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
