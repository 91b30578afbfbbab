// SPDX-License-Identifier: Apache-2.0
// At construction the ranks agree on the policies, the parameter layout and
// every option that must match, and on finite initial parameters; a
// mismatch raises on every rank naming the field and both values. Per-rank
// options (the inner optimizer's, host_threads) may differ and are reported.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <diloco/diloco.hpp>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;

namespace {

struct outcome {
  std::string kind;  // "config", "numeric", "other" or "" (no error)
  std::string what;
};

// Runs body(comm) on every rank of a world of `n`; what each rank threw.
template <class F>
std::vector<outcome> each_rank(int n, F&& body) {
  std::vector<outcome> out(static_cast<std::size_t>(n));
  dc::comm::threads::world world(n);
  world.run([&](dc::comm::threads& comm) {
    auto& o = out[static_cast<std::size_t>(comm.rank())];
    try {
      body(comm);
    } catch (const dc::config_error& e) {
      o = {"config", e.what()};
    } catch (const dc::numeric_error& e) {
      o = {"numeric", e.what()};
    } catch (const std::exception& e) {
      o = {"other", e.what()};
    }
  });
  return out;
}

// A float option as the agreement prints it: the nearest 9-digit decimal.
std::string float_text(float v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

void every_rank_raises(const std::vector<outcome>& out, const std::string& kind, const std::string& fragment) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r);
    CAPTURE(out[r].what);
    CHECK(out[r].kind == kind);
    CHECK(out[r].what.find(fragment) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("an outer learning rate that differs between ranks: every rank raises naming it and both values") {
  const auto out = each_rank(2, [](dc::comm::threads& comm) {
    std::vector<float> w(6, 0.5f);
    trainer t(w, comm, {.inner_steps = 4, .outer = {.lr = comm.rank() == 0 ? 0.7f : 0.5f}});
  });
  every_rank_raises(out, "config",
                    "'options.outer.lr' is " + float_text(0.7f) + " on rank 0 but " + float_text(0.5f) + " on rank 1");
}

TEST_CASE("H, the schedule's options and the compressor's options must agree") {
  SUBCASE("H 5 against 10 on rank 2 of 3") {
    const auto out = each_rank(3, [](dc::comm::threads& comm) {
      std::vector<float> w(6, 0.5f);
      trainer t(w, comm, {.inner_steps = comm.rank() == 2 ? 10u : 5u});
    });
    every_rank_raises(out, "config", "'options.inner_steps' is 5 on rank 0 but 10 on rank 2");
  }
  SUBCASE("streaming fragments") {
    using streaming = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads,
                                    dc::sync::streaming>;
    const auto out = each_rank(2, [](dc::comm::threads& comm) {
      std::vector<std::vector<float>> w{std::vector<float>(4, 1.0f), std::vector<float>(4, 1.0f)};
      streaming t(w, comm, {.inner_steps = 4, .sync = {.fragments = comm.rank() == 0 ? 2u : 1u}});
    });
    every_rank_raises(out, "config", "'options.sync.fragments' is 2 on rank 0 but 1 on rank 1");
  }
  SUBCASE("a different schedule type") {
    const auto out = each_rank(2, [](dc::comm::threads& comm) {
      std::vector<float> w(4, 1.0f);
      if (comm.rank() == 0) {
        dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(w, comm);
      } else {
        dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads,
                      dc::sync::one_step_delay>
            t(w, comm);
      }
    });
    every_rank_raises(out, "config",
                      std::string("'policy.sync' is ") + dc::sync::blocking::name + " on rank 0 but " +
                          dc::sync::one_step_delay::name + " on rank 1");
  }
}

TEST_CASE("a parameter layout that differs between ranks raises before the broadcast pairs tensors wrongly") {
  const auto out = each_rank(2, [](dc::comm::threads& comm) {
    std::vector<std::vector<float>> w{std::vector<float>(4, 1.0f), std::vector<float>(comm.rank() == 0 ? 3 : 2, 1.0f)};
    trainer t(w, comm);
  });
  every_rank_raises(out, "config", "'tensor.1.elements' is 3 on rank 0 but 2 on rank 1");
}

TEST_CASE("per-rank options may differ: reported, not enforced; start-up traffic is counted apart") {
  dc::comm::threads::world world(2);
  std::vector<std::vector<float>> finals(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    std::vector<float> w(6, 0.5f);
    const float lr = m == 0 ? 1e-3f : 2e-3f;
    trainer t(w, comm, {.inner_steps = 2, .inner = {.lr = lr}});
    const auto& diff = t.per_rank_options();
    REQUIRE(diff.size() == 1);
    CHECK(diff[0].name == "options.inner.lr");
    CHECK(diff[0].values == std::vector<std::string>{float_text(1e-3f), float_text(2e-3f)});
    // Setup traffic is its own count: bytes_sent holds the initial
    // broadcast alone (6 floats to the one other rank, from rank 0).
    CHECK(t.stats().setup_bytes > 0);
    CHECK(t.stats().bytes_sent == (m == 0 ? 6 * sizeof(float) : 0));
    std::vector<float> g(6);
    for (int s = 0; s < 4; ++s) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = w[i] - static_cast<float>(m + 1);
      t.step(g);
    }
    finals[static_cast<std::size_t>(m)].assign(t.global_parameters().data(), t.global_parameters().data() + 6);
  });
  CHECK(finals[0] == finals[1]);
}

TEST_CASE("a world of one exchanges nothing at start-up") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(6, 0.5f);
    trainer t(w, comm);
    CHECK(t.stats().setup_bytes == 0);
    CHECK(t.per_rank_options().empty());
  });
}

TEST_CASE("non-finite initial parameters raise numeric_error on every rank, naming tensor and index") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SUBCASE("NaN on rank 0 reaches every rank through the broadcast") {
    const auto out = each_rank(2, [&](dc::comm::threads& comm) {
      std::vector<std::vector<float>> w{std::vector<float>(4, 1.0f), std::vector<float>(5, 1.0f)};
      if (comm.rank() == 0) w[1][2] = nan;
      trainer t(w, comm);
    });
    every_rank_raises(out, "numeric", "after the broadcast from rank 0 (tensor 1 index 2 is nan)");
  }
  SUBCASE("NaN on rank 1 is overwritten by rank 0's values: no error") {
    const auto out = each_rank(2, [&](dc::comm::threads& comm) {
      std::vector<float> w(4, 1.0f);
      if (comm.rank() == 1) w[0] = nan;
      trainer t(w, comm);
      CHECK(w[0] == 1.0f);
    });
    for (const auto& o : out) CHECK(o.kind.empty());
  }
  SUBCASE("without the broadcast: Inf on rank 1, the verdict agreed so rank 0 raises too") {
    const auto out = each_rank(3, [&](dc::comm::threads& comm) {
      std::vector<std::vector<float>> w{std::vector<float>(4, 1.0f), std::vector<float>(5, 1.0f)};
      if (comm.rank() == 1) w[0][1] = inf;
      if (comm.rank() == 2) w[1][4] = -inf;
      trainer t(w, comm, {.broadcast_initial = false});
    });
    every_rank_raises(out, "numeric", "rank 1: tensor 0 index 1 is inf; rank 2: tensor 1 index 4 is -inf");
  }
  SUBCASE("a world of one") {
    const auto out = each_rank(1, [&](dc::comm::threads& comm) {
      std::vector<float> w(3, 1.0f);
      w[2] = nan;
      trainer t(w, comm);
    });
    every_rank_raises(out, "numeric", "tensor 0 index 2 is nan");
  }
}
