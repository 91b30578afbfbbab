// SPDX-License-Identifier: Apache-2.0
// docs/guide.md's GPU section as a user writes it: <diloco/cuda.hpp>, device
// tensors (thrust::device_vector), the same algorithm and calls as on the
// host: AdamW uncompressed, and (SGD inner) int4 with error feedback. Four
// workers fit w = 1.5 on their own device vectors (the gradient of
// |w - 1.5|^2 / 2 is w - 1.5). Simulated in double from the update rules,
// 40 rounds of H = 10 leave |w - 1.5| at 7e-4 (AdamW lr 0.05) and 1e-11
// (SGD lr 0.5) with the default outer Nesterov (lr 0.7, momentum 0.9).
// Without a GPU it compiles and links, says so and exits 0.
#include <diloco/cuda.hpp>

#include <cmath>
#include <cstdio>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/transform.h>
#include <vector>

namespace dc = diloco;
namespace cp = diloco::compress;

static_assert(__cplusplus >= 202002L, "diloco::cuda compiles this file as C++20");

struct minus_target {
  float target;
  __host__ __device__ float operator()(float w) const { return w - target; }
};

template <class Inner, class Compressor>
float train(float target, typename Inner::options inner) {
  float worst = 0.0f;
  dc::comm::threads::world world(4);
  world.run([&](dc::comm::threads& comm) {
    std::vector<thrust::device_vector<float>> params(2, thrust::device_vector<float>(1000, 0.0f));
    std::vector<thrust::device_vector<float>> grads(2, thrust::device_vector<float>(1000, 0.0f));
    dc::algorithm<Inner, dc::outer::nesterov, Compressor, dc::comm::threads> t(
        params, comm, {.inner_steps = 10, .inner = inner});
    for (int step = 0; step < 400; ++step) {
      for (std::size_t k = 0; k < params.size(); ++k)
        thrust::transform(params[k].begin(), params[k].end(), grads[k].begin(), minus_target{target});
      t.step(grads);  // same calls as with host tensors
    }
    if (comm.rank() == 0)
      for (auto& p : params) {
        thrust::host_vector<float> h = p;
        for (float w : h) worst = std::fmax(worst, std::fabs(w - target));
      }
  });
  return worst;
}

int main() {
  if (dc::cuda_device_count() == 0) {
    std::printf("no GPU: the GPU code of docs/guide.md compiled and linked; nothing to run\n");
    return 0;
  }
  const float adamw = train<dc::inner::adamw, cp::none>(1.5f, {.lr = 0.05f, .weight_decay = 0.0f});
  const float int4 =
      train<dc::inner::sgd, cp::error_feedback<cp::blockwise<dc::int4, 128>>>(1.5f, {.lr = 0.5f});
  std::printf("largest |w - 1.5|: adamw fp32 %g, sgd int4+EF %g\n", adamw, int4);
  return adamw < 5e-2f && int4 < 1e-2f ? 0 : 1;
}
