// SPDX-License-Identifier: Apache-2.0
#pragma once

// The character MLP as a diloco::experiment problem (examples/sweep.cpp):
// problem(worker) builds one worker's model, whose train(step) takes that
// worker's share of global step `step`'s batch from its shard (the demo's
// sampling: the same data for every variant) and whose evaluate() is the
// demo's held-out loss. Parameters are exposed with their matrix shapes,
// so the low-rank compressor factors the weight matrices.

#include <cstdint>
#include <diloco/experiment/run.hpp>
#include <diloco/core/tensor_traits.hpp>
#include <vector>

#include "corpus.hpp"
#include "experiment.hpp"
#include "model.hpp"
#include "shards.hpp"

namespace char_mlp {

class worker_model {
 public:
  worker_model(const dataset& d, const config& c, const shard_plan& plan, const diloco::experiment::worker& w)
      : d_(&d), c_(&c), plan_(&plan), rank_(w.rank), size_(w.size), m_(c.dims, w.seed) {
    // embedding V x E, W1 (K E) x H, b1, W2 H x V, b2 (model.hpp's order)
    const auto v = static_cast<std::size_t>(c.dims.vocab), e = static_cast<std::size_t>(c.dims.embed),
               k = static_cast<std::size_t>(c.dims.context), h = static_cast<std::size_t>(c.dims.hidden);
    const std::size_t rows[] = {v, k * e, h, h, v};
    auto& p = m_.parameters();
    for (std::size_t i = 0; i < p.size(); ++i) params_.emplace_back(p[i].data(), rows[i], p[i].size() / rows[i]);
  }

  std::vector<diloco::matrix_view<float>>& parameters() { return params_; }
  const std::vector<std::span<const float>>& gradients() const { return m_.gradients(); }

  double train(std::uint64_t step) {
    const int share = c_->batch / size_;
    b_.fill(*d_, *c_, *plan_, static_cast<int>(step), rank_, rank_ * share, share);
    return m_.forward(b_.contexts.data(), b_.targets.data(), share, true);
  }
  double evaluate() { return held_out_loss(m_, *d_, *c_); }

 private:
  const dataset* d_;
  const config* c_;
  const shard_plan* plan_;
  int rank_, size_;
  model m_;
  std::vector<diloco::matrix_view<float>> params_;
  batch_buffer b_;
};

// The problem: the data, the settings (workers, batch, shards) and the plan
// of shards must outlive the experiment.
struct problem {
  const dataset* d;
  const config* c;
  const shard_plan* plan;
  worker_model operator()(const diloco::experiment::worker& w) const { return worker_model(*d, *c, *plan, w); }
};

}  // namespace char_mlp
