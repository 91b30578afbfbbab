// SPDX-License-Identifier: Apache-2.0
#pragma once

// The linear-regression problem the algorithm tests share (threads in
// test_algorithm.cpp, MPI in test_algorithm_mpi.cpp): each worker fits
// y = X w* + noise on its own rows, and a reference implementation of the
// algorithm's definition in double precision, written with plain loops.

#include <cstddef>
#include <random>
#include <vector>

namespace linear_regression {

constexpr std::size_t features = 6;
constexpr std::size_t rows = 16;  // per worker


// Worker m's data: y = X w* + noise, a different X per worker; the same in
// every process (fixed seed).
struct dataset {
  std::vector<std::vector<double>> x;  // [worker][row * features + j]
  std::vector<std::vector<double>> y;  // [worker][row]
};

inline dataset make_data(int workers) {
  std::mt19937 rng(123);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<double> w_star(features);
  for (auto& w : w_star) w = n01(rng);
  dataset d;
  for (int m = 0; m < workers; ++m) {
    d.x.emplace_back(rows * features);
    d.y.emplace_back(rows);
    for (auto& v : d.x.back()) v = static_cast<float>(n01(rng));
    for (std::size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::size_t j = 0; j < features; ++j) s += d.x.back()[r * features + j] * w_star[j];
      d.y.back()[r] = static_cast<float>(s + 0.1 * n01(rng));
    }
  }
  return d;
}

// Gradient of (1 / 2 rows) ||X w - y||^2 for worker m, in double.
template <class W>
inline std::vector<double> gradient(const dataset& d, int m, const W& w) {
  std::vector<double> g(features, 0.0);
  const auto& x = d.x[static_cast<std::size_t>(m)];
  const auto& y = d.y[static_cast<std::size_t>(m)];
  for (std::size_t r = 0; r < rows; ++r) {
    double pred = 0;
    for (std::size_t j = 0; j < features; ++j) pred += x[r * features + j] * static_cast<double>(w[j]);
    const double err = pred - y[r];
    for (std::size_t j = 0; j < features; ++j) g[j] += err * x[r * features + j] / rows;
  }
  return g;
}

// The algorithm's definition in double: M replicas with SGD-momentum, every
// H steps the mean pseudo-gradient drives a Nesterov step on theta_global.
inline std::vector<std::vector<double>> reference_rounds(const dataset& d, int workers, int rounds, int h, double inner_lr,
                                                  double inner_mu, double outer_lr, double outer_mu) {
  std::vector<double> global(features, 0.0), outer_b(features, 0.0);
  std::vector<std::vector<double>> local(workers, global), inner_b(workers, std::vector<double>(features, 0.0));
  std::vector<std::vector<double>> out;
  int inner_t = 0;
  for (int round = 1; round <= rounds; ++round) {
    for (int s = 0; s < h; ++s) {
      ++inner_t;
      for (int m = 0; m < workers; ++m) {
        auto& w = local[static_cast<std::size_t>(m)];
        auto& b = inner_b[static_cast<std::size_t>(m)];
        const auto g = gradient(d, m, w);
        for (std::size_t j = 0; j < features; ++j) {
          b[j] = inner_t == 1 ? g[j] : inner_mu * b[j] + g[j];
          w[j] -= inner_lr * b[j];
        }
      }
    }
    for (std::size_t j = 0; j < features; ++j) {
      double delta = 0;
      for (int m = 0; m < workers; ++m) delta += global[j] - local[static_cast<std::size_t>(m)][j];
      delta /= workers;
      outer_b[j] = round == 1 ? delta : outer_mu * outer_b[j] + delta;
      global[j] -= outer_lr * (delta + outer_mu * outer_b[j]);
    }
    for (auto& w : local) w = global;
    out.push_back(global);
  }
  return out;
}

}  // namespace linear_regression
