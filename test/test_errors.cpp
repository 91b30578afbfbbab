// SPDX-License-Identifier: Apache-2.0
// Bad input gives a clear exception; a non-finite pseudo-gradient rejects
// the round and leaves theta_global as it was.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <limits>
#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;

namespace {
// Runs body on a one-worker world and reports what it threw.
template <class F>
void solo(F&& body) {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) { body(comm); });
}
}  // namespace

TEST_CASE("mismatched parameter and gradient sizes are config errors") {
  solo([](dc::comm::threads& comm) {
    std::vector<std::vector<float>> params{std::vector<float>(4), std::vector<float>(3)};
    trainer t(params, comm);
    std::vector<std::vector<float>> wrong_size{std::vector<float>(4), std::vector<float>(2)};
    CHECK_THROWS_WITH_AS(t.step(wrong_size), doctest::Contains("gradient 1 has 2 elements, parameter 1 has 3"),
                         dc::config_error);
    std::vector<std::vector<float>> wrong_count{std::vector<float>(4)};
    CHECK_THROWS_WITH_AS(t.step(wrong_count), doctest::Contains("got 1 gradient tensors, expected 2"),
                         dc::config_error);
    CHECK(t.stats().inner_steps == 0);
  });
}

TEST_CASE("bad options are config errors naming the option") {
  solo([](dc::comm::threads& comm) {
    std::vector<float> w(4);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.inner_steps = 0}), doctest::Contains("inner_steps (H) must be at least 1"),
                         dc::config_error);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.inner = {.lr = -1e-3f}}), doctest::Contains("adamw: lr must be"),
                         dc::config_error);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.outer = {.lr = -0.7f}}), doctest::Contains("outer nesterov: lr must be"),
                         dc::config_error);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.outer = {.momentum = 0.0f}}),
                         doctest::Contains("Nesterov momentum requires momentum > 0"), dc::config_error);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.inner = {.beta1 = 1.0f}}), doctest::Contains("adamw: beta1 must lie in [0, 1)"),
                         dc::config_error);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.inner = {.lr = std::numeric_limits<float>::quiet_NaN()}}),
                         doctest::Contains("adamw: lr must be a finite number"), dc::config_error);
    using sgd_trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::threads>;
    CHECK_THROWS_WITH_AS(sgd_trainer(w, comm, {.inner = {.lr = -0.1f}}), doctest::Contains("inner sgd: lr must be"),
                         dc::config_error);
    CHECK_THROWS_WITH_AS(sgd_trainer(w, comm, {.inner = {.lr = 0.1f, .nesterov = true}}),
                         doctest::Contains("Nesterov momentum requires momentum > 0"), dc::config_error);
    std::vector<float> empty;
    CHECK_THROWS_WITH_AS(trainer(empty, comm), doctest::Contains("parameter list is empty"), dc::config_error);
    int not_a_stream = 0;
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.device_stream = &not_a_stream}),
                         doctest::Contains("device_stream is set but the parameters are host tensors"),
                         dc::config_error);
  });
}

// The momenta's documented range, [0, 1) ((0, 1) for Nesterov), is enforced:
// at 1 or more the buffer never forgets and grows without bound.
TEST_CASE("a momentum of 1 or more is a config error naming the value and the range") {
  solo([](dc::comm::threads& comm) {
    std::vector<float> w(4);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.outer = {.momentum = 1.0f}}),
                         doctest::Contains("outer nesterov: momentum must lie in [0, 1), got 1"), dc::config_error);
    CHECK_THROWS_WITH_AS(trainer(w, comm, {.outer = {.momentum = 1.5f}}),
                         doctest::Contains("outer nesterov: momentum must lie in [0, 1), got 1.5"), dc::config_error);
    using sgd_trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::threads>;
    CHECK_THROWS_WITH_AS(sgd_trainer(w, comm, {.inner = {.lr = 0.1f, .momentum = 7.0f}}),
                         doctest::Contains("inner sgd: momentum must lie in [0, 1), got 7"), dc::config_error);
    CHECK_THROWS_WITH_AS(sgd_trainer(w, comm, {.outer = {.momentum = 1.0f}}),
                         doctest::Contains("outer sgd: momentum must lie in [0, 1), got 1"), dc::config_error);
    CHECK_THROWS_WITH_AS(sgd_trainer(w, comm, {.inner = {.lr = 0.1f, .momentum = -0.5f}}),
                         doctest::Contains("inner sgd: momentum must be a finite number >= 0, got -0.5"),
                         dc::config_error);
    CHECK_THROWS_WITH_AS(sgd_trainer(w, comm, {.inner = {.lr = 0.1f, .momentum = std::numeric_limits<float>::infinity()}}),
                         doctest::Contains("inner sgd: momentum must be a finite number >= 0, got inf"),
                         dc::config_error);
    // Just below 1 is still accepted, as is 0 where no Nesterov is asked for.
    CHECK_NOTHROW(trainer(w, comm, {.outer = {.momentum = 0.999f}}));
    CHECK_NOTHROW(sgd_trainer(w, comm, {.inner = {.lr = 0.1f, .momentum = 0.99f}, .outer = {.momentum = 0.0f}}));
  });
}

TEST_CASE("zero workers is a config error") {
  CHECK_THROWS_WITH_AS(dc::comm::threads::world(0), doctest::Contains("needs at least 1 worker, got 0"),
                       dc::config_error);
}

TEST_CASE("tensors in the wrong memory space are a config error") {
  solo([](dc::comm::threads& comm) {
    std::vector<float> w(4);
    trainer t(w, comm);
    float fake = 0.0f;
    dc::tensor_view<const float, dc::device_space> device_grad(&fake, 4);
    CHECK_THROWS_WITH_AS(t.step(device_grad), doctest::Contains("tensors in device memory passed to an algorithm"),
                         dc::config_error);
  });
}

TEST_CASE("a NaN or Inf pseudo-gradient rejects the round and leaves theta_global unchanged") {
  constexpr int workers = 4;
  constexpr std::size_t n = 10;
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(poison);
    dc::comm::threads::world world(workers);
    world.run([&](dc::comm::threads& comm) {
      std::vector<float> w(n, 1.0f);
      trainer t(w, comm, {.inner_steps = 2, .inner = {.lr = 0.01f}});
      std::vector<float> g(n, 0.5f);
      // One good round first, so there is outer state to protect.
      CHECK_FALSE(t.step(g));
      CHECK(t.step(g));
      const auto global = t.global_parameters();
      const std::vector<float> before(global.data(), global.data() + n);

      std::vector<float> bad = g;
      if (comm.rank() == 2) bad[7] = poison;
      CHECK_FALSE(t.step(bad));
      CHECK_THROWS_WITH_AS(t.step(g), doctest::Contains("non-finite pseudo-gradient from rank 2"),
                           dc::numeric_error);
      CHECK(std::memcmp(global.data(), before.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(w.data(), before.data(), n * sizeof(float)) == 0);  // replica reset to theta_global
      CHECK(t.stats().rounds == 1);
      CHECK(t.stats().rejected_rounds == 1);
      CHECK(t.steps_in_round() == 0);

      // A NaN may sit in AdamW's moments now; after resetting them training
      // goes on.
      t.reset_inner_state();
      CHECK_FALSE(t.step(g));
      CHECK(t.step(g));
      CHECK(t.stats().rounds == 2);
      for (float v : w) CHECK(std::isfinite(v));
    });
  }
}

TEST_CASE("a rejected round reports an Inf pseudo-gradient's norm as inf and a NaN one as nan, never -nan") {
  constexpr std::size_t n = 300;  // more than one int8 block
  // Rank 1's gradient holds +Inf at index 7. Inner SGD moves the parameter
  // to -Inf, so the pseudo-gradient holds +Inf and its norm is inf. AdamW
  // computes m / sqrt(v) = inf / inf = NaN (sign bit set on x86, which
  // printf wrote as "-nan"), so its pseudo-gradient holds NaN.
  auto message = [&]<class Inner, class Compressor>(Inner, Compressor) {
    std::string text;
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      std::vector<float> w(n, 1.0f);
      dc::algorithm<Inner, dc::outer::nesterov, Compressor, dc::comm::threads> t(w, comm, {.inner_steps = 2});
      std::vector<float> g(n, 0.5f);
      CHECK_FALSE(t.step(g));
      CHECK(t.step(g));
      std::vector<float> bad = g;
      if (comm.rank() == 1) bad[7] = std::numeric_limits<float>::infinity();
      CHECK_FALSE(t.step(bad));
      try {
        t.step(g);
      } catch (const dc::numeric_error& e) {
        if (comm.rank() == 0) text = e.what();
      }
    });
    return text;
  };
  const std::string nan_tail = "(norm nan: the pseudo-gradient holds NaN, from a NaN gradient or an Inf one";
  for (const std::string& m : {message(dc::inner::sgd{}, dc::compress::none{}),
                               message(dc::inner::sgd{}, dc::compress::blockwise<dc::int8>{})}) {
    CAPTURE(m);
    CHECK(m.find("non-finite pseudo-gradient from rank 1 (norm inf)") != std::string::npos);
  }
  for (const std::string& m : {message(dc::inner::adamw{}, dc::compress::none{}),
                               message(dc::inner::adamw{}, dc::compress::blockwise<dc::int8>{})}) {
    CAPTURE(m);
    CHECK(m.find("non-finite pseudo-gradient from rank 1 " + nan_tail) != std::string::npos);
    CHECK(m.find("-nan") == std::string::npos);
  }
  // Any NaN a message quotes is written without a sign.
  CHECK(dc::detail::concat(-std::numeric_limits<double>::quiet_NaN(), " ", std::numeric_limits<float>::quiet_NaN(), " ",
                           -std::numeric_limits<float>::infinity()) == "nan nan -inf");
}

TEST_CASE("a NaN pseudo-gradient in a world of one is rejected too") {
  solo([](dc::comm::threads& comm) {
    std::vector<float> w(3, 1.0f);
    trainer t(w, comm, {.inner_steps = 1});
    std::vector<float> g{0.1f, std::numeric_limits<float>::quiet_NaN(), 0.2f};
    CHECK_THROWS_AS(t.step(g), dc::numeric_error);
    for (float v : w) CHECK(v == 1.0f);
    CHECK(t.global_parameters()[1] == 1.0f);
  });
}
