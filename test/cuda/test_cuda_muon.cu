// SPDX-License-Identifier: Apache-2.0
// inner::muon's device path (inner/muon_cuda.hpp: element passes on the
// stream, cuBLAS SGEMMs for Newton-Schulz) against its host path, which
// test_muon.cpp checks against Muon written with libtorch ops. The two sum
// in different orders (cuBLAS fp32 against the host's double
// accumulation), so they agree to rounding, not to the bit. Without a GPU
// this file still has to compile under nvcc, and the program exits 77.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <diloco/cuda.hpp>
#include <diloco/inner/muon_cuda.hpp>
#include <random>
#include <vector>

namespace dc = diloco;

namespace {

struct shape {
  std::size_t rows, cols;
};
// Wide, tall (transposed on the device as on the host), square, a vector, 1 x n (AdamW).
const std::vector<shape> shapes{{8, 16}, {24, 6}, {10, 10}, {7, 1}, {1, 5}};

std::vector<float> random_values(std::size_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace

TEST_CASE("gpu: optimizer<inner::muon, exec::cuda> follows optimizer<inner::muon> on the host") {
  const dc::inner::muon::options opts{.lr = 0.02f, .weight_decay = 0.1f, .adamw_lr_scale = 0.05f,
                                      .max_grad_norm = 5.0f};
  std::vector<std::vector<float>> host_p, start;
  std::vector<dc::buffer<float, dc::device_space>> dev_p, dev_g;
  std::vector<dc::matrix_view<float>> host_views;
  std::vector<dc::matrix_view<float, dc::device_space>> dev_views, dev_grad_views;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const std::size_t n = shapes[k].rows * shapes[k].cols;
    host_p.push_back(random_values(n, static_cast<unsigned>(k), 0.02f));
    dev_p.emplace_back(n);
    dev_g.emplace_back(n);
  }
  start = host_p;
  dc::exec::cuda exec;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    exec.from_host(dev_p[k].data(), host_p[k].data(), host_p[k].size());
    host_views.emplace_back(host_p[k].data(), shapes[k].rows, shapes[k].cols);
    dev_views.emplace_back(dev_p[k].data(), shapes[k].rows, shapes[k].cols);
    dev_grad_views.emplace_back(dev_g[k].data(), shapes[k].rows, shapes[k].cols);
  }
  dc::optimizer<dc::inner::muon> host_opt(host_views, opts);
  dc::optimizer<dc::inner::muon, dc::exec::cuda> dev_opt(dev_views, opts);
  for (unsigned s = 0; s < 5; ++s) {
    std::vector<std::vector<float>> g;
    std::vector<dc::matrix_view<float>> g_views;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      g.push_back(random_values(host_p[k].size(), 100 + 10 * s + static_cast<unsigned>(k), 1.0f));
      exec.from_host(dev_g[k].data(), g.back().data(), g.back().size());
    }
    for (std::size_t k = 0; k < shapes.size(); ++k) g_views.emplace_back(g[k].data(), shapes[k].rows, shapes[k].cols);
    host_opt.step(g_views);
    dev_opt.step(dev_grad_views);
  }
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    CAPTURE(k);
    std::vector<float> dev(host_p[k].size());
    exec.to_host(dev.data(), dev_p[k].data(), dev.size());
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < dev.size(); ++i) {
      const double want = static_cast<double>(host_p[k][i]) - start[k][i];
      diff = std::max(diff, std::abs(static_cast<double>(dev[i]) - start[k][i] - want));
      scale = std::max(scale, std::abs(want));
    }
    CHECK(scale > 0.0);
    CHECK(diff / scale < 1e-5);
  }
}
