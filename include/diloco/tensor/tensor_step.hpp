// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a whole-tensor optimizer (core/concepts.hpp, tensor_optimizer_policy)
// is handed for one tensor at each step. An element-wise policy never sees a
// tensor: its functor sees one element. A matrix optimizer (inner::muon)
// needs the whole tensor and its shape, so optimizer_core walks the tensors
// and passes each as one of these.

#include <cstddef>

#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// One parameter tensor, its gradient and its optimizer slots, all in the
/// executor's memory space. The slots use the flat layout every optimizer
/// shares (slot s of element i at state[s * stride + i]), so a whole-tensor
/// optimizer's state is checkpointed and restored like an element-wise one's.
struct tensor_step {
  float* param = nullptr;       ///< the tensor's elements, updated in place (row-major, shape.rows x shape.cols)
  const float* grad = nullptr;  ///< its gradient, same layout
  float grad_scale = 1.0f;      ///< global-norm clipping factor, applied to every gradient element on read
  float* state = nullptr;       ///< slot 0 of its first element (null when the policy keeps no slots)
  std::size_t stride = 0;       ///< elements between one element's slots (the flat buffer's length)
  tensor_shape shape{};         ///< rows x cols as tensor_traits gave them (a vector is n x 1)

  /// Number of elements.
  std::size_t size() const { return shape.rows * shape.cols; }
};

}  // namespace diloco
