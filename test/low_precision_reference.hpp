// SPDX-License-Identifier: Apache-2.0
#pragma once

// A double-precision simulation of sync::blocking with bf16 replicas under
// the rules of docs/algorithms.md section 6a (tensor/low_precision.hpp),
// written from the rules with its own rounding, for test_low_precision and
// the MPI and Gloo tests: M workers, plain averaging (outer sgd, lr 1),
// worker m's optimizer moves element i by move(m, i, step), a multiple of
// 2^-7 (bf16's spacing in [1, 2)), so every operation is exact in fp32 and
// in double and the workers' means fall on bf16 ties.

#include <cmath>
#include <cstddef>
#include <vector>

namespace low_precision_reference {

// The nearest multiple of `ulp` to x, ties to the even multiple.
inline double round_to_spacing(double x, double ulp) {
  const double q = x / ulp;
  const double lo = std::floor(q);
  const double rest = q - lo;
  double n = lo;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(lo, 2.0) != 0.0)) n = lo + 1.0;
  return n * ulp;
}
// bf16 in [1, 2): spacing 2^-7 (the values below stay in that binade).
inline double bf16_in_one_two(double x) { return round_to_spacing(x, 1.0 / 128.0); }

constexpr std::size_t n = 6;  // elements
constexpr int H = 2;          // inner steps per round
constexpr double u = 1.0 / 128.0;

// Worker m's move of element i at inner step `step`: -1, 0 or +1 spacing.
inline double move(int m, std::size_t i, int step) {
  return static_cast<double>((m + static_cast<int>(i) + step) % 3 - 1) * u;
}
inline std::vector<double> start() {
  std::vector<double> s(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = 1.5 + static_cast<double>(i) * u;
  return s;
}

struct expected {
  std::vector<std::vector<double>> global, replica;  // after each round (replica: every worker's)
  bool tie_seen = false;    // theta_global left bf16's grid
  bool nudge_seen = false;  // a read met a tie and moved one fp32 ulp
  bool out_of_binade = false;  // a value left [1, 2): the simulation does not hold
};

// theta_g, each worker's replica T and the library's fp32 mirror S of it:
// the round's read (the first pass of a call that touches the replica:
// under sync::blocking only the round's step) sets S = T + (S - RNE(S))
// where T moved, one fp32 ulp toward T where that sum is a tie RNE sends
// away from T.
inline expected simulate(int M, int rounds) {
  expected out;
  std::vector<double> g = start();
  std::vector<std::vector<double>> rep(static_cast<std::size_t>(M), g), mir(static_cast<std::size_t>(M), g);
  auto in_binade = [&](double x) {
    if (x < 1.0 || x >= 2.0) out.out_of_binade = true;
  };
  int step = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int s = 0; s < H; ++s, ++step)
      for (std::size_t m = 0; m < static_cast<std::size_t>(M); ++m)
        for (std::size_t i = 0; i < n; ++i) {
          rep[m][i] += move(static_cast<int>(m), i, step);
          in_binade(rep[m][i]);
        }
    // The round's read of the mirror (the first pass of the call that reads it).
    for (std::size_t m = 0; m < static_cast<std::size_t>(M); ++m)
        for (std::size_t i = 0; i < n; ++i) {
          const double written = bf16_in_one_two(mir[m][i]);
          if (rep[m][i] == written) continue;
          double c = rep[m][i] + (mir[m][i] - written);
          if (bf16_in_one_two(c) != rep[m][i]) {
            c += (rep[m][i] > c ? 1.0 : -1.0) * std::ldexp(1.0, -23);  // an fp32 ulp in [1, 2)
            out.nudge_seen = true;
          }
          mir[m][i] = c;
        }
    for (std::size_t i = 0; i < n; ++i) {
      double mean = 0.0;
      for (std::size_t m = 0; m < static_cast<std::size_t>(M); ++m) mean += (g[i] - mir[m][i]) / M;
      // Every term is exact in double; theta_global is fp32, so the update
      // is rounded once, to nearest even (a mean of two nudged values can
      // fall half an fp32 ulp between two floats).
      g[i] = static_cast<double>(static_cast<float>(g[i] - mean));
      in_binade(g[i]);
      out.tie_seen = out.tie_seen || bf16_in_one_two(g[i]) != g[i];
      for (std::size_t m = 0; m < static_cast<std::size_t>(M); ++m) {
        mir[m][i] = g[i];
        rep[m][i] = bf16_in_one_two(g[i]);
      }
    }
    out.global.push_back(g);
    out.replica.push_back(rep[0]);
  }
  return out;
}

// One worker's run with the library (Trainer: outer::sgd at its defaults,
// inner::external, blocking) over any communicator: theta_global and
// the replica (as doubles) after each round.
template <class T, class Trainer, class Comm>
void run_worker(Comm& comm, int rounds, std::vector<std::vector<double>>& global, std::vector<std::vector<double>>& replica) {
  const int m = comm.rank();
  std::vector<T> w;
  for (double v : start()) w.push_back(T::round(static_cast<float>(v)));
  Trainer t(w, comm, {.inner_steps = H});
  for (int s = 0; s < rounds * H; ++s) {
    for (std::size_t i = 0; i < n; ++i) w[i] = T::round(static_cast<float>(w[i]) + static_cast<float>(move(m, i, s)));
    if (t.step()) {
      const auto gl = t.global_parameters();
      global.emplace_back(gl.begin(), gl.end());
      std::vector<double> wr;
      for (auto x : w) wr.push_back(static_cast<float>(x));
      replica.push_back(wr);
    }
  }
}

}  // namespace low_precision_reference
