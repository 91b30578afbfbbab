// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "diloco/core/validate.hpp"
#include "diloco/kernels/sgd_update.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// What inner::sgd, outer::sgd and outer::nesterov share: PyTorch's SGD
/// checks and the update functor built from an options struct with the
/// fields lr, momentum, dampening, weight_decay, nesterov.
template <class Options>
void validate_sgd(const Options& o, const char* who) {
  diloco::detail::require_non_negative(o.lr, diloco::detail::concat(who, ": lr").c_str());
  diloco::detail::require_non_negative(o.momentum, diloco::detail::concat(who, ": momentum").c_str());
  diloco::detail::require_non_negative(o.dampening, diloco::detail::concat(who, ": dampening").c_str());
  diloco::detail::require_non_negative(o.weight_decay, diloco::detail::concat(who, ": weight_decay").c_str());
  if (o.nesterov && (o.momentum <= 0.0f || o.dampening != 0.0f))
    diloco::detail::raise<config_error>(who, ": Nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ",
                                o.momentum, ", dampening ", o.dampening, ")");
}

/// The element step for step number `step` (from 1) of an SGD policy's options.
template <class Options>
sgd_update make_sgd_update(const Options& o, std::uint64_t step) {
  sgd_update u;
  u.lr = o.lr;
  u.momentum = o.momentum;
  u.one_minus_dampening = static_cast<float>(1.0 - static_cast<double>(o.dampening));
  u.weight_decay = o.weight_decay;
  const bool first = step <= 1;
  u.carry = first ? 0.0f : o.momentum;
  u.gain = first ? 1.0f : u.one_minus_dampening;
  u.keep = o.nesterov ? 1.0f : 0.0f;
  u.through = o.nesterov ? o.momentum : 1.0f;
  return u;
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
