// SPDX-License-Identifier: Apache-2.0
// Reproducible test inputs shared by the host tests and the CUDA tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

// n normal floats of standard deviation `scale`, the same for the same seed.
inline std::vector<float> random_normals(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// n floats uniform in [lo, hi), the same for the same seed everywhere.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// n floats of random sign with magnitudes m * 2^e, m uniform in [1, 2) and e
// uniform in [lo_exp, hi_exp): values spread over many binades (codec tests).
inline std::vector<float> random_values(std::size_t n, unsigned seed, float lo_exp, float hi_exp) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> e(lo_exp, hi_exp), sign(-1.0f, 1.0f), m(1.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = std::copysign(m(rng) * std::exp2(e(rng)), sign(rng));
  return v;
}
