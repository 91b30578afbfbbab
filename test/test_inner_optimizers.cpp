// SPDX-License-Identifier: Apache-2.0
// Inner optimizers against sequences computed independently, in double
// precision, from the update rules PyTorch documents for torch.optim.AdamW
// and torch.optim.SGD (and torch.nn.utils.clip_grad_norm_).
#include <doctest/doctest.h>

#include <cmath>
#include <diloco/diloco.hpp>
#include <random>
#include <vector>

namespace dc = diloco;

namespace {

constexpr double rel_tol = 1e-6;

// Parameters and gradients for `steps` steps over tensors of several sizes.
struct problem {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::vector<float>>> grads;  // [step][tensor][i]
};

problem make_problem(int steps, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> p(0.5f, 1.5f), g(-0.5f, 0.5f);
  const std::vector<std::size_t> sizes{1, 5, 33};
  problem pr;
  for (auto n : sizes) {
    pr.params.emplace_back(n);
    for (auto& v : pr.params.back()) v = p(rng);
  }
  for (int s = 0; s < steps; ++s) {
    pr.grads.emplace_back();
    for (auto n : sizes) {
      pr.grads.back().emplace_back(n);
      for (auto& v : pr.grads.back().back()) v = g(rng);
    }
  }
  return pr;
}

// PyTorch documentation, torch.optim.AdamW:
//   theta <- theta - lr*wd*theta
//   m <- b1 m + (1-b1) g ; v <- b2 v + (1-b2) g^2
//   m_hat = m/(1-b1^t) ; v_hat = v/(1-b2^t)
//   theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)
struct adamw_reference {
  double lr, b1, b2, eps, wd;
  std::vector<double> theta, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    ++t;
    m.resize(theta.size(), 0.0);
    v.resize(theta.size(), 0.0);
    for (std::size_t i = 0; i < theta.size(); ++i) {
      theta[i] -= lr * wd * theta[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(b1, t));
      const double vh = v[i] / (1 - std::pow(b2, t));
      theta[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

// PyTorch documentation, torch.optim.SGD:
//   g <- g + wd*theta ; b <- g (t = 1) or mu b + (1-tau) g
//   g <- g + mu b (nesterov) or b ; theta <- theta - lr g
struct sgd_reference {
  double lr, mu, tau, wd;
  bool nesterov;
  std::vector<double> theta, b;
  int t = 0;
  void step(const std::vector<double>& grad) {
    ++t;
    b.resize(theta.size(), 0.0);
    for (std::size_t i = 0; i < theta.size(); ++i) {
      double g = grad[i] + wd * theta[i];
      if (mu != 0) {
        b[i] = t == 1 ? g : mu * b[i] + (1 - tau) * g;
        g = nesterov ? g + mu * b[i] : b[i];
      }
      theta[i] -= lr * g;
    }
  }
};

std::vector<double> flatten(const std::vector<std::vector<float>>& ts) {
  std::vector<double> out;
  for (const auto& t : ts) out.insert(out.end(), t.begin(), t.end());
  return out;
}

// torch.nn.utils.clip_grad_norm_: total = ||g||_2 over all tensors,
// coef = max_norm / (total + 1e-6), g *= min(coef, 1).
std::vector<double> clipped(std::vector<double> g, double max_norm) {
  if (max_norm <= 0) return g;
  double sq = 0;
  for (double x : g) sq += x * x;
  const double coef = std::min(1.0, max_norm / (std::sqrt(sq) + 1e-6));
  for (double& x : g) x *= coef;
  return g;
}

void check_close(const std::vector<std::vector<float>>& got, const std::vector<double>& want, int step) {
  const auto flat = flatten(got);
  REQUIRE(flat.size() == want.size());
  for (std::size_t i = 0; i < flat.size(); ++i) {
    CAPTURE(step);
    CAPTURE(i);
    const double err = std::abs(flat[i] - want[i]) / std::abs(want[i]);
    REQUIRE(err <= rel_tol);
  }
}

// Runs `Inner` inside a one-worker algorithm whose outer round never comes,
// so only the inner optimizer touches the parameters.
template <class Inner, class Reference>
void run_against(typename Inner::options opts, Reference ref, double max_norm, int steps, unsigned seed) {
  auto pr = make_problem(steps, seed);
  ref.theta = flatten(pr.params);
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    dc::algorithm<Inner, dc::outer::sgd, dc::compress::none, dc::comm::threads> t(
        pr.params, comm, {.inner_steps = 1000, .inner = opts});
    for (int s = 0; s < steps; ++s) {
      CHECK_FALSE(t.step(pr.grads[static_cast<std::size_t>(s)]));
      ref.step(clipped(flatten(pr.grads[static_cast<std::size_t>(s)]), max_norm));
      check_close(pr.params, ref.theta, s + 1);
    }
    CHECK(t.stats().inner_steps == static_cast<std::uint64_t>(steps));
    CHECK(t.stats().rounds == 0);
  });
}

}  // namespace

TEST_CASE("AdamW matches PyTorch's documented update over 6 steps") {
  SUBCASE("DiLoCo defaults") {
    dc::inner::adamw::options o;  // lr 4e-4, betas (0.9, 0.95), wd 0.1, eps 1e-8
    run_against<dc::inner::adamw>(o, adamw_reference{4e-4, 0.9, 0.95, 1e-8, 0.1, {}, {}, {}}, 0, 6, 1);
  }
  SUBCASE("large lr, no weight decay, other betas") {
    dc::inner::adamw::options o{.lr = 0.05f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.0f};
    run_against<dc::inner::adamw>(o, adamw_reference{0.05, 0.8, 0.99, 1e-6, 0.0, {}, {}, {}}, 0, 8, 2);
  }
  SUBCASE("with global-norm clipping") {
    dc::inner::adamw::options o{.lr = 0.01f, .weight_decay = 0.05f, .max_grad_norm = 1.5f};
    run_against<dc::inner::adamw>(o, adamw_reference{0.01, 0.9, 0.95, 1e-8, 0.05, {}, {}, {}}, 1.5, 6, 3);
  }
}

TEST_CASE("SGD matches PyTorch's documented update over 6 steps") {
  SUBCASE("plain") {
    dc::inner::sgd::options o{.lr = 0.1f};
    run_against<dc::inner::sgd>(o, sgd_reference{0.1, 0, 0, 0, false, {}, {}}, 0, 6, 4);
  }
  SUBCASE("momentum and weight decay") {
    dc::inner::sgd::options o{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f};
    run_against<dc::inner::sgd>(o, sgd_reference{0.05, 0.9, 0, 0.01, false, {}, {}}, 0, 6, 5);
  }
  SUBCASE("Nesterov and weight decay") {
    dc::inner::sgd::options o{.lr = 0.05f, .momentum = 0.8f, .weight_decay = 0.02f, .nesterov = true};
    run_against<dc::inner::sgd>(o, sgd_reference{0.05, 0.8, 0, 0.02, true, {}, {}}, 0, 6, 6);
  }
  SUBCASE("momentum with dampening") {
    dc::inner::sgd::options o{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f};
    run_against<dc::inner::sgd>(o, sgd_reference{0.05, 0.9, 0.3, 0, false, {}, {}}, 0, 6, 7);
  }
  SUBCASE("Nesterov with clipping") {
    dc::inner::sgd::options o{.lr = 0.1f, .momentum = 0.9f, .nesterov = true, .max_grad_norm = 0.5f};
    run_against<dc::inner::sgd>(o, sgd_reference{0.1, 0.9, 0, 0, true, {}, {}}, 0.5, 6, 8);
  }
}

TEST_CASE("SGD with momentum follows the hand-computed sequence") {
  // lr 0.1, momentum 0.9, constant gradient 1, theta_0 = 1:
  //   b = 1, 1.9, 2.71, 3.439 ; theta = 0.9, 0.71, 0.439, 0.0951
  const dc::inner::sgd::options o{.lr = 0.1f, .momentum = 0.9f};
  float theta = 1.0f;
  float b = 0.0f;
  const double want_b[] = {1.0, 1.9, 2.71, 3.439};
  const double want_theta[] = {0.9, 0.71, 0.439, 0.0951};
  for (int t = 1; t <= 4; ++t) {
    dc::inner::sgd::make_update(o, static_cast<std::uint64_t>(t))(theta, 1.0f, &b, 1);
    CHECK(b == doctest::Approx(want_b[t - 1]).epsilon(1e-6));
    CHECK(theta == doctest::Approx(want_theta[t - 1]).epsilon(1e-5));
  }
}

TEST_CASE("AdamW's first step moves each parameter by lr against the gradient's sign") {
  // At t = 1, m_hat = g and v_hat = g^2, so the step is lr * g/(|g| + eps):
  // with wd = 0 and |g| >> eps the parameter moves by lr exactly.
  const dc::inner::adamw::options o{.lr = 0.01f, .weight_decay = 0.0f};
  float p = 2.0f;
  float state[2] = {0.0f, 0.0f};
  dc::inner::adamw::make_update(o, 1)(p, -3.0f, state, 1);
  CHECK(p == doctest::Approx(2.01).epsilon(1e-7));
  CHECK(state[0] == doctest::Approx(-0.3).epsilon(1e-7));       // (1 - 0.9) * g
  CHECK(state[1] == doctest::Approx(0.05 * 9.0).epsilon(1e-7));  // (1 - 0.95) * g^2
}
