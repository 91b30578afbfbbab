// SPDX-License-Identifier: Apache-2.0
#pragma once

// The fused passes over a whole list of tensors (exec/chunks.hpp): each is a
// multi-tensor functor whose bind(k) returns tensor k's element functor
// (kernels/inner_step.hpp, pseudo_gradient.hpp, outer_apply.hpp, merge.hpp)
// with its pointers moved to tensor k. The bytes each element moves are the
// element functor's; the chunk table adds none.

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/inner_step.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/outer_apply.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Every tensor's data pointer and its start in the flat buffers (theta
/// global, optimizer state, the wire), as arrays in the executor's memory.
struct tensor_ptrs {
  float* const* data = nullptr;         ///< data[k]: tensor k's first element
  const std::size_t* offset = nullptr;  ///< offset[k]: where tensor k starts in the flat buffers
};

/// One inner optimizer step on every tensor (gradients scaled on read).
template <class Update>
struct inner_steps {
  Update update;  ///< the optimizer's element step
  tensor_ptrs params;  ///< the parameter tensors
  const float* const* grads;  ///< grads[k]: tensor k's gradients
  float grad_scale;  ///< the clipping scale applied to every gradient on read
  float* state;  ///< slot s of flat element j at state[s * stride + j]; null when none
  std::size_t stride;  ///< elements between an element's slots
  /// Tensor k's pass (kernels::inner_step).
  DILOCO_HD DILOCO_FORCEINLINE inner_step<Update> bind(std::size_t k) const {
    return {update, params.data[k], grads[k], grad_scale, state == nullptr ? nullptr : state + params.offset[k], stride};
  }
};

/// Sum of squares of every gradient (global-norm clipping).
struct squares_of {
  const float* const* x;  ///< x[k]: tensor k's gradients
  /// Tensor k's pass (kernels::squares).
  DILOCO_HD DILOCO_FORCEINLINE squares bind(std::size_t k) const { return {x[k]}; }
};

/// delta = ref - local into the wire, returning delta^2 (pass 1 of a round).
struct pseudo_gradients {
  const float* ref;   ///< the flat reference (theta_global, or a schedule's anchor)
  tensor_ptrs local;  ///< the replica's tensors
  float* out;         ///< the flat wire
  /// Tensor k's pass (kernels::pseudo_gradient).
  DILOCO_HD DILOCO_FORCEINLINE pseudo_gradient bind(std::size_t k) const {
    const std::size_t off = local.offset[k];
    return {ref + off, local.data[k], out + off};
  }
};

/// (ref - local)^2 alone (a world of one: nothing travels).
struct pseudo_gradients_sq {
  const float* ref;   ///< the flat reference (theta_global, or a schedule's anchor)
  tensor_ptrs local;  ///< the replica's tensors
  /// Tensor k's pass (kernels::pseudo_gradient_sq).
  DILOCO_HD DILOCO_FORCEINLINE pseudo_gradient_sq bind(std::size_t k) const {
    return {ref + local.offset[k], local.data[k]};
  }
};

/// The outer step on theta_global with the reduced sum, merged into the
/// replica (pass 2 of a round).
template <class Update, class Merge>
struct outer_applies {
  Update update;         ///< the outer optimizer's element step
  const float* reduced;  ///< the flat reduced sum (the wire)
  float scale;           ///< 1/M: the wire holds the sum over workers
  float* global;         ///< theta_global, flat
  float* state;          ///< the outer optimizer's slots, flat (null when it keeps none)
  std::size_t stride;    ///< elements between an element's slots
  tensor_ptrs local;     ///< the replica's tensors
  Merge merge;           ///< how theta_global reaches the replica, indexed in the flat layout
  /// Tensor k's pass (kernels::outer_apply), the merge shifted to the tensor's offset.
  DILOCO_HD DILOCO_FORCEINLINE outer_apply<Update, Merge> bind(std::size_t k) const {
    const std::size_t off = local.offset[k];
    return {update, reduced + off, scale,          global + off,
            state == nullptr ? nullptr : state + off, stride, local.data[k], merge.shifted(off)};
  }
};

/// The same for a world of one (the pseudo-gradient computed in the pass).
template <class Update, class Merge>
struct outer_applies_local {
  Update update;       ///< the outer optimizer's element step
  float* global;       ///< theta_global, flat
  float* state;        ///< the outer optimizer's slots, flat (null when it keeps none)
  std::size_t stride;  ///< elements between an element's slots
  tensor_ptrs local;   ///< the replica's tensors
  Merge merge;         ///< how theta_global reaches the replica, indexed in the flat layout
  /// Tensor k's pass (kernels::outer_apply_local), the merge shifted to the tensor's offset.
  DILOCO_HD DILOCO_FORCEINLINE outer_apply_local<Update, Merge> bind(std::size_t k) const {
    const std::size_t off = local.offset[k];
    return {update, global + off, state == nullptr ? nullptr : state + off, stride, local.data[k], merge.shifted(off)};
  }
};

/// flat <- tensors (theta_global and the schedules' anchors from the replica).
struct gather_tensors {
  tensor_ptrs tensors;  ///< the tensors read
  float* flat;          ///< the flat buffer written
  /// Tensor k's pass (kernels::copy).
  DILOCO_HD DILOCO_FORCEINLINE copy bind(std::size_t k) const { return {tensors.data[k], flat + tensors.offset[k]}; }
};

/// tensors <- flat (a refused round resets the replica to theta_global).
struct scatter_tensors {
  const float* flat;    ///< the flat buffer read
  tensor_ptrs tensors;  ///< the tensors written
  /// Tensor k's pass (kernels::copy).
  DILOCO_HD DILOCO_FORCEINLINE copy bind(std::size_t k) const { return {flat + tensors.offset[k], tensors.data[k]}; }
};

/// 1 for each non-finite element of every tensor.
struct non_finite_in {
  tensor_ptrs tensors;  ///< the tensors checked
  /// Tensor k's pass (kernels::count_non_finite).
  DILOCO_HD DILOCO_FORCEINLINE count_non_finite bind(std::size_t k) const { return {tensors.data[k]}; }
};

/// The eager step alone over every tensor (sync::eager, a phase end with
/// nothing in flight).
template <class Step>
struct eager_advances {
  merge::eager<Step> merge;  ///< the eager merge, indexed in the flat layout
  tensor_ptrs local;         ///< the replica's tensors
  /// Tensor k's pass (merge::eager_advance), the merge shifted to the tensor's offset.
  DILOCO_HD DILOCO_FORCEINLINE merge::eager_advance<Step> bind(std::size_t k) const {
    return {merge.shifted(local.offset[k]), local.data[k]};
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
