// SPDX-License-Identifier: Apache-2.0
#pragma once

// A next-character MLP with hand-written forward and backward passes:
//   x = concat(embedding[c_1..c_K]) ; h = tanh(x W1 + b1) ; logits = h W2 + b2
// trained with softmax cross-entropy. Parameters and gradients each live in
// one contiguous vector, exposed as one span per tensor.
//
// The passes' loops are compiled twice, for the baseline x86-64 and with
// AVX2 (no FMA: each element sees the same IEEE operations in the same
// order, so the same bits), and the AVX2 copy runs where the library's
// host passes run theirs (diloco::kernels::host_simd::enabled(): the CPU
// has AVX2 and DILOCO_HOST_SIMD is not 0). On this project's machine
// (2026-11-30) the one-worker row of the demo's table ran in 3.9 s against
// 5.6 s, and test_demo took 172 CPU-s against 217.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <diloco/core/host_cpu.hpp>

// The model's loops as a second copy compiled for AVX2 (see above), and
// the one body both copies inline.
#if defined(DILOCO_HOST_SIMD_X86)
#define CHAR_MLP_AVX2 __attribute__((target("avx2")))
#define CHAR_MLP_BODY __attribute__((always_inline)) inline
#else
#define CHAR_MLP_BODY inline
#endif

namespace char_mlp {

struct shape {
  int vocab = 0;
  int context = 5;
  int embed = 16;
  int hidden = 96;
};

class model {
 public:
  model(shape s, std::uint64_t seed) : s_(s) {
    const auto v = static_cast<std::size_t>(s.vocab), k = static_cast<std::size_t>(s.context),
               e = static_cast<std::size_t>(s.embed), h = static_cast<std::size_t>(s.hidden);
    sizes_ = {v * e, k * e * h, h, h * v, v};
    std::size_t total = 0;
    for (auto n : sizes_) total += n;
    params_.assign(total, 0.0f);
    grads_.assign(total, 0.0f);
    std::size_t off = 0;
    for (auto n : sizes_) {
      param_views_.emplace_back(params_.data() + off, n);
      grad_views_.emplace_back(grads_.data() + off, n);
      const_grad_views_.emplace_back(grads_.data() + off, n);
      off += n;
    }
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : param_views_[0]) x = normal(rng);  // embedding
    const float a1 = 1.0f / std::sqrt(static_cast<float>(k * e));
    for (auto& x : param_views_[1]) x = a1 * normal(rng);
    const float a2 = 0.5f / std::sqrt(static_cast<float>(h));
    for (auto& x : param_views_[3]) x = a2 * normal(rng);
  }

  const shape& dims() const { return s_; }
  std::size_t parameter_count() const { return params_.size(); }
  const std::vector<std::size_t>& tensor_sizes() const { return sizes_; }
  std::vector<std::span<float>>& parameters() { return param_views_; }
  const std::vector<std::span<const float>>& gradients() const { return const_grad_views_; }
  std::span<float> flat_gradients() { return grads_; }
  std::span<const float> flat_parameters() const { return params_; }

  // Mean cross-entropy over the batch; fills the gradients when `backward`.
  // contexts: batch * context ids; targets: batch ids.
  double forward(const std::uint8_t* contexts, const std::uint8_t* targets, int batch, bool backward) {
    return forward_on(diloco::kernels::host_simd::enabled(), contexts, targets, batch, backward);
  }
  // forward() on the baseline copy of the loops whatever the CPU runs (the
  // test that both copies give the same bits).
  double forward_baseline(const std::uint8_t* contexts, const std::uint8_t* targets, int batch, bool backward) {
    return forward_on(false, contexts, targets, batch, backward);
  }

 private:
  double forward_on(bool wide, const std::uint8_t* contexts, const std::uint8_t* targets, int batch, bool backward) {
    const auto B = static_cast<std::size_t>(batch);
    x_.resize(B * static_cast<std::size_t>(s_.context * s_.embed));
    h_.resize(B * static_cast<std::size_t>(s_.hidden));
    p_.resize(B * static_cast<std::size_t>(s_.vocab));
    dh_.resize(static_cast<std::size_t>(s_.hidden));
    dx_.resize(static_cast<std::size_t>(s_.context * s_.embed));
#if defined(DILOCO_HOST_SIMD_X86)
    if (wide) {
      const double loss = forward_rows_avx2(contexts, targets, batch, backward);
      if (backward) backprop_avx2(contexts, targets, batch);
      return loss / batch;
    }
#else
    (void)wide;
#endif
    const double loss = forward_rows(contexts, targets, batch, backward);
    if (backward) backprop(contexts, targets, batch);
    return loss / batch;
  }

  // The forward pass over the batch (x_, h_ and p_ filled): the summed
  // cross-entropy; p_ holds the probabilities when `backward`.
  CHAR_MLP_BODY double forward_rows(const std::uint8_t* contexts, const std::uint8_t* targets, int batch,
                                    bool backward) {
    const int V = s_.vocab, K = s_.context, E = s_.embed, H = s_.hidden, KE = K * E;
    const float* emb = param_views_[0].data();
    const float* w1 = param_views_[1].data();
    const float* b1 = param_views_[2].data();
    const float* w2 = param_views_[3].data();
    const float* b2 = param_views_[4].data();
    double loss = 0.0;
    for (int b = 0; b < batch; ++b) {
      float* x = &x_[static_cast<std::size_t>(b * KE)];
      for (int k = 0; k < K; ++k) std::copy_n(emb + contexts[b * K + k] * E, E, x + k * E);
      float* h = &h_[static_cast<std::size_t>(b * H)];
      std::copy_n(b1, H, h);
      for (int i = 0; i < KE; ++i) {
        const float xi = x[i];
        const float* row = w1 + static_cast<std::ptrdiff_t>(i) * H;
        for (int j = 0; j < H; ++j) h[j] += xi * row[j];
      }
      for (int j = 0; j < H; ++j) h[j] = std::tanh(h[j]);
      float* p = &p_[static_cast<std::size_t>(b * V)];
      std::copy_n(b2, V, p);
      for (int j = 0; j < H; ++j) {
        const float hj = h[j];
        const float* row = w2 + static_cast<std::ptrdiff_t>(j) * V;
        for (int v = 0; v < V; ++v) p[v] += hj * row[v];
      }
      // Softmax: p becomes exp(logit - max), normalized when a backward
      // pass needs the probabilities.
      const float mx = *std::max_element(p, p + V);
      const float target_logit = p[targets[b]];
      double z = 0.0;
      for (int v = 0; v < V; ++v) {
        p[v] = std::exp(p[v] - mx);
        z += static_cast<double>(p[v]);
      }
      loss += std::log(z) - static_cast<double>(target_logit - mx);
      if (backward) {
        const auto inv = static_cast<float>(1.0 / z);
        for (int v = 0; v < V; ++v) p[v] *= inv;
      }
    }
    return loss;
  }
#if defined(DILOCO_HOST_SIMD_X86)
  CHAR_MLP_AVX2 double forward_rows_avx2(const std::uint8_t* c, const std::uint8_t* t, int batch, bool backward) {
    return forward_rows(c, t, batch, backward);
  }
  CHAR_MLP_AVX2 void backprop_avx2(const std::uint8_t* c, const std::uint8_t* t, int batch) { backprop(c, t, batch); }
#endif

  // a . b over n floats in eight independent partial sums, which the
  // compiler vectorizes (one running sum would have to stay in order).
  CHAR_MLP_BODY static float dot(const float* a, const float* b, int n) {
    float lane[8] = {};
    int i = 0;
    for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
    float sum = 0.0f;
    for (; i < n; ++i) sum += a[i] * b[i];
    for (const float x : lane) sum += x;
    return sum;
  }

  CHAR_MLP_BODY void backprop(const std::uint8_t* contexts, const std::uint8_t* targets, int batch) {
    const int V = s_.vocab, K = s_.context, E = s_.embed, H = s_.hidden, KE = K * E;
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    float* gemb = grad_views_[0].data();
    float* gw1 = grad_views_[1].data();
    float* gb1 = grad_views_[2].data();
    float* gw2 = grad_views_[3].data();
    float* gb2 = grad_views_[4].data();
    const float* w1 = param_views_[1].data();
    const float* w2 = param_views_[3].data();
    const float inv_b = 1.0f / static_cast<float>(batch);
    for (int b = 0; b < batch; ++b) {
      float* dlogits = &p_[static_cast<std::size_t>(b * V)];  // p - onehot, scaled by 1/B
      dlogits[targets[b]] -= 1.0f;
      for (int v = 0; v < V; ++v) dlogits[v] *= inv_b;
      const float* h = &h_[static_cast<std::size_t>(b * H)];
      for (int v = 0; v < V; ++v) gb2[v] += dlogits[v];
      for (int j = 0; j < H; ++j) {
        const float hj = h[j];
        float* grow = gw2 + static_cast<std::ptrdiff_t>(j) * V;
        for (int v = 0; v < V; ++v) grow[v] += hj * dlogits[v];
        const float* row = w2 + static_cast<std::ptrdiff_t>(j) * V;
        dh_[static_cast<std::size_t>(j)] = dot(dlogits, row, V) * (1.0f - hj * hj);  // through tanh
      }
      for (int j = 0; j < H; ++j) gb1[j] += dh_[static_cast<std::size_t>(j)];
      const float* x = &x_[static_cast<std::size_t>(b * KE)];
      for (int i = 0; i < KE; ++i) {
        const float xi = x[i];
        float* grow = gw1 + static_cast<std::ptrdiff_t>(i) * H;
        for (int j = 0; j < H; ++j) grow[j] += xi * dh_[static_cast<std::size_t>(j)];
        dx_[static_cast<std::size_t>(i)] = dot(dh_.data(), w1 + static_cast<std::ptrdiff_t>(i) * H, H);
      }
      for (int k = 0; k < K; ++k) {
        float* g = gemb + contexts[b * K + k] * E;
        for (int e = 0; e < E; ++e) g[e] += dx_[static_cast<std::size_t>(k * E + e)];
      }
    }
  }

  shape s_;
  std::vector<std::size_t> sizes_;
  std::vector<float> params_, grads_;
  std::vector<std::span<float>> param_views_;
  std::vector<std::span<float>> grad_views_;
  std::vector<std::span<const float>> const_grad_views_;
  std::vector<float> x_, h_, p_, dh_, dx_;
};

}  // namespace char_mlp
