// SPDX-License-Identifier: Apache-2.0
#pragma once

// The compressed mean's error bounds, derived from each codec's definition,
// and the per-rank pseudo-gradients they are checked on. Shared by the
// threads test (test_compressed_mean.cpp) and the MPI test
// (test_compressed_mean_mpi.cpp), so both check the same numbers.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace compressed_mean_bounds {

const std::vector<std::size_t> sizes{1, 37, 300, 129};
constexpr std::size_t B = 128;

// Rank r's pseudo-gradient for tensor t: unit normals scaled per tensor, so
// blocks of different magnitudes meet in the mean.
inline std::vector<std::vector<float>> deltas(int r, unsigned salt) {
  std::mt19937 rng(static_cast<unsigned>(r) * 1000u + salt);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<std::vector<float>> g;
  float scale = 1.0f;
  for (auto n : sizes) {
    g.emplace_back(n);
    for (auto& x : g.back()) x = scale * n01(rng);
    scale *= 0.01f;
  }
  return g;
}

// Block-wise bound, from the definition: stage 1 adds at most
// (1/M) sum_r amax_b(delta_r) / L / 2 to each element of the mean, stage 2
// at most amax_b(stage-1 mean) / L / 2 <= (amax_b(mean) + stage-1 bound) / L / 2.
inline void check_blockwise(int m, unsigned salt, const std::vector<std::vector<float>>& got, float levels) {
  std::vector<std::vector<std::vector<float>>> d;
  for (int r = 0; r < m; ++r) d.push_back(deltas(r, salt));
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t b0 = 0; b0 < sizes[t]; b0 += B) {
      const std::size_t b1 = std::min(sizes[t], b0 + B);
      double stage1 = 0.0, mean_amax = 0.0;
      for (int r = 0; r < m; ++r) {
        double amax = 0.0;
        for (std::size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(static_cast<double>(d[static_cast<std::size_t>(r)][t][i])));
        stage1 += amax / levels / 2.0 / m;
      }
      std::vector<double> mean(b1 - b0, 0.0);
      for (std::size_t i = b0; i < b1; ++i) {
        for (int r = 0; r < m; ++r) mean[i - b0] += d[static_cast<std::size_t>(r)][t][i];
        mean[i - b0] /= m;
        mean_amax = std::max(mean_amax, std::fabs(mean[i - b0]));
      }
      const double stage2 = (mean_amax + stage1) / levels / 2.0;
      for (std::size_t i = b0; i < b1; ++i) {
        const double err = std::fabs(-static_cast<double>(got[t][i]) - mean[i - b0]);
        CAPTURE(t);
        CAPTURE(i);
        REQUIRE(err <= (stage1 + stage2) * (1 + 1e-5) + 1e-6 * mean_amax);
      }
    }
  }
}

// The `levels` for check_blockwise of each block-wise format: its largest
// half gap, amax / levels / 2, from the format's definition. Integers:
// a gap of amax / L. int2's levels are 2 amax / 3 apart. Small floats: the
// widest gap is the top binade's, 2^(emax - M) at the block's scale
// amax / max: fp8_e4m3 32 / 448 = 1 / 14, fp8_e5m2 8192 / 57344 = 1 / 7,
// fp4_e3m0 8 / 16 = 1 / 2.
template <class Format>
constexpr float bound_levels() {
  if constexpr (requires { Format::mantissa_bits; })
    return Format::exponent_bits == 4 ? 14.0f : Format::exponent_bits == 5 ? 7.0f : 2.0f;
  else if constexpr (Format::bits == 2)
    return 1.5f;
  else
    return Format::levels;
}

// Cast bound: half an ulp of a p-bit mantissa is at most |x| 2^-(p+1), at
// each of the two stages (plus fp16's subnormal spacing 2^-24 / 2).
inline void check_cast(int m, unsigned salt, const std::vector<std::vector<float>>& got, int p, double tiny) {
  std::vector<std::vector<std::vector<float>>> d;
  for (int r = 0; r < m; ++r) d.push_back(deltas(r, salt));
  const double h = std::ldexp(1.0, -(p + 1));
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      double mean = 0.0, abs_mean = 0.0;
      for (int r = 0; r < m; ++r) {
        mean += d[static_cast<std::size_t>(r)][t][i];
        abs_mean += std::fabs(static_cast<double>(d[static_cast<std::size_t>(r)][t][i]));
      }
      mean /= m;
      abs_mean /= m;
      const double stage1 = abs_mean * h + tiny;
      const double stage2 = (std::fabs(mean) + stage1) * h + tiny;
      CAPTURE(t);
      CAPTURE(i);
      REQUIRE(std::fabs(-static_cast<double>(got[t][i]) - mean) <= (stage1 + stage2) * (1 + 1e-5) + 1e-7 * abs_mean);
    }
  }
}

}  // namespace compressed_mean_bounds
