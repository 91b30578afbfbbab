// SPDX-License-Identifier: Apache-2.0
#pragma once

// The transformer as a diloco::experiment problem: problem(worker) builds
// one worker's model over the corpus of the char-MLP demo (Debian's
// fortunes by default; char_mlp/corpus.hpp) and its shards
// (char_mlp/shards.hpp). A global step is `batch` windows of context + 1
// characters, split evenly over the workers; window `id` of a step starts
// where the shard plan puts it (a function of the seed and id only), so
// every variant sees the same data. The loss is the mean cross-entropy of
// every next character in the windows.
//
// A worker's model also owns a torch::optim::AdamW (inner_step), for the
// runs where the example's own optimizer takes the inner steps and diloco
// wraps it (inner::external, examples/gpt/external.hpp): its lr set from
// the schedule before each step and the gradients clipped by
// torch::nn::utils::clip_grad_norm_, as a libtorch trainer does.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <diloco/experiment/run.hpp>
#include <functional>
#include <memory>
#include <diloco/tensor/torch.hpp>
#include <vector>

#include "char_mlp/corpus.hpp"
#include "char_mlp/shards.hpp"
#include "gpt/model.hpp"

namespace gpt {

// The example's own optimizer: torch::optim::AdamW with these settings
// (the library's inner::adamw defaults for betas and eps, so both paths run
// the same update) and the lr schedule `lr(step)`.
struct torch_adamw_settings {
  std::function<float(std::uint64_t step)> lr{};
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float max_grad_norm = 0.0f;  // clip_grad_norm_ before each step; 0: none
};

struct config {
  shape dims{};
  torch_adamw_settings adamw{};  // for inner_step (the external path)
  int batch = 16;             // windows per global step, split over the workers
  int eval_windows = 1024;    // held-out windows per evaluation (evenly spaced, at most all of it)
  int threads_per_worker = 1; // libtorch's intra-op threads in each worker
};

// Windows of context + 1 characters as [rows, context + 1] ids.
class window_batch {
 public:
  void resize(int rows, int context) {
    if (ids_.defined() && ids_.size(0) == rows && ids_.size(1) == context + 1) return;
    ids_ = torch::empty({rows, context + 1}, torch::kLong);
  }
  void set(int row, const std::vector<std::uint8_t>& text, std::size_t pos) {
    auto* out = ids_.data_ptr<int64_t>() + static_cast<std::ptrdiff_t>(row) * ids_.size(1);
    for (int64_t i = 0; i < ids_.size(1); ++i) out[i] = text[pos + static_cast<std::size_t>(i)];
  }
  torch::Tensor inputs() const { return ids_.slice(1, 0, ids_.size(1) - 1); }
  torch::Tensor targets() const { return ids_.slice(1, 1, ids_.size(1)); }

 private:
  torch::Tensor ids_;
};

inline torch::Tensor next_char_loss(transformer& m, const window_batch& b) {
  const auto logits = m->forward(b.inputs());
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets().reshape({-1}));
}

class worker_model {
 public:
  worker_model(const char_mlp::dataset& d, const config& c, const char_mlp::shard_plan& plan,
               const diloco::experiment::worker& w)
      : d_(&d), c_(&c), plan_(&plan), rank_(w.rank), size_(w.size), seed_(w.seed), m_(c.dims, w.seed),
        params_(m_) {
    // Each worker's libtorch ops run on its own thread (and OpenMP team).
    at::set_num_threads(c.threads_per_worker);
  }

  std::vector<torch::Tensor>& parameters() { return params_.tensors(); }
  const std::vector<torch::Tensor>& gradients() { return params_.gradients(); }
  std::size_t parameter_count() const { return params_.elements(); }

  double train(std::uint64_t step) {
    const int share = c_->batch / size_;
    batch_.resize(share, c_->dims.context);
    for (int j = 0; j < share; ++j) {
      const std::uint64_t id = step * static_cast<std::uint64_t>(c_->batch) + static_cast<std::uint64_t>(rank_ * share + j);
      const std::size_t pos = plan_->position(rank_, id, seed_);
      batch_.set(j, d_->train, pos);
    }
    m_->zero_grad();
    auto loss = next_char_loss(m_, batch_);
    loss.backward();
    return loss.item<double>();
  }

  // The torch optimizer's step for global step `step` (after train(step),
  // or after the gradients were replaced by their mean): the schedule's lr
  // into every parameter group, clip_grad_norm_, AdamW's step. The
  // optimizer is made at the first call; its state lives as long as the model.
  void inner_step(std::uint64_t step) {
    const auto& a = c_->adamw;
    if (!opt_)
      opt_ = std::make_unique<torch::optim::AdamW>(
          m_->parameters(), torch::optim::AdamWOptions(a.lr ? a.lr(0) : 1e-3)
                                .betas({a.beta1, a.beta2})
                                .eps(a.eps)
                                .weight_decay(a.weight_decay));
    if (a.lr)
      for (auto& group : opt_->param_groups())
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(a.lr(step));
    if (a.max_grad_norm > 0.0f) torch::nn::utils::clip_grad_norm_(m_->parameters(), a.max_grad_norm);
    opt_->step();
  }

  // Mean cross-entropy (nats per character) over evenly spaced held-out windows.
  double evaluate() {
    torch::NoGradGuard no_grad;
    const auto window = static_cast<std::size_t>(c_->dims.context) + 1;
    const std::size_t avail = d_->held_out.size() - window + 1;
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(c_->eval_windows), avail / window);
    constexpr std::size_t chunk = 64;
    double total = 0.0;
    window_batch b;
    for (std::size_t first = 0; first < n; first += chunk) {
      const std::size_t count = std::min(chunk, n - first);
      b.resize(static_cast<int>(count), c_->dims.context);
      for (std::size_t j = 0; j < count; ++j) b.set(static_cast<int>(j), d_->held_out, (first + j) * avail / n);
      total += next_char_loss(m_, b).item<double>() * static_cast<double>(count);
    }
    return total / static_cast<double>(n);
  }

 private:
  const char_mlp::dataset* d_;
  const config* c_;
  const char_mlp::shard_plan* plan_;
  int rank_, size_;
  std::uint64_t seed_;
  transformer m_;
  diloco::torch_parameters params_;
  window_batch batch_;
  std::unique_ptr<torch::optim::AdamW> opt_;
};

struct problem {
  const char_mlp::dataset* d;
  const config* c;
  const char_mlp::shard_plan* plan;
  worker_model operator()(const diloco::experiment::worker& w) const { return worker_model(*d, *c, *plan, w); }
};

}  // namespace gpt
