// Two threads (OMP_NUM_THREADS) reading two float streams (read2: sum of (d - e)^2) and one
// (read1) against STREAM triad over arrays of 2^24 floats, best of 9 each, three rounds.
//   g++ -O3 -march=x86-64 -fopenmp -ffast-math read_bandwidth.cpp
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <omp.h>
int main() {
  const size_t n = 1u << 24;
  std::vector<float> a(n, 1.f), b(n, 2.f), c(n, 3.f), d(n, 0.5f), e(n, 0.25f), f(n, 0.1f);
  auto t = [&](auto fn) { double best = 1e9; for (int r = 0; r < 9; ++r) { auto t0 = std::chrono::steady_clock::now(); fn(); double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); best = std::min(best, s);} return best; };
  volatile float sink;
  for (int rep = 0; rep < 3; ++rep) {
  double tt = t([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.f * c[i]; });
  double tr = t([&] { float s = 0;
#pragma omp parallel for schedule(static) reduction(+:s)
    for (size_t i = 0; i < n; ++i) s += (d[i] - e[i]) * (d[i] - e[i]); sink = s; });
  double tr1 = t([&] { float s = 0;
#pragma omp parallel for schedule(static) reduction(+:s)
    for (size_t i = 0; i < n; ++i) s += f[i]; sink = s; });
  std::printf("triad %.1f GB/s  read2 %.1f GB/s (ratio %.2f)  read1 %.1f (ratio %.2f)\n", 12.0 * n / tt / 1e9, 8.0 * n / tr / 1e9, (8.0 * n / tr) / (12.0 * n / tt), 4.0*n/tr1/1e9, (4.0 * n / tr1) / (12.0 * n / tt));
  }
}
