// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "diloco/core/optimizer_role.hpp"
#include "diloco/kernels/sgd_policy.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::outer {

/// Outer SGD over the averaged pseudo-gradient, PyTorch semantics. The
/// defaults (lr 1, no momentum) make the outer step plain model averaging:
/// theta_global <- theta_global - mean(theta_global - theta_local) =
/// mean(theta_local), i.e. FedAvg.
struct sgd {
  struct options {
    float lr = 1.0f;
    float momentum = 0.0f;
    float dampening = 0.0f;
    float weight_decay = 0.0f;
    bool nesterov = false;
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

  static constexpr const char* name = "outer sgd";
  static constexpr optimizer_role role = optimizer_role::outer;
  using update = kernels::sgd_update;

  static void validate(const options& o) { kernels::validate_sgd(o, "outer sgd"); }
  static std::size_t state_slots(const options& o) { return o.momentum != 0.0f ? 1 : 0; }
  static update make_update(const options& o, std::uint64_t step) { return kernels::make_sgd_update(o, step); }
};

}  // namespace diloco::outer

DILOCO_EXACT_FP_END
