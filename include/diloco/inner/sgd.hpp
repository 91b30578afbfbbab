// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "diloco/core/optimizer_role.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/kernels/sgd_policy.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::inner {

/// SGD with PyTorch's semantics (torch.optim.SGD): momentum, dampening,
/// Nesterov, L2 weight decay added to the gradient.
struct sgd {
  /// The hyper-parameters, set with designated initializers ({.lr = 1e-2f, .momentum = 0.9f}).
  struct options {
    float lr = 1e-3f;           ///< learning rate
    float momentum = 0.0f;      ///< momentum factor; 0: plain SGD, with no state
    float dampening = 0.0f;     ///< dampening of the gradient in the momentum buffer
    float weight_decay = 0.0f;  ///< L2 penalty: weight_decay * p added to the gradient
    bool nesterov = false;      ///< Nesterov momentum (needs momentum > 0 and dampening 0)
    /// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_); 0 disables it.
    float max_grad_norm = 0.0f;
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("lr", o.lr);
      f("momentum", o.momentum);
      f("dampening", o.dampening);
      f("weight_decay", o.weight_decay);
      f("nesterov", o.nesterov);
      f("max_grad_norm", o.max_grad_norm);
    }
  };

  static constexpr const char* name = "sgd";  ///< the policy's name in checkpoint headers and reports
  /// The slot it is written for (inner; diloco::as_outer moves it).
  static constexpr optimizer_role role = optimizer_role::inner;
  using update = kernels::sgd_update;  ///< the per-element step the executor runs

  /// Throws config_error naming the first option out of range.
  static void validate(const options& o) {
    kernels::validate_sgd(o, "inner sgd");
    // At 1 or more the momentum buffer never forgets a gradient and grows
    // without bound: the documented range is [0, 1).
    detail::require_unit_interval(o.momentum, "inner sgd: momentum");
    detail::require_non_negative(o.max_grad_norm, "inner sgd: max_grad_norm");
  }
  /// One state slot per parameter (the momentum buffer), none without momentum.
  static std::size_t state_slots(const options& o) { return o.momentum != 0.0f ? 1 : 0; }
  /// The element step for this optimizer's step number `step` (from 1).
  static update make_update(const options& o, std::uint64_t step) { return kernels::make_sgd_update(o, step); }
};

}  // namespace diloco::inner

DILOCO_EXACT_FP_END
