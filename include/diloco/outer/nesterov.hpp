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

/// DiLoCo's outer optimizer: SGD with Nesterov momentum exactly as
/// torch.optim.SGD(nesterov=True, dampening=0) applies it to the averaged
/// pseudo-gradient d:
///   b <- mu*b + d  (b = d on the first round)
///   theta_global <- theta_global - lr * (d + mu*b)
/// Defaults lr 0.7, momentum 0.9 (DiLoCo, arXiv 2311.08105).
struct nesterov {
  /// The hyper-parameters, set with designated initializers ({.lr = 0.5f}).
  struct options {
    float lr = 0.7f;        ///< outer learning rate
    float momentum = 0.9f;  ///< Nesterov momentum factor mu, > 0
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("lr", o.lr);
      f("momentum", o.momentum);
    }
  };

  static constexpr const char* name = "outer nesterov";  ///< the policy's name in checkpoint headers and reports
  /// The slot it is written for (outer; diloco::as_inner moves it).
  static constexpr optimizer_role role = optimizer_role::outer;
  using update = kernels::sgd_update;  ///< the per-element step the executor runs

  /// The same options as the fields kernels::validate_sgd and kernels::make_sgd_update read.
  struct sgd_view {
    ///@{
    /// lr and momentum from the options; no dampening or weight decay; Nesterov on.
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
    ///@}
  };
  /// The options as SGD's: torch.optim.SGD(nesterov=True, dampening=0).
  static sgd_view as_sgd(const options& o) { return {o.lr, o.momentum, 0.0f, 0.0f, true}; }

  /// Throws config_error naming the first option out of range.
  static void validate(const options& o) {
    kernels::validate_sgd(as_sgd(o), "outer nesterov");  // momentum > 0 among them
    // At 1 or more the momentum buffer never forgets a round and grows
    // without bound: the documented range is (0, 1).
    detail::require_unit_interval(o.momentum, "outer nesterov: momentum");
  }
  /// One state slot per parameter: the momentum buffer b.
  static std::size_t state_slots(const options&) { return 1; }
  /// The element step for outer round `step` (from 1; the first sets b = d).
  static update make_update(const options& o, std::uint64_t step) { return kernels::make_sgd_update(as_sgd(o), step); }
};

}  // namespace diloco::outer

DILOCO_EXACT_FP_END
