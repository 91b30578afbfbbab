// SPDX-License-Identifier: Apache-2.0
// A CUDA translation unit that includes only <diloco/diloco.hpp>: the host
// library must compile under nvcc at C++20 (DILOCO_HD functors become
// __host__ __device__) and work unchanged. Trains y = 2x + 1 with 4
// in-process workers on the host; no GPU needed.
#include <diloco/diloco.hpp>

#include <cstdio>
#include <vector>

namespace dc = diloco;

int main() {
  static_assert(__cplusplus >= 202002L, "compiled as C++20");
  float w0 = 0.0f, w1 = 0.0f;
  dc::comm::threads::world world(4);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(2, 0.0f);
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
        w, comm, {.inner_steps = 50, .inner = {.lr = 0.01f, .weight_decay = 0.0f}});
    for (int step = 0; step < 2000; ++step) {
      std::vector<float> grad(2, 0.0f);
      for (int i = 0; i < 8; ++i) {
        const float x = static_cast<float>(comm.rank() * 8 + i) / 32.0f;
        const float err = w[0] * x + w[1] - (2.0f * x + 1.0f);
        grad[0] += err * x / 8.0f;
        grad[1] += err / 8.0f;
      }
      t.step(grad);
    }
    if (comm.rank() == 0) {
      w0 = w[0];
      w1 = w[1];
    }
  });
  std::printf("w = (%.3f, %.3f)\n", w0, w1);
  return 0;
}
