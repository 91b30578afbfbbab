// SPDX-License-Identifier: Apache-2.0
// The ranks agree where they stand (issue 38, items 2, 4 and 5):
//  - load() is collective: ranks that restore files of different rounds all
//    raise state_error naming each rank's round, with their state as it was;
//    load_latest_common() resumes from the newest round every rank saved;
//  - a rank that took a different number of inner steps is named, with each
//    rank's step count, on every rank (at a round's begin and at finish());
//  - under one_step_delay a non-finite replica refuses its round when the
//    round begins, not a phase later.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <filesystem>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

namespace dc = diloco;
namespace fs = std::filesystem;

namespace {

// Worker m's loss: 1/2 ||w - c_m||^2, so its gradient is w - c_m.
std::vector<float> grads(const std::vector<float>& w, int m) {
  std::vector<float> g(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i] - (0.5f + 0.25f * static_cast<float>(m) + 0.01f * static_cast<float>(i));
  return g;
}

std::vector<float> start(int seed) {
  std::vector<float> w(37);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(seed) - 0.02f * static_cast<float>(i % 11);
  return w;
}

template <class Sync = dc::sync::blocking>
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads, Sync>;

template <class Sync = dc::sync::blocking>
typename trainer<Sync>::options options(std::size_t h, float lr = 0.05f) {
  typename trainer<Sync>::options o;
  o.inner_steps = h;
  o.inner.lr = lr;
  return o;
}

// Every state entry's bytes (and the replica's), to compare states whole.
template <class T>
std::vector<std::vector<unsigned char>> snapshot(const T& t, const std::vector<float>& w) {
  std::vector<std::vector<unsigned char>> out;
  auto add = [&out](const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    out.emplace_back(c, c + n);
  };
  for (const auto& e : t.state()) {
    if (e.is_scalar)
      add(&e.value, sizeof e.value);
    else
      add(e.data, e.size * sizeof(float));
  }
  add(w.data(), w.size() * sizeof(float));
  return out;
}

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("diloco_restore_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  std::string round_file(int rank, int round) const {
    return (path / ("rank-" + std::to_string(rank)) / ("round-" + std::to_string(round) + ".ckpt")).string();
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(another error) ") + e.what();
  }
  return "(no error)";
}

}  // namespace

// ------------------------------------------------------------- item 2

TEST_CASE("save_round keeps the newest k checkpoints per rank, named by round") {
  scratch_dir dir("keep");
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<> t(w, comm, options(3));
    std::vector<std::string> written;
    for (int round = 1; round <= 4; ++round) {
      for (int s = 0; s < 3; ++s) t.step(grads(w, m));
      written.push_back(t.save_round(dir.str(), 2));
    }
    CHECK(written.back() == dir.round_file(m, 4));
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir.path / ("rank-" + std::to_string(m))))
      left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<std::string>{"round-3.ckpt", "round-4.ckpt"});
    CHECK_THROWS_AS(t.save_round(dir.str(), 0), dc::config_error);
  });
}

TEST_CASE("ranks that restore different rounds all raise, naming each round; their state is unchanged") {
  scratch_dir dir("differ");
  std::mutex mu;
  std::vector<std::string> messages(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<> t(w, comm, options(4));
    for (int round = 1; round <= 3; ++round) {
      for (int s = 0; s < 4; ++s) t.step(grads(w, m));
      t.save_round(dir.str(), 3);
    }
    // A fresh instance, trained a little so its state is its own.
    auto v = start(2);
    trainer<> u(v, comm, options(4));
    for (int s = 0; s < 5; ++s) u.step(grads(v, m));
    const auto before = snapshot(u, v);
    // Rank 0 restores round 3, rank 1 round 2: as a group killed while saving leaves them.
    const std::string msg = error_of<dc::state_error>([&] { u.load(dir.round_file(m, m == 0 ? 3 : 2)); });
    {
      std::lock_guard lock(mu);
      messages[static_cast<std::size_t>(m)] = msg;
    }
    CHECK(snapshot(u, v) == before);
    // Training goes on from the state it had, together.
    for (int s = 0; s < 3; ++s) u.step(grads(v, m));
    CHECK(u.stats().rounds == 2);
  });
  for (const auto& msg : messages) {
    CAPTURE(msg);
    CHECK(contains(msg, "ranks restored different checkpoints: rank 0 round 3"));
    CHECK(contains(msg, "rank 1 round 2"));
  }
}

TEST_CASE("files of the same round from different runs are refused too (the checksum differs)") {
  scratch_dir dir("runs");
  std::vector<std::string> messages(2);
  std::mutex mu;
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto a = start(1), b = start(1);
    trainer<> t(a, comm, options(4));
    trainer<> other(b, comm, options(4, 0.02f));  // another inner lr (a per-rank option): another run
    for (int s = 0; s < 8; ++s) {
      t.step(grads(a, m));
      other.step(grads(b, m));
    }
    t.save(dir.str() + "/t" + std::to_string(m));
    other.save(dir.str() + "/o" + std::to_string(m));
    auto v = start(3);
    trainer<> u(v, comm, options(4));
    const auto before = snapshot(u, v);
    const std::string msg = error_of<dc::state_error>([&] { u.load(dir.str() + (m == 0 ? "/t0" : "/o1")); });
    CHECK(snapshot(u, v) == before);
    std::lock_guard lock(mu);
    messages[static_cast<std::size_t>(m)] = msg;
  });
  for (const auto& msg : messages) {
    CAPTURE(msg);
    CHECK(contains(msg, "ranks restored different checkpoints: rank 0 round 2 (inner step 8"));
    CHECK(contains(msg, "rank 1 round 2 (inner step 8"));
  }
}

TEST_CASE("one rank's damaged file: it raises format_error, the others state_error naming it; no state changes") {
  scratch_dir dir("damaged");
  dc::comm::threads::world world(3);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<dc::sync::one_step_delay> t(w, comm, options<dc::sync::one_step_delay>(4));
    for (int s = 0; s < 8; ++s) t.step(grads(w, m));
    const std::string path = t.save_round(dir.str());
    if (m == 2) fs::resize_file(path, fs::file_size(path) - 3);
    comm.barrier();
    auto v = start(2);
    trainer<dc::sync::one_step_delay> u(v, comm, options<dc::sync::one_step_delay>(4));
    const auto before = snapshot(u, v);
    if (m == 2) {
      CHECK_THROWS_AS(u.load(path), dc::format_error);
    } else {
      const std::string msg = error_of<dc::state_error>([&] { u.load(path); });
      CAPTURE(msg);
      CHECK(contains(msg, "not every rank could restore its checkpoint (rank 2: "));
    }
    CHECK(snapshot(u, v) == before);
  });
}

TEST_CASE("load_latest_common resumes from the newest round that every rank has") {
  scratch_dir dir("latest");
  dc::comm::threads::world world(3);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<> t(w, comm, options(4));
    std::vector<std::vector<unsigned char>> at_round_2;
    for (int round = 1; round <= 3; ++round) {
      for (int s = 0; s < 4; ++s) t.step(grads(w, m));
      t.save_round(dir.str(), 2);
      if (round == 2) at_round_2 = snapshot(t, w);
    }
    comm.barrier();
    // Rank 1's newest file is missing (killed before its rename).
    if (m == 1) fs::remove(dir.round_file(1, 3));
    comm.barrier();
    auto v = start(2);
    trainer<> u(v, comm, options(4));
    CHECK(u.load_latest_common(dir.str()) == 2);
    CHECK(snapshot(u, v) == at_round_2);
    // Every rank resumed the same theta_global: training goes on together.
    for (int s = 0; s < 4; ++s) u.step(grads(v, m));
    CHECK(u.stats().rounds == 3);
    comm.barrier();
    // No round common to all: every rank raises, naming each rank's rounds.
    if (m == 2) fs::remove(dir.round_file(2, 2));
    comm.barrier();
    const auto before = snapshot(u, v);
    const std::string msg = error_of<dc::state_error>([&] { u.load_latest_common(dir.str()); });
    CAPTURE(msg);
    CHECK(contains(msg, "no round has a checkpoint on every rank"));
    CHECK(contains(msg, "rank 1: 2; rank 2: 3"));
    CHECK(snapshot(u, v) == before);
  });
}

// ------------------------------------------------------------- item 4

TEST_CASE("an extra inner step on one rank mid-round: every rank raises at the round, naming both step counts") {
  std::vector<std::string> messages(2);
  std::mutex mu;
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<> t(w, comm, options(4));
    for (int s = 0; s < 4; ++s) {
      t.inner_step(grads(w, m));
      if (m == 0 && s == 1) t.inner_step(grads(w, m));  // the extra step, mid-round
    }
    const auto theta = std::vector<float>(t.global_parameters().data(), t.global_parameters().data() + w.size());
    const std::string msg = error_of<dc::state_error>([&] { t.outer_round(); });
    CHECK(std::vector<float>(t.global_parameters().data(), t.global_parameters().data() + w.size()) == theta);
    std::lock_guard lock(mu);
    messages[static_cast<std::size_t>(m)] = msg;
  });
  for (const auto& msg : messages) {
    CAPTURE(msg);
    CHECK(contains(msg, "ranks are at different points of training: rank 0 at inner step 5"));
    CHECK(contains(msg, "rank 1 at inner step 4"));
  }
}

TEST_CASE("a rank that takes one step() more: named at the next round's begin or at finish(), on every rank") {
  // H = 4. Rank 1 takes an extra step() in round 1. With 7 steps, rank 1
  // reaches inner step 8 and begins round 2 while rank 0 calls finish() at
  // step 7 (over Gloo rank 0 used to exit and rank 1 to find the
  // connection closed); with 8, both end their rounds and finish() finds
  // 8 against 9.
  for (const int steps : {7, 8}) {
    CAPTURE(steps);
    std::vector<std::string> messages(2);
    std::mutex mu;
    dc::comm::threads::world world(2, std::chrono::seconds(20));
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      auto w = start(1);
      trainer<dc::sync::one_step_delay> t(w, comm, options<dc::sync::one_step_delay>(4));
      const std::string msg = error_of<dc::state_error>([&] {
        for (int s = 0; s < steps; ++s) {
          t.step(grads(w, m));
          if (m == 1 && s == 1) t.step(grads(w, m));
        }
        t.finish();
      });
      std::lock_guard lock(mu);
      messages[static_cast<std::size_t>(m)] = msg;
    });
    for (const auto& msg : messages) {
      CAPTURE(msg);
      if (steps == 7) {
        CHECK(contains(msg, "rank 0 at inner step 7 (finish()"));
        CHECK(contains(msg, "rank 1 at inner step 8 (beginning a reduction"));
      } else {
        CHECK(contains(msg, "rank 0 at inner step 8 (finish()"));
        CHECK(contains(msg, "rank 1 at inner step 9 (finish()"));
      }
    }
  }
}

TEST_CASE("the position check costs one small all-gather per round, outside the rounds' byte counts") {
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<> t(w, comm, options(2));
    for (int s = 0; s < 2; ++s) t.step(grads(w, m));
    const auto setup = t.stats().setup_bytes;
    const auto sent = t.stats().bytes_sent;
    for (int s = 0; s < 2; ++s) t.step(grads(w, m));
    // One 40-byte record per rank per round; the round's own bytes are unchanged.
    CHECK(t.stats().setup_bytes - setup == 40);
    CHECK(t.stats().bytes_sent - sent == t.stats().last_round_bytes_sent);
  });
}

// ------------------------------------------------------------- item 5

TEST_CASE("one_step_delay: an Inf gradient at step 5 refuses round 1 at step 10, on every rank") {
  std::vector<std::string> messages(2);
  std::vector<int> raised_at(2, -1);
  std::mutex mu;
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    auto w = start(1);
    trainer<dc::sync::one_step_delay> t(w, comm, options<dc::sync::one_step_delay>(10));
    std::string msg;
    int at = -1;
    for (int s = 1; s <= 30 && at < 0; ++s) {
      auto g = grads(w, m);
      if (m == 1 && s == 5) g[3] = std::numeric_limits<float>::infinity();
      try {
        t.step(g);
      } catch (const dc::numeric_error& e) {
        msg = e.what();
        at = s;
      }
    }
    // Refused: theta_global is the initial point, the replica reset to it.
    CHECK(t.stats().rounds == 0);
    CHECK(t.stats().rejected_rounds == 1);
    for (std::size_t i = 0; i < w.size(); ++i) CHECK(w[i] == t.global_parameters().data()[i]);
    std::lock_guard lock(mu);
    messages[static_cast<std::size_t>(m)] = msg;
    raised_at[static_cast<std::size_t>(m)] = at;
  });
  CHECK(raised_at == std::vector<int>{10, 10});
  for (const auto& msg : messages) {
    CAPTURE(msg);
    CHECK(contains(msg, "outer round 1 rejected: non-finite pseudo-gradient from rank 1 ("));
    CHECK(contains(msg, "at inner step 10"));
  }
}

// detail::gather_texts (core/agreement.hpp), through which the engine's
// start-up agreement, load()'s restore records and diloco::sharded's
// verdicts travel: each rank's text arrives exactly (its own length, NUL
// bytes and empty texts included), and a length over 16 MiB is refused on
// every rank before the texts travel.
namespace {
struct counted_gather {
  dc::comm::threads& comm;
  int calls = 0;
  std::vector<std::byte> operator()(const std::vector<std::byte>& mine) {
    ++calls;
    std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(comm.size()));
    comm.all_gather(std::span<const std::byte>(mine), std::span<std::byte>(all));
    return all;
  }
};
}  // namespace

TEST_CASE("gather_texts: every rank's text arrives exactly, empty ones and NUL bytes included") {
  const std::vector<std::string> texts{"alpha\n", "", std::string("b\0\0", 3)};
  std::mutex m;
  std::vector<std::vector<std::string>> got(3);
  std::vector<int> calls(3);
  dc::comm::threads::world world(3);
  world.run([&](dc::comm::threads& comm) {
    counted_gather g{comm};
    auto out = dc::detail::gather_texts(texts[static_cast<std::size_t>(comm.rank())], 3, g);
    std::lock_guard lock(m);
    got[static_cast<std::size_t>(comm.rank())] = std::move(out);
    calls[static_cast<std::size_t>(comm.rank())] = g.calls;
  });
  for (int r = 0; r < 3; ++r) {
    CHECK(got[static_cast<std::size_t>(r)] == texts);
    CHECK(calls[static_cast<std::size_t>(r)] == 2);  // the lengths, then the texts
  }
  CHECK(got[0][2].size() == 3);

  // Every text empty: the lengths say so, and nobody gathers again.
  world.run([&](dc::comm::threads& comm) {
    counted_gather g{comm};
    auto out = dc::detail::gather_texts(std::string(), 3, g);
    std::lock_guard lock(m);
    CHECK(out == std::vector<std::string>(3));
    CHECK(g.calls == 1);
  });
}

TEST_CASE("gather_texts: a rank announcing more than 16 MiB is named on every rank, before the texts travel") {
  std::mutex m;
  std::vector<std::string> errors(3);
  std::vector<int> calls(3);
  dc::comm::threads::world world(3);
  world.run([&](dc::comm::threads& comm) {
    counted_gather g{comm};
    const std::string text = comm.rank() == 1 ? std::string((std::size_t{1} << 24) + 1, 'x') : std::string("ok");
    std::string error;
    try {
      (void)dc::detail::gather_texts(text, 3, g);
    } catch (const dc::format_error& e) {
      error = e.what();
    }
    std::lock_guard lock(m);
    errors[static_cast<std::size_t>(comm.rank())] = error;
    calls[static_cast<std::size_t>(comm.rank())] = g.calls;
  });
  for (int r = 0; r < 3; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)].find("rank 1 announced a 16777217-byte record (at most 16 MiB expected)") !=
          std::string::npos);
    CHECK(calls[static_cast<std::size_t>(r)] == 1);
  }
}
