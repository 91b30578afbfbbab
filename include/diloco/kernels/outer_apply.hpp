// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/eager_block.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/vec4.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Pass 2 of a round: the outer optimizer step fused with the copy-back.
/// Reads the reduced pseudo-gradient sum, scales it to the mean, updates the
/// outer state and global parameters, and writes the new global value into
/// the worker's replica.
/// Bytes per element with one state slot (Nesterov): read 12 (wire, state,
/// global), write 12 (state, global, local) = 24.
template <class Update, class Merge = merge::overwrite>
struct outer_apply {
  Update update;  ///< the outer optimizer's element step
  const float* DILOCO_RESTRICT reduced;  ///< the reduced pseudo-gradient sum (the wire)
  float scale;  ///< 1/M: the wire holds the sum over workers
  float* DILOCO_RESTRICT global;  ///< theta_global
  float* DILOCO_RESTRICT state;  ///< nullptr when the optimizer keeps none
  std::size_t stride;  ///< elements between an element's slots
  float* DILOCO_RESTRICT local;  ///< the replica
  Merge merge{};  ///< how theta_global reaches the replica (kernels/merge.hpp)

  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    float g = global[i];
    float l = local[i];
    merge::apply_element(update, merge, i, g, mul_rn(reduced[i], scale), state == nullptr ? nullptr : state + i, stride,
                         l);
    global[i] = g;
    local[i] = l;
  }

  /// Elements [begin, end), for an executor that hands a functor whole
  /// ranges where it has this member (exec::host's multi-tensor passes):
  /// eager's merge with SGD-family steps, whose per-element loop does not
  /// vectorize, runs in blocks of 256 in eager_block's form (the mean staged
  /// first); a block whose steps do not fit that form runs per element.
  void range(std::size_t begin, std::size_t end) const
    requires(eager_sgd<std::remove_cv_t<Merge>, std::remove_cv_t<Update>>)
  {
    constexpr std::size_t B = 256;
    float mean[B];
    for (std::size_t i = begin; i < end; i += B) {
      const std::size_t n = std::min(B, end - i);
      for (std::size_t j = 0; j < n; ++j) mean[j] = mul_rn(reduced[i + j], scale);
      if (eager_block<B>(update, merge.shifted(i), global + i, local + i, mean, n, state ? state + i : nullptr))
        continue;
      for (std::size_t j = i; j < i + n; ++j) (*this)(j);
    }
  }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp).
  DILOCO_HD DILOCO_FORCEINLINE void vec4(std::size_t i) const
    requires(vectorizable_update<Update> && Merge::is_overwrite)
  {
    vec4f g = load4(global + i);
    vec4f d = load4_readonly(reduced + i);
    for (std::size_t l = 0; l < vec_width; ++l) d[l] = mul_rn(d[l], scale);
    update4(update, g, d, state == nullptr ? nullptr : state + i, stride);
    store4(global + i, g);
    store4(local + i, g);
  }
  /// Whether the pointers allow 16-byte accesses (and the slot stride keeps them aligned).
  DILOCO_HD bool vec4_aligned() const
    requires(vectorizable_update<Update> && Merge::is_overwrite)
  {
    return aligned16(reduced, global, state, local) && stride_keeps_alignment(state, stride);
  }
};

/// The same step for a world of one: the pseudo-gradient is computed in the
/// pass itself, nothing travels. Bytes per element with one state slot:
/// read 12 (global, local, state), write 12 (state, global, local) = 24.
template <class Update, class Merge = merge::overwrite>
struct outer_apply_local {
  Update update;  ///< the outer optimizer's element step
  float* DILOCO_RESTRICT global;  ///< theta_global
  float* DILOCO_RESTRICT state;  ///< the outer optimizer's slots (null when it keeps none)
  std::size_t stride;  ///< elements between an element's slots
  float* DILOCO_RESTRICT local;  ///< the replica
  Merge merge{};  ///< how theta_global reaches the replica (kernels/merge.hpp)

  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    float g = global[i];
    float l = local[i];
    merge::apply_element(update, merge, i, g, sub_rn(g, l), state == nullptr ? nullptr : state + i, stride, l);
    global[i] = g;
    local[i] = l;
  }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp).
  DILOCO_HD DILOCO_FORCEINLINE void vec4(std::size_t i) const
    requires(vectorizable_update<Update> && Merge::is_overwrite)
  {
    vec4f g = load4(global + i);
    const vec4f x = load4(local + i);
    vec4f d;
    for (std::size_t l = 0; l < vec_width; ++l) d[l] = sub_rn(g[l], x[l]);
    update4(update, g, d, state == nullptr ? nullptr : state + i, stride);
    store4(global + i, g);
    store4(local + i, g);
  }
  /// Whether the pointers allow 16-byte accesses (and the slot stride keeps them aligned).
  DILOCO_HD bool vec4_aligned() const
    requires(vectorizable_update<Update> && Merge::is_overwrite)
  {
    return aligned16(global, state, local) && stride_keeps_alignment(state, stride);
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
