// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace diloco {

/// Which slot of diloco::algorithm an optimizer policy is written for. Inner
/// and outer optimizers have the same shape, but not the same defaults
/// (inner::sgd's lr is 1e-3, outer::sgd's is 1: model averaging), so each of
/// the library's policies names its role (`static constexpr optimizer_role
/// role`) and diloco::algorithm refuses it in the other slot: swapped
/// optimizers do not compile. A policy without `role` fits either slot
/// (`any`); as_inner<O> and as_outer<O> (core/concepts.hpp) put a policy in
/// the other slot on purpose.
enum class optimizer_role { inner, outer, any };

}  // namespace diloco
