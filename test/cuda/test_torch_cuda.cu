// SPDX-License-Identifier: Apache-2.0
// The libtorch adapter's device side (diloco/tensor/torch.hpp) on a GPU, with
// a CUDA build of libtorch 2.x in an nvcc translation unit (built only where
// CMake finds one: test/cuda/CMakeLists.txt; Debian's libtorch is CPU only).
//   - diloco::optimizer<adamw, exec::cuda> stepping a CUDA libtorch model's
//     own tensors follows torch::optim::AdamW on an identical CUDA copy
//     (PyTorch's implementation, the same batches), as test_torch.cpp checks
//     on the CPU;
//   - DiLoCo over torch_device_tensor and over torch_device_views, two
//     workers on comm::threads, ends with the same bits as the same program
//     over CPU copies of the tensors (the host engine), on gradients both
//     compute alike (the library's promise: host and device passes round
//     every operation the same way);
//   - tensors that are not fp32 contiguous CUDA tensors are refused.
// Without a GPU each case says so and passes.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <diloco/cuda.hpp>
#include <diloco/tensor/torch.hpp>
#include <vector>

namespace dc = diloco;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && torch::cuda::is_available();
}

// A small classifier: 6 inputs, 16 tanh units, 3 classes, on `device`.
torch::nn::Sequential make_model(torch::Device device) {
  torch::manual_seed(7);
  torch::nn::Sequential m(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  m->to(device);
  return m;
}

// max over tensors of ||a - b|| / ||b||, on the CPU.
double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const auto x = a[k].detach().cpu(), y = b[k].detach().cpu();
    worst = std::max(worst, (x - y).norm().item<double>() / y.norm().item<double>());
  }
  return worst;
}

constexpr int steps = 20;
constexpr double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
constexpr int workers = 2, train_steps = 24;  // the DiLoCo runs

dc::inner::adamw::options diloco_adamw() {
  return {.lr = static_cast<float>(lr),
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .eps = static_cast<float>(eps),
          .weight_decay = static_cast<float>(weight_decay)};
}

// Parameters of a few shapes, the same values on every device: a worker's
// replica.
std::vector<torch::Tensor> make_params(torch::Device device) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> out;
  for (auto shape : std::vector<std::vector<std::int64_t>>{{37}, {16, 9}, {1}, {1025}, {4, 4, 4}})
    out.push_back(torch::randn(shape).to(device));
  return out;
}

// Each worker's targets, the same values on every device (drawn here, on
// the calling thread: libtorch's generator is global).
std::vector<std::vector<torch::Tensor>> make_targets(torch::Device device) {
  std::vector<std::vector<torch::Tensor>> out;
  const auto shapes = make_params(torch::Device(torch::kCPU));
  for (int r = 0; r < workers; ++r) {
    torch::manual_seed(100 + r);
    out.emplace_back();
    for (const auto& p : shapes) out.back().push_back(torch::randn(p.sizes()).to(device));
  }
  return out;
}

// The gradient of 0.5 * ||p - t||^2: p - t, one subtraction per element,
// the same bits on the CPU and the GPU.
std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& targets) {
  std::vector<torch::Tensor> out;
  for (std::size_t k = 0; k < params.size(); ++k) out.push_back(params[k].detach() - targets[k]);
  return out;
}

using trainer_options = dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov, dc::compress::none>;
const trainer_options opts{.inner_steps = 4, .inner = diloco_adamw(), .outer = {.lr = 0.7f, .momentum = 0.9f}};

// DiLoCo with `workers` workers on comm::threads over the tensors `wrap`
// makes of each worker's parameters (on `device`); each worker's final
// parameters, on the CPU.
template <class Wrap>
std::vector<std::vector<torch::Tensor>> train(torch::Device device, Wrap wrap) {
  std::vector<std::vector<torch::Tensor>> params(workers);
  for (auto& p : params) p = make_params(device);
  const auto targets = make_targets(device);
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto tensors = wrap(params[r]);
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(tensors, comm,
                                                                                                   opts);
    for (int s = 0; s < train_steps; ++s) {
      const auto g = gradients(params[r], targets[r]);
      t.step(wrap(g));
    }
    CHECK(t.stats().rounds == static_cast<std::uint64_t>(train_steps / opts.inner_steps));
  });
  for (auto& p : params)
    for (auto& t : p) t = t.cpu();
  return params;
}

}  // namespace

TEST_CASE("gpu: diloco::optimizer<adamw, exec::cuda> on a CUDA libtorch model follows torch::optim::AdamW") {
  if (!have_gpu()) {
    MESSAGE("no GPU here: skipped");
    return;
  }
  const torch::Device cuda(torch::kCUDA);
  auto ours = make_model(cuda), theirs = make_model(cuda);
  REQUIRE(max_relative_difference(ours->parameters(), theirs->parameters()) == 0.0);
  std::vector<torch::Tensor> start;
  for (const auto& t : theirs->parameters()) start.push_back(t.detach().clone());
  torch::optim::AdamW reference(theirs->parameters(),
                                torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay));
  dc::torch_parameters params(ours);
  dc::optimizer<dc::inner::adamw, dc::exec::cuda> opt(dc::torch_device_tensors(params.tensors()), diloco_adamw());
  torch::manual_seed(11);
  for (int s = 0; s < steps; ++s) {
    const auto input = torch::randn({8, 6}).to(cuda);
    const auto target = torch::randint(0, 3, {8}, torch::kLong).to(cuda);
    for (auto* m : {&ours, &theirs}) {
      (*m)->zero_grad();
      torch::nn::functional::cross_entropy((*m)->forward(input), target).backward();
    }
    reference.step();
    opt.step(dc::torch_device_tensors(params.gradients()));
  }
  cudaDeviceSynchronize();
  const double rel = max_relative_difference(ours->parameters(), theirs->parameters());
  double moved = 0.0;
  for (std::size_t k = 0; k < start.size(); ++k)
    moved = std::max(moved, (theirs->parameters()[k].detach() - start[k]).abs().max().item<double>());
  MESSAGE("max relative difference over " << steps << " steps: " << rel << " (largest move " << moved << ")");
  CHECK(moved > 0.05);
  CHECK(rel <= 1e-6);
}

TEST_CASE("gpu: DiLoCo over torch_device_tensor and torch_device_views gives the bits of the run over CPU copies") {
  if (!have_gpu()) {
    MESSAGE("no GPU here: skipped");
    return;
  }
  const auto host = train(torch::Device(torch::kCPU), [](const std::vector<torch::Tensor>& t) { return t; });
  const auto wrapped =
      train(torch::Device(torch::kCUDA), [](const std::vector<torch::Tensor>& t) { return dc::torch_device_tensors(t); });
  const auto views =
      train(torch::Device(torch::kCUDA), [](const std::vector<torch::Tensor>& t) { return dc::torch_device_views(t); });
  const auto start = make_params(torch::Device(torch::kCPU));
  for (int r = 0; r < workers; ++r) {
    CAPTURE(r);
    const auto& h = host[static_cast<std::size_t>(r)];
    // The workers agree after the last round, and the run went somewhere.
    CHECK(max_relative_difference(h, host[0]) == 0.0);
    CHECK(max_relative_difference(start, h) > 0.05);
    const double rel_wrapped = max_relative_difference(wrapped[static_cast<std::size_t>(r)], h);
    const double rel_views = max_relative_difference(views[static_cast<std::size_t>(r)], h);
    MESSAGE("relative difference to the CPU run: torch_device_tensor " << rel_wrapped << ", torch_device_views "
                                                                        << rel_views);
    CHECK(rel_wrapped == 0.0);
    CHECK(rel_views == 0.0);
  }
}

TEST_CASE("gpu: the device wrappers refuse CPU, fp64 and non-contiguous tensors by name") {
  if (!have_gpu()) {
    MESSAGE("no GPU here: skipped");
    return;
  }
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  CHECK_THROWS_WITH_AS(dc::torch_device_views({torch::zeros({3})}),
                       doctest::Contains("tensor 0 is on cpu, expected a CUDA tensor"), dc::config_error);
  CHECK_THROWS_WITH_AS(dc::torch_device_views({torch::zeros({3}, cuda.dtype(torch::kDouble))}),
                       doctest::Contains("dtype Double"), dc::config_error);
  const auto strided = torch::zeros({4, 4}, cuda).t();
  REQUIRE_FALSE(strided.is_contiguous());
  CHECK_THROWS_AS(dc::torch_device_views({strided}), dc::config_error);
  const std::vector<dc::torch_device_tensor> wrapped{{torch::zeros({3})}};
  CHECK_THROWS_WITH_AS(dc::tensor_traits<dc::torch_device_tensor>::data(wrapped[0]),
                       doctest::Contains("the tensor is on cpu, expected a CUDA tensor"), dc::config_error);
  // A CUDA tensor is accepted, and its storage is what the view points at.
  const auto ok = torch::arange(6, cuda.dtype(torch::kFloat));
  CHECK(dc::torch_device_views({ok})[0].data() == ok.data_ptr<float>());
}
