// SPDX-License-Identifier: Apache-2.0
// The libtorch adapter (diloco/tensor/torch.hpp): diloco's AdamW stepping a
// libtorch model's own tensors follows torch::optim::AdamW (PyTorch's
// reference implementation, run side by side on an identical copy of the
// model and the same batches), through diloco::optimizer and through the
// algorithm with one worker; clipping follows clip_grad_norm_; tensors that
// are not fp32, dense, contiguous CPU tensors are refused with a
// config_error that says what was wrong.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <diloco/diloco.hpp>
#include <diloco/tensor/torch.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "torch_classifier.hpp"

// Debian's libtorch brings glog, whose CHECK (abort on failure) replaces
// doctest's: take doctest's back, so a failed check is reported and counted.
#undef CHECK
#define CHECK DOCTEST_CHECK

namespace {

using torch_classifier::forward_backward;
using torch_classifier::make_model;
using torch_classifier::max_relative_difference;

// The batches every comparison here sees.
struct batches : torch_classifier::batches {
  explicit batches(int steps) : torch_classifier::batches((torch::manual_seed(11), steps)) {}
};

constexpr int steps = 20;
constexpr double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;

torch::optim::AdamWOptions torch_adamw() {
  return torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay);
}
diloco::inner::adamw::options diloco_adamw(float max_grad_norm = 0.0f) {
  return {.lr = static_cast<float>(lr),
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .eps = static_cast<float>(eps),
          .weight_decay = static_cast<float>(weight_decay),
          .max_grad_norm = max_grad_norm};
}

// The reference copy steps with torch::optim::AdamW (after
// clip_grad_norm_ when max_norm > 0); `make_ours(params)` returns a
// callable stepping ours with the gradients. Both see the same batches.
template <class MakeOurs>
void compare_with_torch(MakeOurs&& make_ours, double max_norm = 0.0) {
  auto theirs = make_model();
  auto ours = make_model();
  const batches data(steps);
  diloco::torch_parameters params(ours);
  auto start = ours->parameters();
  for (auto& t : start) t = t.detach().clone();
  REQUIRE(max_relative_difference(ours->parameters(), theirs->parameters()) == 0.0);
  torch::optim::AdamW reference(theirs->parameters(), torch_adamw());
  auto step_ours = make_ours(params);
  for (int s = 0; s < steps; ++s) {
    forward_backward(theirs, data, s);
    if (max_norm > 0.0) CHECK(torch::nn::utils::clip_grad_norm_(theirs->parameters(), max_norm) > max_norm);
    reference.step();
    forward_backward(ours, data, s);
    step_ours(params.gradients());
  }
  const double rel = max_relative_difference(ours->parameters(), theirs->parameters());
  // The parameters moved (the comparison is not of two unchanged copies).
  double displacement = 0.0;
  for (std::size_t k = 0; k < start.size(); ++k)
    displacement = std::max(displacement, (theirs->parameters()[k] - start[k]).abs().max().item<double>());
  MESSAGE("max relative difference over " << steps << " steps: " << rel << " (largest move " << displacement << ")");
  CHECK(displacement > 0.05);
  CHECK(rel <= 1e-6);
}

// diloco::optimizer<adamw> over the module's tensors.
auto diloco_optimizer(double max_norm = 0.0) {
  return [max_norm](diloco::torch_parameters& params) {
    auto d = std::make_shared<diloco::optimizer<diloco::inner::adamw>>(params.tensors(),
                                                                       diloco_adamw(static_cast<float>(max_norm)));
    return [d](const std::vector<torch::Tensor>& g) { d->step(g); };
  };
}

}  // namespace

TEST_CASE("diloco::optimizer<adamw> on a libtorch model follows torch::optim::AdamW") {
  compare_with_torch(diloco_optimizer());
}

TEST_CASE("diloco::algorithm (one worker, inner steps only) on a libtorch model follows torch::optim::AdamW") {
  compare_with_torch([](diloco::torch_parameters& params) {
    using trainer =
        diloco::algorithm<diloco::inner::adamw, diloco::outer::nesterov, diloco::compress::none, diloco::comm::local>;
    auto comm = std::make_shared<diloco::comm::local>();
    // H beyond the 20 steps: no outer round, the replica is the inner trajectory.
    auto t = std::make_shared<trainer>(params.tensors(), *comm,
                                       trainer::options{.inner_steps = 1000, .inner = diloco_adamw()});
    return [t, comm](const std::vector<torch::Tensor>& g) { CHECK_FALSE(t->step(g)); };
  });
}

TEST_CASE("adamw's max_grad_norm follows torch::nn::utils::clip_grad_norm_ then AdamW") {
  compare_with_torch(diloco_optimizer(0.05), 0.05);  // below the gradients' norms here: every step clips
}

TEST_CASE("torch_parameters: trainable parameters by name, gradients after backward") {
  auto m = make_model();
  m[0]->as<torch::nn::Linear>()->bias.set_requires_grad(false);  // frozen: not trained, not listed
  diloco::torch_parameters params(m);
  CHECK((params.names() == std::vector<std::string>{"0.weight", "2.weight", "2.bias"}));
  CHECK(params.elements() == 6u * 16u + 16u * 3u + 3u);
  CHECK(params.tensors()[0].data_ptr() == m[0]->as<torch::nn::Linear>()->weight.data_ptr());

  // No backward yet: the gradient is missing, and the message names it.
  CHECK_THROWS_WITH_AS(params.gradients(), doctest::Contains("parameter '0.weight' has no gradient"),
                       diloco::config_error);
  const batches data(1);
  forward_backward(m, data, 0);
  const auto& g = params.gradients();
  REQUIRE(g.size() == 3);
  CHECK(g[1].data_ptr() == m[2]->as<torch::nn::Linear>()->weight.grad().data_ptr());
  // A module holder and the module it holds list the same tensors.
  diloco::torch_parameters from_module(*m);
  CHECK(from_module.names() == params.names());

  // A shape-aware compressor sees PyTorch's matrix view: shape[0] rows.
  const auto w = torch::zeros({4, 3, 5});
  CHECK((diloco::tensor_shape_of(w) == diloco::tensor_shape{4, 15}));
  CHECK((diloco::tensor_shape_of(torch::zeros({7})) == diloco::tensor_shape{7, 1}));
}

TEST_CASE("tensors that are not fp32, dense, contiguous CPU tensors are refused") {
  using list = std::vector<torch::Tensor>;
  auto refused = [](list tensors, const std::string& expected) {
    auto construct = [&] { diloco::optimizer<diloco::inner::adamw> opt(tensors); };
    CHECK_THROWS_WITH_AS(construct(), doctest::Contains(expected.c_str()), diloco::config_error);
  };
  refused({torch::zeros({3}, torch::kDouble)}, "has dtype Double, expected Float (fp32)");
  refused({torch::zeros({3}, torch::kHalf)}, "has dtype Half, expected Float (fp32)");
  refused({torch::zeros({3, 4}).t()}, "is not contiguous");
  refused({torch::zeros({3}).to_sparse()}, "non-strided layout");
  refused({torch::Tensor()}, "undefined tensor");
  // Not on the CPU: a meta tensor (no storage) is refused like a CUDA one.
  refused({torch::empty({3}, torch::TensorOptions().device(torch::kMeta))}, "is on meta, expected a CPU tensor");
  if (torch::cuda::is_available()) {
    refused({torch::zeros({3}, torch::TensorOptions().device(torch::kCUDA))},
            "is on cuda:0, expected a CPU tensor (CUDA tensors go through diloco::torch_device_tensor");
  } else {
    MESSAGE("no CUDA device for libtorch here: a CUDA tensor cannot be made; the meta tensor takes its path");
  }

  // The same checks on gradients, at step time.
  auto w = torch::zeros({2, 3});
  diloco::optimizer<diloco::inner::adamw> opt(list{w});
  CHECK_THROWS_WITH_AS(opt.step(list{torch::zeros({3, 2}).t()}), doctest::Contains("is not contiguous"),
                       diloco::config_error);
  CHECK_THROWS_WITH_AS(opt.step(list{torch::zeros({2, 3}, torch::kDouble)}), doctest::Contains("dtype Double"),
                       diloco::config_error);
  // torch_parameters names the parameter.
  CHECK_THROWS_WITH_AS(diloco::torch_parameters(list{torch::zeros({2}), torch::zeros({2}, torch::kDouble)}),
                       doctest::Contains("parameter 'parameter 1' has dtype Double"), diloco::config_error);
}

TEST_CASE("the device side refuses tensors that are not on a CUDA device") {
  static_assert(std::is_same_v<diloco::tensor_space_t<diloco::torch_device_tensor>, diloco::device_space>);
  static_assert(diloco::mutable_float_tensor<diloco::torch_device_tensor>);
  const std::vector<torch::Tensor> cpu{torch::zeros({2, 3}), torch::zeros({4})};
  const auto wrapped = diloco::torch_device_tensors(cpu);
  REQUIRE(wrapped.size() == 2);
  CHECK(diloco::tensor_traits<diloco::torch_device_tensor>::rows(wrapped[0]) == 2);
  CHECK_THROWS_WITH_AS(diloco::tensor_data(wrapped[0]),
                       doctest::Contains("diloco::torch_device_tensor: the tensor is on cpu, expected a CUDA tensor"),
                       diloco::config_error);
  CHECK_THROWS_WITH_AS(diloco::torch_device_views(cpu),
                       doctest::Contains("diloco::torch_device_views: tensor 0 is on cpu, expected a CUDA tensor"),
                       diloco::config_error);
  CHECK_THROWS_WITH_AS(diloco::torch_device_views({torch::zeros({3}, torch::kDouble)}), doctest::Contains("dtype Double"),
                       diloco::config_error);
  if (torch::cuda::is_available()) {
    const std::vector<torch::Tensor> gpu{torch::arange(6, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA))};
    const auto views = diloco::torch_device_views(gpu);
    CHECK(views[0].data() == gpu[0].data_ptr<float>());
    CHECK(views[0].size() == 6);
  }
}
