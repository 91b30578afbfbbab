// SPDX-License-Identifier: Apache-2.0
// Low-precision replicas (issue 40 item 2; docs/algorithms.md, "Low-precision
// replicas"): bf16 / fp16 parameter tensors under inner::external, theta_global
// and the outer state in fp32. The rounding is checked on hand-picked values;
// a blocking run of two workers follows a double-precision simulation of the
// rules written here (the anchor a = RNE(theta_global), Delta = a - theta,
// the merged value rounded to nearest even) bit for bit, on values chosen so
// that every operation is exact and the means fall on rounding ties; under
// every schedule a phase without inner progress changes nothing (Delta = 0
// exactly, no rounding drift) although theta_global is not representable in
// the replica's type; a checkpoint resumes bit for bit and is refused by an
// fp32 run; an fp16 overflow after the outer step is a numeric_error; a
// trainer with fp32 master weights keeps the merges only when it wraps the
// masters.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <diloco/diloco.hpp>
#include <diloco/tensor/low_precision.hpp>
#include <string>
#include <vector>

#include "low_precision_reference.hpp"

namespace dc = diloco;

namespace {

TEST_CASE("bfloat16 and float16 round to nearest, ties to even (hand-picked values)") {
  const auto bf = [](double x) { return static_cast<float>(dc::bfloat16::round(static_cast<float>(x))); };
  CHECK(bf(1.0) == 1.0f);
  CHECK(dc::bfloat16::round(1.0f).bits == 0x3f80);
  CHECK(bf(1.0 + std::ldexp(1.0, -8)) == 1.0f);                                     // tie: to even (1.0)
  CHECK(bf(1.0 + 3 * std::ldexp(1.0, -8)) == static_cast<float>(1.0 + std::ldexp(1.0, -6)));  // tie: up to even
  CHECK(bf(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20)) == static_cast<float>(1.0 + std::ldexp(1.0, -7)));
  CHECK(bf(-1.5) == -1.5f);
  CHECK(std::isnan(static_cast<float>(dc::bfloat16::round(std::nanf("")))));

  const auto h = [](double x) { return static_cast<float>(dc::float16::round(static_cast<float>(x))); };
  CHECK(dc::float16::round(1.0f).bits == 0x3c00);
  CHECK(h(1.0 + std::ldexp(1.0, -11)) == 1.0f);                                        // tie: to even
  CHECK(h(1.0 + 3 * std::ldexp(1.0, -11)) == static_cast<float>(1.0 + std::ldexp(1.0, -9)));  // tie: up
  CHECK(h(65519.0) == 65504.0f);
  CHECK(std::isinf(h(65520.0)));  // the tie past 65504 (odd) goes to inf
  CHECK(h(std::ldexp(1.0, -25)) == 0.0f);  // half the smallest subnormal: to even (0)
  CHECK(h(3 * std::ldexp(1.0, -25)) == static_cast<float>(std::ldexp(1.0, -23)));
  CHECK(h(std::ldexp(1.0, -24)) == static_cast<float>(std::ldexp(1.0, -24)));  // subnormal, exact
}

template <class T, class Sync = dc::sync::blocking>
using trainer = dc::algorithm<dc::inner::external, dc::outer::sgd, dc::compress::none, dc::comm::threads, Sync>;


// ------------------------------------ blocking against a double simulation
TEST_CASE("blocking with bf16 replicas follows a double-precision simulation of the rules bit for bit") {
  // Two workers, H = 2, plain averaging (test/low_precision_reference.hpp):
  // the workers' means fall on bf16 ties, which the merge rounds to even.
  namespace ref = low_precision_reference;
  constexpr int M = 2, rounds = 4;
  const ref::expected e = ref::simulate(M, rounds);
  REQUIRE(!e.out_of_binade);
  REQUIRE(e.tie_seen);    // theta_global left bf16's grid: the anchor rule is exercised
  REQUIRE(e.nudge_seen);  // and a read met a tie
  std::vector<std::vector<std::vector<double>>> got_global(M), got_replica(M);
  dc::comm::threads::world world(M);
  world.run([&](dc::comm::threads& comm) {
    const auto m = static_cast<std::size_t>(comm.rank());
    ref::run_worker<dc::bfloat16, trainer<dc::bfloat16>>(comm, rounds, got_global[m], got_replica[m]);
  });
  for (std::size_t m = 0; m < M; ++m) {
    CAPTURE(m);
    CHECK(got_global[m] == e.global);
    CHECK(got_replica[m] == e.replica);
  }
}

// --------------------------------------------- no progress, no drift
// Two phases of progress leave theta_global off the replica type's grid;
// then the workers' optimizers do nothing. Delta must be 0 exactly, so with
// outer sgd (lr 0.3, no momentum) theta_global and the replica stop moving
// once what was in flight is applied; Delta = theta_global - float(replica)
// would move theta_global 0.3 of the way to the grid every round.
template <class T, class Sync>
void no_drift(typename Sync::options sync_options, const std::string& what) {
  CAPTURE(what);
  constexpr int M = 2, H = 4, progress_rounds = 2, idle_rounds = 6;
  const std::vector<std::size_t> sizes{5, 4};
  std::vector<std::vector<float>> last_global(M), before_global(M);
  std::vector<std::vector<std::uint16_t>> last_replica(M), before_replica(M);
  bool off_grid = false;
  dc::comm::threads::world world(M);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    std::vector<std::vector<T>> w;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back();
      for (std::size_t i = 0; i < sizes[k]; ++i) w[k].push_back(T::round(0.75f + 0.0625f * static_cast<float>(i + k)));
    }
    trainer<T, Sync> t(w, comm, {.inner_steps = H, .outer = {.lr = 0.3f}, .sync = sync_options});
    auto snapshot = [&](std::vector<float>& g, std::vector<std::uint16_t>& r) {
      const auto gl = t.global_parameters();
      g.assign(gl.begin(), gl.end());
      r.clear();
      for (const auto& x : w)
        for (auto v : x) r.push_back(v.bits);
    };
    for (int s = 0; s < (progress_rounds + idle_rounds) * H; ++s) {
      if (s < progress_rounds * H)
        for (std::size_t k = 0; k < w.size(); ++k)
          for (std::size_t i = 0; i < w[k].size(); ++i)
            w[k][i] = T::round(static_cast<float>(w[k][i]) - 0.01f * static_cast<float>(m + 1) * static_cast<float>(i + 1));
      t.step();
      if (s == (progress_rounds + idle_rounds - 1) * H - 1) snapshot(before_global[static_cast<std::size_t>(m)], before_replica[static_cast<std::size_t>(m)]);
    }
    snapshot(last_global[static_cast<std::size_t>(m)], last_replica[static_cast<std::size_t>(m)]);
    if (m == 0)
      for (float x : last_global[0]) off_grid = off_grid || static_cast<float>(T::round(x)) != x;
  });
  REQUIRE(off_grid);  // drift would show
  for (int m = 0; m < M; ++m) {
    CHECK(last_global[static_cast<std::size_t>(m)] == before_global[static_cast<std::size_t>(m)]);
    CHECK(last_replica[static_cast<std::size_t>(m)] == before_replica[static_cast<std::size_t>(m)]);
  }
  CHECK(last_global[0] == last_global[1]);
}

TEST_CASE("a phase without inner progress leaves theta_global and the replica as they are, under every schedule") {
  no_drift<dc::bfloat16, dc::sync::blocking>({}, "blocking, bf16");
  no_drift<dc::float16, dc::sync::blocking>({}, "blocking, fp16");
  no_drift<dc::bfloat16, dc::sync::streaming>({.fragments = 2, .delay = 1, .alpha = 0.0f}, "streaming (alpha 0: a mix with the local value moves on by itself), bf16");
  no_drift<dc::bfloat16, dc::sync::one_step_delay>({}, "one-step delay, bf16");
  no_drift<dc::float16, dc::sync::eager>({}, "eager, fp16");
  no_drift<dc::bfloat16, dc::sync::delayed>({}, "delayed, bf16");
}

// ------------------------------------------------- fp32 master weights
// A trainer whose optimizer keeps fp32 masters and casts them into the
// model's bf16 copy after each step: wrapping the masters keeps the rounds'
// merges (after a round both workers' masters are theta_global, bit for
// bit); wrapping the bf16 copy loses them (the next cast from the unmerged
// masters overwrites the merge, and the workers' masters never meet).
TEST_CASE("with fp32 master weights, wrap the masters: wrapping the bf16 copy loses every merge") {
  constexpr int M = 2, H = 3, steps = 2 * H;
  const std::size_t n = 7;
  auto grad = [](int m, std::size_t i, int s) { return 0.05f * static_cast<float>(m + 1) - 0.01f * static_cast<float>((static_cast<int>(i) + s) % 4); };
  std::vector<std::vector<float>> masters_right(M), masters_wrong(M), global_right(M);
  dc::comm::threads::world world(M);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    for (const bool wrap_masters : {true, false}) {
      std::vector<float> master(n);
      for (std::size_t i = 0; i < n; ++i) master[i] = 0.2f + 0.1f * static_cast<float>(i);
      std::vector<dc::bfloat16> copy(n);
      auto cast = [&] {
        for (std::size_t i = 0; i < n; ++i) copy[i] = dc::bfloat16::round(master[i]);
      };
      cast();
      auto optimizer_step = [&](int s) {  // SGD on the masters, then the cast
        for (std::size_t i = 0; i < n; ++i) master[i] -= 0.1f * grad(m, i, s);
        cast();
      };
      if (wrap_masters) {
        dc::algorithm<dc::inner::external, dc::outer::sgd, dc::compress::none, dc::comm::threads> t(master, comm, {.inner_steps = H});
        for (int s = 0; s < steps; ++s) {
          optimizer_step(s);
          if (t.step()) cast();  // the merged masters reach the model's copy
        }
        masters_right[static_cast<std::size_t>(m)] = master;
        const auto g = t.global_parameters();
        global_right[static_cast<std::size_t>(m)].assign(g.begin(), g.end());
      } else {
        dc::algorithm<dc::inner::external, dc::outer::sgd, dc::compress::none, dc::comm::threads> t(copy, comm, {.inner_steps = H});
        for (int s = 0; s < steps; ++s) {
          optimizer_step(s);
          t.step();
        }
        masters_wrong[static_cast<std::size_t>(m)] = master;
      }
    }
  });
  // Wrapped masters: after the last round both workers' masters are theta_global.
  CHECK(masters_right[0] == global_right[0]);
  CHECK(masters_right[1] == global_right[1]);
  CHECK(masters_right[0] == masters_right[1]);
  // Wrapped copy: the masters never took a merge, so the workers' differ
  // by their different gradients.
  CHECK(masters_wrong[0] != masters_wrong[1]);
}

// ------------------------------------------------------- checkpoints
TEST_CASE("a bf16 replica's checkpoint resumes bit for bit, and an fp32 run refuses it") {
  constexpr int H = 2;
  const std::size_t n = 9;
  auto init = [&] {
    std::vector<dc::bfloat16> w;
    for (std::size_t i = 0; i < n; ++i) w.push_back(dc::bfloat16::round(0.3f + 0.11f * static_cast<float>(i)));
    return w;
  };
  auto train = [&](auto& t, std::vector<dc::bfloat16>& w, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (std::size_t i = 0; i < n; ++i)
        w[i] = dc::bfloat16::round(static_cast<float>(w[i]) * 0.97f + 0.013f * static_cast<float>((s + static_cast<int>(i)) % 5));
      t.step();
    }
  };
  using nesterov_trainer = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<dc::bfloat16> a = init();
    nesterov_trainer ta(a, comm, {.inner_steps = H, .outer = {.lr = 0.7f, .momentum = 0.9f}});
    train(ta, a, 0, 5);  // two rounds and one step into the third
    const std::vector<std::byte> saved = ta.save_bytes();
    train(ta, a, 5, 10);

    std::vector<dc::bfloat16> b(n, dc::bfloat16::round(9.0f));  // overwritten by load
    nesterov_trainer tb(b, comm, {.inner_steps = H, .outer = {.lr = 0.7f, .momentum = 0.9f}});
    tb.load(std::span<const std::byte>(saved));
    train(tb, b, 5, 10);
    CHECK(a == b);
    const auto ga = ta.global_parameters(), gb = tb.global_parameters();
    CHECK(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)) == 0);

    std::vector<float> f(n, 0.5f);
    nesterov_trainer tf(f, comm, {.inner_steps = H, .outer = {.lr = 0.7f, .momentum = 0.9f}});
    CHECK_THROWS_WITH_AS(tf.load(std::span<const std::byte>(saved)), doctest::Contains("replica_element"), dc::format_error);
  });
}

// ------------------------------------------------------------ elastic
// An elastic group of bf16 replicas (comm::threads, elastic): a worker
// leaves after round 2, a joiner is admitted at the end of round 3. The
// joiner's bf16 tensors are theta_global rounded to nearest even when its
// constructor returns (its replica came from theta_global), and after the
// last round every member holds the same theta_global and replicas that are
// its rounding.
TEST_CASE("bf16 replicas in an elastic group: leaves and joins keep T = RNE(theta_global) on every member") {
  using dc::comm::threads;
  using elastic_trainer = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, threads>;
  constexpr std::size_t n = 11, H = 2;
  const elastic_trainer::options o{.inner_steps = H, .outer = {.lr = 0.7f, .momentum = 0.9f}};
  auto move = [](std::vector<dc::bfloat16>& w, int id, std::size_t s) {
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = dc::bfloat16::round(static_cast<float>(w[i]) - 0.02f * static_cast<float>(id + 1) +
                                 0.01f * static_cast<float>((i + s) % 3));
  };
  auto rounded_global = [](const elastic_trainer& t, const std::vector<dc::bfloat16>& w) {
    const auto g = t.global_parameters();
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!(w[i] == dc::bfloat16::round(g[i]))) return false;
    return true;
  };
  threads::world world(3, std::chrono::seconds(60), threads::membership::elastic);
  std::mutex m;
  std::map<int, std::vector<float>> final_global;
  std::map<int, bool> final_rounded;
  bool joiner_started_rounded = false;
  world.run([&](threads& comm) {
    const int id = comm.rank();
    std::vector<dc::bfloat16> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = dc::bfloat16::round(1.0f + 0.125f * static_cast<float>(i));
    elastic_trainer t(w, comm, o);
    std::size_t step = 0;
    auto rounds = [&](elastic_trainer& tr, std::vector<dc::bfloat16>& x, int who, int count) {
      for (int r = 0; r < count; ++r)
        for (std::size_t s = 0; s < H; ++s, ++step) {
          move(x, who, step);
          REQUIRE(tr.step() == (s + 1 == H));
        }
    };
    rounds(t, w, id, 2);
    if (id == 2) {
      t.leave();
      return;
    }
    if (id == 0) {
      world.spawn([&](threads& joiner) {
        std::vector<dc::bfloat16> y(n, dc::bfloat16::round(-7.0f));  // replaced when admitted
        elastic_trainer u(y, joiner, o);
        std::size_t jstep = 0;
        const bool started = rounded_global(u, y);
        CHECK(u.world_size() == 3);
        for (int r = 0; r < 2; ++r)
          for (std::size_t s = 0; s < H; ++s, ++jstep) {
            move(y, 5, jstep);
            u.step();
          }
        const auto g = u.global_parameters();
        std::lock_guard lock(m);
        joiner_started_rounded = started;
        final_global[5].assign(g.begin(), g.end());
        final_rounded[5] = rounded_global(u, y);
      });
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (world.waiting_joiners() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      REQUIRE(world.waiting_joiners() == 1);
    }
    rounds(t, w, id, 1);  // round 3 with 0 and 1; the joiner is admitted at its end
    rounds(t, w, id, 2);  // rounds 4, 5 with the joiner
    CHECK(t.world_size() == 3);
    CHECK(t.stats().membership_changes == 2);  // the leave and the join
    const auto g = t.global_parameters();
    std::lock_guard lock(m);
    final_global[id].assign(g.begin(), g.end());
    final_rounded[id] = rounded_global(t, w);
  });
  CHECK(joiner_started_rounded);
  REQUIRE(final_global.size() == 3);
  for (const auto& entry : final_global) {
    const int id = entry.first;
    CAPTURE(id);
    CHECK(entry.second == final_global.begin()->second);
    CHECK(final_rounded[id]);
  }
}

// ------------------------------------------ the host mirror's loops
// The mirror's host passes (tensor/low_precision.hpp, mirror_host_loops:
// a loop for the rule's common cases, a second for the rest, each compiled
// for AVX2 too) against the read rule as the header states it, written
// here with std::nextafter for "c's fp32 neighbour toward T", on elements of
// every kind: untouched, moved by a few codes, reads that meet rounding ties
// (S on a midpoint), moves into a narrower binade, zeros, subnormals, inf
// and NaN; and the write (T = RNE(S), its inf count) against T::round.
template <class T>
float rule(std::uint16_t t, float s) {
  using format = typename dc::detail::low_precision_ops<T>::format;
  const std::uint16_t written = T::round(s).bits;
  if (t == written) return s;
  const float target = format::decode(t);
  const float c = target + (s - format::decode(written));
  if (T::round(c).bits == t) return c;
  const float toward = std::nextafter(c, target);
  if (T::round(toward).bits == t) return toward;
  return target;
}

template <class T>
void mirror_loops_follow_the_rule() {
  using format = typename dc::detail::low_precision_ops<T>::format;
  using loops = dc::detail::mirror_host_loops<T>;
  std::mt19937 rng(11);
  std::vector<std::uint16_t> t;
  std::vector<float> s;
  const auto code_of = [](float x) { return T::round(x).bits; };
  for (int i = 0; i < 40000; ++i) {
    // A replica code: a random sign, exponent and mantissa, the mantissa
    // often at a binade's ends.
    std::uint16_t w = static_cast<std::uint16_t>(rng());
    if (rng() % 3 == 0) w = static_cast<std::uint16_t>((w & ~0x3u) | (rng() % 2 ? 0x0u : 0x3u));
    if ((w & 0x7fffu) >= format::inf) w = static_cast<std::uint16_t>(w & 0x80ffu);  // finite mostly
    const std::uint16_t next = static_cast<std::uint16_t>(w + 1u);
    float si = format::decode(w);
    switch (rng() % 4) {
      case 0:  // S on the midpoint to the next code: a rounding tie
        if ((next & 0x7fffu) < format::inf) si = static_cast<float>((static_cast<double>(format::decode(w)) + format::decode(next)) / 2.0);
        break;
      case 1:  // S a few fp32 ulps off the code
        si = std::nextafter(si, (rng() % 2 ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity());
        break;
      case 2: {  // S anywhere between the code and the next
        if ((next & 0x7fffu) < format::inf) {
          const double u = static_cast<double>(rng() % 1000) / 1000.0;
          si = static_cast<float>(format::decode(w) + u * (static_cast<double>(format::decode(next)) - format::decode(w)));
        }
        break;
      }
      default: break;
    }
    const std::uint16_t written = code_of(si);
    // T: untouched, or moved by up to three codes (across binades too).
    const int k = static_cast<int>(rng() % 7) - 3;
    std::uint16_t ti = rng() % 4 == 0 ? written : static_cast<std::uint16_t>(written + k);
    if (((ti ^ written) & 0x8000u) != 0) ti = written;  // keep the sign
    t.push_back(ti);
    s.push_back(si);
  }
  // Specials.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float si : {0.0f, -0.0f, 1e-30f, -1e-30f, inf, -inf, nan, -nan, 1.0f})
    for (std::uint16_t ti : {std::uint16_t{0}, std::uint16_t{0x8000}, std::uint16_t{1}, std::uint16_t{0x8001},
                             format::inf, static_cast<std::uint16_t>(format::inf | 0x8000u), code_of(nan), code_of(-nan),
                             code_of(1.0f), code_of(si)}) {
      t.push_back(ti);
      s.push_back(si);
    }
  const std::size_t n = t.size();
  std::vector<T> replica(n);
  for (std::size_t i = 0; i < n; ++i) replica[i].bits = t[i];
  std::vector<float> want(n);
  bool tie = false, toward = false, target = false;
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = rule<T>(t[i], s[i]);
    const float c = format::decode(t[i]) + (s[i] - format::decode(code_of(s[i])));
    if (t[i] != code_of(s[i]) && code_of(c) != t[i]) (code_of(std::nextafter(c, format::decode(t[i]))) == t[i] ? toward : target) = true;
    tie = tie || (t[i] != code_of(s[i]) && code_of(c) != t[i]);
  }
  REQUIRE(tie);
  REQUIRE(toward);  // the rule's third case is met
  REQUIRE(target);  // and its fourth
  const auto same = [&](const std::vector<float>& got, const char* form) {
    CAPTURE(form);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      if (a != b) {
        CAPTURE(i);
        CAPTURE(t[i]);
        CAPTURE(s[i]);
        REQUIRE(a == b);
      }
    }
  };
  // Pieces of odd lengths, as the executor's pieces end at a tensor's end.
  const auto read_in_pieces = [&](auto read) {
    std::vector<float> got = s;
    for (std::size_t b = 0; b < n; b += 997) read(replica.data(), got.data(), b, std::min(n, b + 997));
    return got;
  };
  same(read_in_pieces([](const T* tt, float* ss, std::size_t b, std::size_t e) { loops::read(tt, ss, b, e); }), "portable");
  same(read_in_pieces([](const T* tt, float* ss, std::size_t b, std::size_t e) { loops::read_any(tt, ss, b, e); }), "widest");
#if defined(DILOCO_HOST_SIMD_X86)
  if (dc::kernels::host_simd::enabled())
    same(read_in_pieces([](const T* tt, float* ss, std::size_t b, std::size_t e) { loops::read_avx2(tt, ss, b, e); }), "avx2");
  else
    MESSAGE("no AVX2 here: the AVX2 loops are not run");
#endif
  // The write: every code RNE(S), the inf codes counted.
  std::size_t infinite = 0;
  for (std::size_t i = 0; i < n; ++i) infinite += (code_of(s[i]) & 0x7fffu) == format::inf ? 1u : 0u;
  REQUIRE(infinite > 0);
  const auto write_all = [&](auto write) {
    std::vector<T> out(n);
    std::size_t count = 0;
    for (std::size_t b = 0; b < n; b += 997) count += write(s.data(), out.data(), b, std::min(n, b + 997));
    CHECK(count == infinite);
    for (std::size_t i = 0; i < n; ++i)
      if (out[i].bits != code_of(s[i])) REQUIRE(out[i].bits == code_of(s[i]));
  };
  write_all([](const float* ss, T* tt, std::size_t b, std::size_t e) { return loops::write(ss, tt, b, e); });
  write_all([](const float* ss, T* tt, std::size_t b, std::size_t e) { return loops::write_any(ss, tt, b, e); });
#if defined(DILOCO_HOST_SIMD_X86)
  if (dc::kernels::host_simd::enabled())
    write_all([](const float* ss, T* tt, std::size_t b, std::size_t e) { return loops::write_avx2(ss, tt, b, e); });
#endif
}

// The loops' branch-free element math (mirror_host_loops::wide, value,
// round_wide) against the format's own functions (encode_float16's RNE, format::decode):
// every code's value, and RNE over a sweep of fp32 bit patterns plus, for
// every code, the midpoint to the next code and the fp32 values beside it
// (the ties and near-ties that decide RNE).
template <class T>
void loop_math_matches_the_format() {
  using format = typename dc::detail::low_precision_ops<T>::format;
  using loops = dc::detail::mirror_host_loops<T>;
  const auto bits = [](float x) { return dc::kernels::float_bits(x); };
  for (std::uint32_t c = 0; c < 0x10000u; ++c) {
    const auto code = static_cast<std::uint16_t>(c);
    if (loops::narrow(loops::wide(code)) != code) REQUIRE(loops::narrow(loops::wide(code)) == code);
    if (bits(loops::value(loops::wide(code))) != bits(format::decode(code)))
      REQUIRE(bits(loops::value(loops::wide(code))) == bits(format::decode(code)));
  }
  std::size_t checked = 0;
  const auto check = [&](std::uint32_t u) {
    // The general (branchy) encoder as the reference: bf16's T::round is
    // built on the wide form under test.
    const std::uint16_t want = dc::kernels::encode_float16<format>(dc::kernels::bits_float(u), -1.0f);
    const std::uint16_t got = loops::narrow(loops::round_wide(u));
    ++checked;
    if (got != want) {
      CAPTURE(u);
      REQUIRE(got == want);
    }
  };
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 2011) check(static_cast<std::uint32_t>(u));
  for (std::uint32_t c = 0; c < 0x10000u; ++c) {
    const auto code = static_cast<std::uint16_t>(c), next = static_cast<std::uint16_t>(c + 1);
    if ((code & 0x7fffu) >= format::inf || (next & 0x7fffu) > format::inf || (next & 0x8000u) != (code & 0x8000u)) continue;
    const double lo = format::decode(code), hi = (next & 0x7fffu) == format::inf ? 2.0 * lo - format::decode(static_cast<std::uint16_t>(c - 1)) : format::decode(next);
    const std::uint32_t mid = bits(static_cast<float>((lo + hi) / 2.0));
    for (std::uint32_t u : {mid - 1u, mid, mid + 1u}) check(u);
  }
  CHECK(checked > 2000000);
}

TEST_CASE("the mirror loops' branch-free element math gives the format's codes and values") {
  loop_math_matches_the_format<dc::bfloat16>();
  loop_math_matches_the_format<dc::float16>();
}

TEST_CASE("the mirror's host loops (portable and AVX2) follow the read rule and RNE on every kind of element") {
  mirror_loops_follow_the_rule<dc::bfloat16>();
  mirror_loops_follow_the_rule<dc::float16>();
}

// ------------------------------------------------------------ errors
TEST_CASE("an fp16 value beyond 65504 after the outer step is a numeric_error naming it") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<dc::float16> w{dc::float16::round(60000.0f), dc::float16::round(1.0f)};
    trainer<dc::float16> t(w, comm, {.inner_steps = 1, .outer = {.lr = 3.0f}});
    w[0] = dc::float16::round(64000.0f);  // Delta = -4000; theta_global = 60000 + 3 * 4000
    CHECK_THROWS_WITH_AS(t.step(), doctest::Contains("tensor 0 element 0 is 72000"), dc::numeric_error);
    CHECK_THROWS_WITH_AS(t.step(), doctest::Contains("beyond the range of fp16"), dc::numeric_error);
  });
}

}  // namespace
