// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "diloco/core/optimizer_role.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/kernels/sgd_policy.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::outer {

/// Outer SGD over the averaged pseudo-gradient, PyTorch semantics. The
/// defaults (lr 1, no momentum) make the outer step plain model averaging:
/// theta_global <- theta_global - mean(theta_global - theta_local) =
/// mean(theta_local), i.e. FedAvg.
struct sgd {
  /// The hyper-parameters, set with designated initializers ({.lr = 0.7f, .momentum = 0.9f}).
  struct options {
    float lr = 1.0f;            ///< outer learning rate (1 with no momentum: plain averaging)
    float momentum = 0.0f;      ///< momentum factor; 0: no state
    float dampening = 0.0f;     ///< dampening of the pseudo-gradient in the momentum buffer
    float weight_decay = 0.0f;  ///< L2 penalty: weight_decay * theta added to the pseudo-gradient
    bool nesterov = false;      ///< Nesterov momentum (needs momentum > 0 and dampening 0)
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("lr", o.lr);
      f("momentum", o.momentum);
      f("dampening", o.dampening);
      f("weight_decay", o.weight_decay);
      f("nesterov", o.nesterov);
    }
  };

  static constexpr const char* name = "outer sgd";  ///< the policy's name in checkpoint headers and reports
  /// The slot it is written for (outer; diloco::as_inner moves it).
  static constexpr optimizer_role role = optimizer_role::outer;
  using update = kernels::sgd_update;  ///< the per-element step the executor runs

  /// Throws config_error naming the first option out of range.
  static void validate(const options& o) {
    kernels::validate_sgd(o, "outer sgd");
    // At 1 or more the momentum buffer never forgets a round and grows
    // without bound: the documented range is [0, 1).
    detail::require_unit_interval(o.momentum, "outer sgd: momentum");
  }
  /// One state slot per parameter (the momentum buffer), none without momentum.
  static std::size_t state_slots(const options& o) { return o.momentum != 0.0f ? 1 : 0; }
  /// The element step for outer round `step` (from 1).
  static update make_update(const options& o, std::uint64_t step) { return kernels::make_sgd_update(o, step); }
};

}  // namespace diloco::outer

DILOCO_EXACT_FP_END
