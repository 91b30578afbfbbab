// SPDX-License-Identifier: Apache-2.0
#pragma once

// The element passes of inner::muon's matrix step (inner/muon.hpp), shared
// by the host and the CUDA path: the momentum pass that writes the matrix
// Newton-Schulz starts from (transposed when the tensor is taller than wide,
// so the iteration always works on the short side), the normalisation, and
// the final update of the parameters. The matrix products between them are
// the space's own (a BLAS-free loop on the host, cuBLAS on the device).

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Where element i (row-major in a rows x cols tensor) lies in the matrix
/// the iteration uses: the same place, or its place in the transpose.
DILOCO_HD DILOCO_FORCEINLINE std::size_t muon_index(std::size_t i, std::size_t rows, std::size_t cols,
                                                    bool transpose) {
  return transpose ? (i % cols) * rows + i / cols : i;
}

/// Momentum (SGD form, as the Muon reference's original and its blog post
/// write it): b <- mu*b + g; the iteration's input is u = g + mu*b
/// (Nesterov) or b, written to x (transposed when `transpose`).
struct muon_momentum {
  const float* DILOCO_RESTRICT grad;  ///< the tensor's gradient
  float grad_scale;                   ///< clipping factor, applied on read
  float* DILOCO_RESTRICT buf;         ///< the momentum buffer (slot 0)
  float* DILOCO_RESTRICT x;           ///< the iteration's matrix
  float momentum;                     ///< mu
  bool nesterov;                      ///< u = g + mu*b instead of b
  bool transpose;                     ///< x is the tensor's transpose
  std::size_t rows;                   ///< the tensor's rows
  std::size_t cols;                   ///< the tensor's columns

  /// Element i of the tensor.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    const float g = mul_rn(grad[i], grad_scale);
    const float b = add_rn(mul_rn(momentum, buf[i]), g);
    buf[i] = b;
    x[muon_index(i, rows, cols, transpose)] = nesterov ? add_rn(g, mul_rn(momentum, b)) : b;
  }
};

/// x <- x / denom (the Frobenius normalisation: denom = ||x||_F + eps).
struct muon_normalise {
  float* DILOCO_RESTRICT x;  ///< the iteration's matrix
  float denom;               ///< ||x||_F + eps

  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const { x[i] = div_rn(x[i], denom); }
};

/// p <- p * decay - step * o, o read from the iteration's matrix (transposed
/// back when it was transposed): decay = 1 - lr*weight_decay, step = lr *
/// max(1, rows/cols)^(1/2).
struct muon_apply {
  float* DILOCO_RESTRICT param;  ///< the tensor
  const float* DILOCO_RESTRICT o;  ///< the orthogonalised update
  float decay;                   ///< 1 - lr * weight_decay
  float step;                    ///< lr * max(1, rows / cols)^(1/2)
  bool transpose;                ///< o is the tensor's transpose
  std::size_t rows;              ///< the tensor's rows
  std::size_t cols;              ///< the tensor's columns

  /// Element i of the tensor.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    param[i] = sub_rn(mul_rn(param[i], decay), mul_rn(step, o[muon_index(i, rows, cols, transpose)]));
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
