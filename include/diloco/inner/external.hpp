// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/core/optimizer_role.hpp"

namespace diloco::inner {

/// Wrapper mode: the user's own optimizer takes the inner steps
/// (torch::optim::AdamW with its schedulers and clipping, a fused or sharded
/// optimizer, fp32 masters behind a low-precision model: wrap the tensors it
/// updates). It changes the replica tensors in place; `t.step()`, with no
/// gradients, counts the step and runs the schedule. At a round the library
/// reads the replica, forms the pseudo-gradient and writes the schedule's
/// merge back into the same tensors, as with its own inner optimizers;
/// nothing else of the user's is touched, so their optimizer's state carries
/// across rounds (as in the DiLoCo paper). The inner learning rate is the
/// user's: `set_inner_lr`/`inner_lr` are config_errors. A checkpoint holds
/// the library's state; `save(path, writer)` / `load(path, reader)` carry the
/// user's own state in the same file (docs/getting-started.md).
struct external {
  /// No options: the user's optimizer has its own.
  struct options {
    /// No fields (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options&, F&&) {}
  };
  static constexpr const char* name = "external";               ///< the policy's name in messages and checkpoints
  static constexpr optimizer_role role = optimizer_role::inner;  ///< an inner optimizer only
  static constexpr bool user_steps = true;                      ///< the user's optimizer takes the inner steps
  /// Nothing to validate.
  static void validate(const options&) {}
};

}  // namespace diloco::inner
