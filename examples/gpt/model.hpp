// SPDX-License-Identifier: Apache-2.0
#pragma once

// A small decoder-only transformer over characters, in libtorch (GPT-2's
// layout: pre-norm blocks of causal multi-head self-attention and a GELU
// MLP, learned positions, a final LayerNorm and an untied output layer).
// At the defaults (d = 128, 4 layers, 4 heads, 64 characters of context,
// ~96 symbols) it has about 0.83 M parameters and trains at a few thousand
// characters a second on one core.
//
// Initialisation is GPT-2's (normal with std 0.02, the residual output
// projections scaled by 1/sqrt(2 layers), zero biases, unit LayerNorms),
// drawn from a generator of its own seeded by `seed`: models built at the
// same time on several threads (comm::threads workers) do not share
// libtorch's global generator.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>

namespace gpt {

struct shape {
  int vocab = 0;
  int context = 64;  // T
  int width = 128;   // d
  int layers = 4;
  int heads = 4;
};

class block_impl : public torch::nn::Module {
 public:
  block_impl(int width, int heads)
      : heads_(heads),
        ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv_(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj_(register_module("proj", torch::nn::Linear(width, width))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc_(register_module("fc", torch::nn::Linear(width, 4 * width))),
        out_(register_module("out", torch::nn::Linear(4 * width, width))) {}

  // x: [B, T, d]; `future` masks the positions after each one (true = hidden).
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& future) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2), head = d / heads_;
    // [B, T, 3, heads, head] -> [3, B, heads, T, head]
    const auto qkv = qkv_->forward(ln1_->forward(x)).view({b, t, 3, heads_, head}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(head));
    scores = scores.masked_fill(future.slice(0, 0, t).slice(1, 0, t), -std::numeric_limits<float>::infinity());
    const auto mixed = torch::matmul(scores.softmax(-1), qkv[2]).transpose(1, 2).reshape({b, t, d});
    x = x + proj_->forward(mixed);
    return x + out_->forward(torch::gelu(fc_->forward(ln2_->forward(x))));
  }

  // The output projections of the residual branches (scaled at init).
  torch::nn::Linear& proj() { return proj_; }
  torch::nn::Linear& out() { return out_; }

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln1_;
  torch::nn::Linear qkv_, proj_;
  torch::nn::LayerNorm ln2_;
  torch::nn::Linear fc_, out_;
};
TORCH_MODULE_IMPL(block, block_impl);

class transformer_impl : public torch::nn::Module {
 public:
  transformer_impl(const shape& s, std::uint64_t seed)
      : s_(s),
        tokens_(register_module("tokens", torch::nn::Embedding(s.vocab, s.width))),
        positions_(register_module("positions", torch::nn::Embedding(s.context, s.width))),
        blocks_(register_module("blocks", torch::nn::ModuleList())),
        ln_(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        head_(register_module("head", torch::nn::Linear(s.width, s.vocab))) {
    if (s.width % s.heads != 0) throw std::invalid_argument("gpt: width must be a multiple of heads");
    for (int i = 0; i < s.layers; ++i) blocks_->push_back(block(s.width, s.heads));
    future_ = register_buffer("future", torch::ones({s.context, s.context}, torch::kBool).triu(1));
    positions_index_ = register_buffer("positions_index", torch::arange(s.context, torch::kLong));
    initialise(seed);
  }

  // ids: [B, T] (T <= context) -> logits [B, T, vocab]
  torch::Tensor forward(const torch::Tensor& ids) {
    const auto t = ids.size(1);
    auto x = tokens_->forward(ids) + positions_->forward(positions_index_.slice(0, 0, t));
    for (const auto& b : *blocks_) x = b->as<block_impl>()->forward(x, future_);
    return head_->forward(ln_->forward(x));
  }

  const shape& dims() const { return s_; }

 private:
  void initialise(std::uint64_t seed) {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double residual_std = 0.02 / std::sqrt(2.0 * s_.layers);
    for (auto& item : named_parameters()) {
      auto& p = item.value();
      const auto& name = item.key();
      const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
      const bool norm = name.find("ln") != std::string::npos;
      if (norm)
        bias ? p.zero_() : p.fill_(1.0);
      else if (bias)
        p.zero_();
      else
        p.normal_(0.0, 0.02, gen);
    }
    for (const auto& b : *blocks_) {
      auto* blk = b->as<block_impl>();
      blk->proj()->weight.normal_(0.0, residual_std, gen);
      blk->out()->weight.normal_(0.0, residual_std, gen);
    }
  }

  shape s_;
  torch::nn::Embedding tokens_, positions_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm ln_;
  torch::nn::Linear head_;
  torch::Tensor future_, positions_index_;
};
TORCH_MODULE_IMPL(transformer, transformer_impl);

}  // namespace gpt
