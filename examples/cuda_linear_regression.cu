// SPDX-License-Identifier: Apache-2.0
// DiLoCo on one GPU with device tensors: 4 workers (threads of this
// process) each fit a linear model to their own shard of data that lives in
// device memory. Parameters, gradients, optimizer state and the outer
// state all stay on the GPU; the only difference from host code is the
// tensor type (thrust::device_vector<float>) and the header
// (<diloco/cuda.hpp>). Gradients come from two user functors run by the
// library's CUDA launcher.
//
// Without a GPU it says so and exits 0.
#include <diloco/cuda.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <thrust/device_vector.h>
#include <vector>

namespace dc = diloco;

namespace {

constexpr int workers = 4;
constexpr std::size_t features = 37;
constexpr std::size_t rows = 2048;  // per worker
constexpr int rounds = 40;
constexpr std::size_t inner_steps = 25;

float* raw(thrust::device_vector<float>& v) { return thrust::raw_pointer_cast(v.data()); }
const float* raw(const thrust::device_vector<float>& v) { return thrust::raw_pointer_cast(v.data()); }

// residual_r = x_r . w + b - y_r, one thread per row.
struct residuals {
  const float* x;
  const float* w;
  const float* b;
  const float* y;
  float* out;
  DILOCO_HD void operator()(std::size_t r) const {
    float s = b[0] - y[r];
    for (std::size_t j = 0; j < features; ++j) s += x[r * features + j] * w[j];
    out[r] = s;
  }
};

// Gradient of the mean squared error / 2: one thread per weight, plus one
// for the bias (j == features).
struct gradient {
  const float* x;
  const float* res;
  float* gw;
  float* gb;
  DILOCO_HD void operator()(std::size_t j) const {
    float s = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) s += res[r] * (j < features ? x[r * features + j] : 1.0f);
    (j < features ? gw[j] : gb[0]) = s / static_cast<float>(rows);
  }
};

struct squared {
  const float* v;
  DILOCO_HD float operator()(std::size_t i) const { return v[i] * v[i]; }
};

}  // namespace

int main() {
  if (dc::cuda_device_count() == 0) {
    std::printf("no GPU: this example needs a CUDA device; nothing to do\n");
    return 0;
  }

  // The true model and each worker's noisy shard, made on the host.
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> w_true(features);
  for (auto& v : w_true) v = n01(rng);
  const float b_true = 0.5f;
  std::vector<std::vector<float>> xs(workers, std::vector<float>(rows * features)), ys(workers, std::vector<float>(rows));
  for (int m = 0; m < workers; ++m)
    for (std::size_t r = 0; r < rows; ++r) {
      float s = b_true;
      for (std::size_t j = 0; j < features; ++j) {
        // Each worker sees a shifted input distribution (non-i.i.d. shards).
        const float x = n01(rng) + 0.5f * static_cast<float>(m);
        xs[m][r * features + j] = x;
        s += x * w_true[j];
      }
      ys[m][r] = s + 0.01f * n01(rng);
    }

  std::vector<float> w_final(features), b_final(1);
  std::vector<double> loss_final(workers);
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const auto m = static_cast<std::size_t>(comm.rank());
    const thrust::device_vector<float> x(xs[m].begin(), xs[m].end()), y(ys[m].begin(), ys[m].end());
    thrust::device_vector<float> res(rows);
    // The model: two device tensors, and their gradients.
    std::vector<thrust::device_vector<float>> params{thrust::device_vector<float>(features, 0.0f),
                                                     thrust::device_vector<float>(1, 0.0f)};
    std::vector<thrust::device_vector<float>> grads{thrust::device_vector<float>(features),
                                                    thrust::device_vector<float>(1)};

    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads> trainer(
        params, comm, {.inner_steps = inner_steps, .inner = {.lr = 0.02f, .weight_decay = 0.0f}});

    dc::exec::cuda gpu;
    auto loss = [&] {
      gpu.for_each(rows, residuals{raw(x), raw(params[0]), raw(params[1]), raw(y), raw(res)});
      return 0.5 * gpu.transform_reduce(rows, squared{raw(res)}) / rows;
    };
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t s = 0; s < inner_steps; ++s) {
        gpu.for_each(rows, residuals{raw(x), raw(params[0]), raw(params[1]), raw(y), raw(res)});
        gpu.for_each(features + 1, gradient{raw(x), raw(res), raw(grads[0]), raw(grads[1])});
        trainer.step(grads);  // the outer round runs on the 25th step
      }
      if (m == 0 && (round % 10 == 0 || round == rounds - 1))
        std::printf("round %3d: loss on worker 0's shard %.6f, %llu bytes sent so far\n", round + 1, loss(),
                    static_cast<unsigned long long>(trainer.stats().bytes_sent));
    }
    loss_final[m] = loss();
    if (m == 0) {
      thrust::copy(params[0].begin(), params[0].end(), w_final.begin());
      thrust::copy(params[1].begin(), params[1].end(), b_final.begin());
    }
  });

  float max_err = std::fabs(b_final[0] - b_true);
  for (std::size_t j = 0; j < features; ++j) max_err = std::fmax(max_err, std::fabs(w_final[j] - w_true[j]));
  std::printf("max |w - w_true| = %.5f\n", static_cast<double>(max_err));
  const bool converged = max_err < 0.05f;
  std::printf("converged: %s\n", converged ? "yes" : "no");
  return converged ? 0 : 1;
}
