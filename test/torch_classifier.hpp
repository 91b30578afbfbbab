// SPDX-License-Identifier: Apache-2.0
#pragma once

// The libtorch tests' problem (test_torch, test_external): a small
// classifier, its batches, one forward and backward pass, and the relative
// difference between two lists of tensors. Include after doctest and torch.

#include <algorithm>
#include <cstddef>
#include <vector>

namespace torch_classifier {

// 6 inputs, 16 tanh units, 3 classes; the same initial weights every call.
inline torch::nn::Sequential make_model() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
}

// `steps` batches of 8 samples, drawn from torch's global generator (make
// them before any thread starts).
struct batches {
  std::vector<torch::Tensor> inputs, targets;
  explicit batches(int steps) {
    for (int s = 0; s < steps; ++s) {
      inputs.push_back(torch::randn({8, 6}));
      targets.push_back(torch::randint(0, 3, {8}, torch::kLong));
    }
  }
};

// Gradients of the cross-entropy of batch `step` in the model's tensors.
inline void forward_backward(torch::nn::Sequential& m, const batches& b, int step) {
  m->zero_grad();
  torch::nn::functional::cross_entropy(m->forward(b.inputs[static_cast<std::size_t>(step)]),
                                       b.targets[static_cast<std::size_t>(step)])
      .backward();
}

// max over tensors of ||a - b|| / ||b||
inline double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k)
    worst = std::max(worst, (a[k] - b[k]).norm().item<double>() / b[k].norm().item<double>());
  return worst;
}

}  // namespace torch_classifier
