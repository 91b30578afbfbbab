// SPDX-License-Identifier: Apache-2.0
// Two workers (threads of this process) fit y = 3x - 1 with a libtorch
// Linear(1, 1) and DiLoCo over the module's own tensors; exits non-zero
// unless the fit is close, so the test checks that the component works,
// not just links.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <diloco/diloco.hpp>
#include <diloco/tensor/torch.hpp>

namespace dc = diloco;

int main() {
  using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;
  float slope = 0.0f, intercept = 0.0f;
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    torch::manual_seed(comm.rank());  // different starts: rank 0's is broadcast
    torch::nn::Linear model(1, 1);
    dc::torch_parameters params(model);
    trainer t(params.tensors(), comm, {.inner_steps = 10, .inner = {.lr = 0.3f, .momentum = 0.5f}});
    const auto x = torch::arange(8, torch::kFloat).reshape({8, 1}).add(comm.rank() * 8).div(16.0);
    const auto y = 3.0 * x - 1.0;
    for (int step = 0; step < 1000; ++step) {
      model->zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      t.step(params.gradients());
    }
    if (comm.rank() == 0) {
      slope = model->weight.item<float>();
      intercept = model->bias.item<float>();
    }
  });
  std::printf("slope %.4f intercept %.4f\n", slope, intercept);
  return std::abs(slope - 3.0f) < 1e-2f && std::abs(intercept + 1.0f) < 1e-2f ? 0 : 1;
}
