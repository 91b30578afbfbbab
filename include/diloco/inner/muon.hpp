// SPDX-License-Identifier: Apache-2.0
#pragma once

// inner::muon: Muon (Keller Jordan, "Muon: An optimizer for hidden layers in
// neural networks", 2024, kellerjordan.github.io/posts/muon; reference code
// github.com/KellerJordan/Muon, muon.py) for matrices and AdamW for every
// other tensor, as MuLoCo (Therien et al., arXiv 2505.23725) runs it as
// DiLoCo's inner optimizer. A whole-tensor policy (core/concepts.hpp,
// tensor_optimizer_policy): the orthogonalisation needs the whole matrix.
//
// The variant, exactly. For a tensor of rows x cols with both above 1, with
// gradient g (after clipping) and momentum buffer b:
//   b <- mu*b + g;  u = g + mu*b (Nesterov, the default) or u = b
//   X = u, transposed when rows > cols (X is m x n, m <= n)
//   X <- X / (||X||_F + ns_eps)
//   ns_steps times (5): A = X X^T;  B = b_ns*A + c_ns*A A;  X <- a_ns*X + B X
//     with (a_ns, b_ns, c_ns) = (3.4445, -4.7750, 2.0315), the reference's
//   p <- p*(1 - lr*weight_decay) - lr*max(1, rows/cols)^(1/2) * X (transposed back)
// Differences from the reference, on purpose: (1) it iterates in bfloat16
// on the GPU; this runs in fp32 (on the host the products accumulate in
// double), so results are not the reference's bits, and host and device
// differ in rounding (cuBLAS sums in its own order). (2) Its current momentum
// is the EMA form b <- b + (1-mu)(g - b), u = g + mu(b - g); that is (1-mu)
// times the form above (the original, SGD-momentum form, which the blog post
// gives), so after the normalisation both give the same X up to ns_eps.
// (3) The reference leaves the choice of Muon or AdamW to the user (hidden
// matrices take Muon; embeddings, the head, gains and biases AdamW); here
// the shape decides: every tensor with rows > 1 and cols > 1
// (tensor_traits' rows/cols; libtorch tensors are shape[0] x the rest, as
// the reference views conv filters) takes Muon, all others AdamW.
//
// The AdamW part is the library's inner::adamw update (PyTorch's AdamW; the
// reference's aux Adam is the same arithmetic) with lr * adamw_lr_scale as
// its learning rate, so a schedule that sets lr moves both parts as a
// PyTorch scheduler moves both parameter groups.
//
// State: two slots per element in the optimizer's flat buffer. A matrix
// uses slot 0 (the momentum buffer) and leaves slot 1 zero; any other tensor
// keeps AdamW's first and second moments there. Visited and checkpointed as
// every optimizer's slots are.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/optimizer_role.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/inner/adamw.hpp"
#include "diloco/kernels/adamw_update.hpp"
#include "diloco/kernels/inner_step.hpp"
#include "diloco/kernels/muon_passes.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/tensor_step.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::detail {
template <class Space>
class muon_stepper;
}  // namespace diloco::detail

namespace diloco::inner {

/// Muon for matrices, AdamW for the other tensors (see the top of inner/muon.hpp
/// for the exact variant). Defaults are the reference's: lr 0.02, momentum
/// 0.95 (Nesterov), five Newton-Schulz steps, no weight decay; the AdamW part
/// at lr 3e-4 (0.02 * 0.015), betas (0.9, 0.95), eps 1e-10.
struct muon {
  /// The hyper-parameters, set with designated initializers ({.lr = 0.05f}).
  struct options {
    float lr = 0.02f;             ///< learning rate of the matrices (spectral-norm units per step)
    float momentum = 0.95f;       ///< mu of the momentum buffer, in [0, 1)
    bool nesterov = true;         ///< orthogonalise g + mu*b (true) or b
    int ns_steps = 5;             ///< Newton-Schulz iterations, 1 to 100
    float ns_eps = 1e-7f;         ///< added to the Frobenius norm before dividing by it
    float weight_decay = 0.0f;    ///< decoupled weight decay of the matrices: p <- p*(1 - lr*weight_decay)
    float adamw_lr_scale = 0.015f;  ///< the other tensors' AdamW runs at lr * adamw_lr_scale
    float beta1 = 0.9f;           ///< AdamW's first-moment decay
    float beta2 = 0.95f;          ///< AdamW's second-moment decay
    float eps = 1e-10f;           ///< AdamW's denominator term
    float adamw_weight_decay = 0.0f;  ///< AdamW's decoupled weight decay
    /// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_), over
    /// every tensor of the worker; 0 disables it.
    float max_grad_norm = 0.0f;
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("lr", o.lr);
      f("momentum", o.momentum);
      f("nesterov", o.nesterov);
      f("ns_steps", o.ns_steps);
      f("ns_eps", o.ns_eps);
      f("weight_decay", o.weight_decay);
      f("adamw_lr_scale", o.adamw_lr_scale);
      f("beta1", o.beta1);
      f("beta2", o.beta2);
      f("eps", o.eps);
      f("adamw_weight_decay", o.adamw_weight_decay);
      f("max_grad_norm", o.max_grad_norm);
    }
  };

  static constexpr const char* name = "muon";  ///< the policy's name in checkpoint headers and reports
  /// An inner optimizer only: the outer slot takes element-wise policies.
  static constexpr optimizer_role role = optimizer_role::inner;
  ///@{
  /// The quintic Newton-Schulz coefficients of the reference (a, b, c).
  static constexpr double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  ///@}
  /// The step for one memory space (detail::muon_stepper): host here, device
  /// in inner/muon_cuda.hpp.
  template <class Space>
  using stepper = detail::muon_stepper<Space>;

  /// Throws config_error naming the first option out of range.
  static void validate(const options& o) {
    detail::require_non_negative(o.lr, "muon: lr");
    detail::require_unit_interval(o.momentum, "muon: momentum");
    if (o.ns_steps < 1 || o.ns_steps > 100)
      detail::raise<config_error>("muon: ns_steps must lie in [1, 100] (the reference runs 5), got ", o.ns_steps);
    detail::require_positive(o.ns_eps, "muon: ns_eps");
    detail::require_non_negative(o.weight_decay, "muon: weight_decay");
    detail::require_non_negative(o.adamw_lr_scale, "muon: adamw_lr_scale");
    detail::require_unit_interval(o.beta1, "muon: beta1");
    detail::require_unit_interval(o.beta2, "muon: beta2");
    detail::require_non_negative(o.eps, "muon: eps");
    detail::require_non_negative(o.adamw_weight_decay, "muon: adamw_weight_decay");
    detail::require_non_negative(o.max_grad_norm, "muon: max_grad_norm");
  }

  /// Two slots per element: the momentum buffer (matrices), or AdamW's
  /// moments (every other tensor).
  static std::size_t state_slots(const options&) { return 2; }

  /// Whether a tensor of this shape takes the Muon step (else AdamW).
  static bool orthogonalises(const tensor_shape& s) { return s.is_matrix(); }

  /// The AdamW element step of the non-matrix tensors at step `step` (from 1).
  static kernels::adamw_update adamw_update_for(const options& o, std::uint64_t step) {
    adamw::options a;
    a.lr = static_cast<float>(static_cast<double>(o.lr) * static_cast<double>(o.adamw_lr_scale));
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.adamw_weight_decay;
    return adamw::make_update(a, step);
  }
};

}  // namespace diloco::inner

namespace diloco::detail {

// Scratch of a matrix step: X and its next value (m x n), A and B (m x m).
struct muon_scratch {
  float* x;
  float* y;
  float* a;
  float* b;
};

// One tensor's step, written once for both spaces: the element passes run on
// the executor, the three products on `mm` (host loops or cuBLAS), which
// provides gram(x, m, n, a): a = x x^T; polynomial(a, m, cb, cc, b):
// b = cb*a + cc*a a; combine(b, x, m, n, ca, y): y = ca*x + b x. All
// row-major, x m x n with m <= n.
template <class Exec, class Products>
void muon_tensor_step(Exec& exec, Products& mm, const inner::muon::options& o, std::uint64_t step,
                      const tensor_step& t, muon_scratch s) {
  const std::size_t n_elems = t.size();
  if (!inner::muon::orthogonalises(t.shape)) {
    exec.for_each(n_elems, kernels::inner_step<kernels::adamw_update>{inner::muon::adamw_update_for(o, step), t.param,
                                                                      t.grad, t.grad_scale, t.state, t.stride});
    return;
  }
  const std::size_t rows = t.shape.rows, cols = t.shape.cols;
  const bool transpose = rows > cols;
  const std::size_t m = transpose ? cols : rows, n = transpose ? rows : cols;
  exec.for_each(n_elems, kernels::muon_momentum{t.grad, t.grad_scale, t.state, s.x, o.momentum, o.nesterov, transpose,
                                                rows, cols});
  const double norm = std::sqrt(exec.transform_reduce(n_elems, kernels::squares{s.x}));
  exec.for_each(n_elems, kernels::muon_normalise{s.x, static_cast<float>(norm + static_cast<double>(o.ns_eps))});
  for (int k = 0; k < o.ns_steps; ++k) {
    mm.gram(s.x, m, n, s.a);
    mm.polynomial(s.a, m, inner::muon::ns_b, inner::muon::ns_c, s.b);
    mm.combine(s.b, s.x, m, n, inner::muon::ns_a, s.y);
    std::swap(s.x, s.y);
  }
  const double lr = o.lr;
  const double shape_scale = std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
  exec.for_each(n_elems, kernels::muon_apply{t.param, s.x,
                                             static_cast<float>(1.0 - lr * static_cast<double>(o.weight_decay)),
                                             static_cast<float>(lr * shape_scale), transpose, rows, cols});
}

// The host's products: BLAS-free, each entry or row accumulated in double
// (the products of two floats are exact in double, so only the sums round),
// so that five iterations stay well inside 1e-5 of a double reference. A
// and B are symmetric by construction (each entry above the diagonal is
// computed once and mirrored), which lets A A be taken as dot products of
// rows, the order in which a row-major matrix is contiguous. Rows are
// independent: each product is one for_each over rows, which exec::host
// spreads over its threads when there are enough of them.
struct muon_host_products {
  // Dot product of two float rows, in eight independent double lanes (a
  // single accumulator would serialise on the add's latency).
  static double dot(const float* p, const float* q, std::size_t n) {
    double lane[8] = {};
    std::size_t k = 0;
    for (; k + 8 <= n; k += 8)
      for (std::size_t l = 0; l < 8; ++l) lane[l] += static_cast<double>(p[k + l]) * static_cast<double>(q[k + l]);
    double tail = 0.0;
    for (; k < n; ++k) tail += static_cast<double>(p[k]) * static_cast<double>(q[k]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
  }

  // Row i of out = cb*in + cc*in in^T (in m x n; for the gram cb = 0, cc = 1;
  // for the polynomial in = A, symmetric, so in in^T = A A).
  struct symmetric_row {
    static constexpr std::size_t elements_per_call = 1024;  // a row is many dot products: parallel from 32 rows
    const float* in;
    float* out;
    std::size_t m, n;
    double cb, cc;
    void operator()(std::size_t i) const {
      for (std::size_t j = i; j < m; ++j) {
        const double base = cb != 0.0 ? cb * static_cast<double>(in[i * n + j]) : 0.0;
        const auto v = static_cast<float>(base + cc * dot(in + i * n, in + j * n, n));
        out[i * m + j] = v;
        out[j * m + i] = v;
      }
    }
  };

  // Row i of y = ca*x + b x, by blocks of columns so that the double
  // accumulators stay in registers and cache.
  struct combine_row {
    static constexpr std::size_t elements_per_call = 1024;
    static constexpr std::size_t block = 64;
    const float* b;
    const float* x;
    float* y;
    std::size_t m, n;
    double ca;
    void operator()(std::size_t i) const {
      double acc[block];
      for (std::size_t j0 = 0; j0 < n; j0 += block) {
        const std::size_t w = std::min(block, n - j0);
        for (std::size_t j = 0; j < w; ++j) acc[j] = ca * static_cast<double>(x[i * n + j0 + j]);
        for (std::size_t k = 0; k < m; ++k) {
          const double bik = b[i * m + k];
          const float* xk = x + k * n + j0;
          for (std::size_t j = 0; j < w; ++j) acc[j] += bik * static_cast<double>(xk[j]);
        }
        for (std::size_t j = 0; j < w; ++j) y[i * n + j0 + j] = static_cast<float>(acc[j]);
      }
    }
  };

  template <class Exec>
  struct on {
    Exec& exec;
    void gram(const float* x, std::size_t m, std::size_t n, float* a) { exec.for_each(m, symmetric_row{x, a, m, n, 0.0, 1.0}); }
    void polynomial(const float* a, std::size_t m, double cb, double cc, float* b) {
      exec.for_each(m, symmetric_row{a, b, m, m, cb, cc});
    }
    void combine(const float* b, const float* x, std::size_t m, std::size_t n, double ca, float* y) {
      exec.for_each(m, combine_row{b, x, y, m, n, ca});
    }
  };
};

// Without a step for this space: the device step is in inner/muon_cuda.hpp.
template <class Space>
class muon_stepper {
  static_assert(sizeof(Space) == 0,
                "diloco::inner::muon over device tensors needs its cuBLAS step: include <diloco/inner/muon_cuda.hpp> "
                "after <diloco/cuda.hpp> in the .cu file, and link CUDA::cublas");
};

// The host step: scratch grown to the largest matrix seen, then kept.
template <>
class muon_stepper<host_space> {
 public:
  template <class Exec>
  void step(Exec& exec, const inner::muon::options& o, std::uint64_t step, const tensor_step& t) {
    if (t.size() == 0) return;
    if (inner::muon::orthogonalises(t.shape)) reserve(t.shape);
    muon_host_products::on<Exec> mm{exec};
    muon_tensor_step(exec, mm, o, step, t, {x_.data(), y_.data(), a_.data(), b_.data()});
  }

 private:
  void reserve(const tensor_shape& s) {
    const std::size_t m = std::min(s.rows, s.cols);
    if (x_.size() < s.rows * s.cols) {
      x_ = buffer<float, host_space>(s.rows * s.cols);
      y_ = buffer<float, host_space>(s.rows * s.cols);
    }
    if (a_.size() < m * m) {
      a_ = buffer<float, host_space>(m * m);
      b_ = buffer<float, host_space>(m * m);
    }
  }

  buffer<float, host_space> x_, y_, a_, b_;
};

}  // namespace diloco::detail

DILOCO_EXACT_FP_END
