// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "diloco/core/optimizer_role.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/kernels/adamw_update.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::inner {

/// What `.betas = {...}` (PyTorch's `betas=(0.9, 0.999)`) initializes in
/// adamw::options: nothing. The two decay rates are the separate fields
/// beta1 and beta2, so a checkpoint header, a report and the option checks
/// name each; a braced pair here fails to compile with a message saying so
/// (without this member the compiler only says that the list does not
/// convert, naming neither field). Empty, and takes no room in options.
struct adamw_betas_refused {
  /// What options{} and every designated list without `.betas` make.
  constexpr adamw_betas_refused() = default;
  /// `.betas = {b1, b2}`: does not compile, naming beta1 and beta2.
  template <class... A>
    requires(sizeof...(A) > 0)
  constexpr adamw_betas_refused(A&&...) {
    static_assert(sizeof...(A) == 0,
                  "diloco::inner::adamw::options has no `betas` pair (PyTorch's betas=(b1, b2)): set the two "
                  "fields beta1 and beta2, e.g. {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f}");
  }
};

/// AdamW with PyTorch's semantics (torch.optim.AdamW, amsgrad=False). The
/// defaults are DiLoCo's inner optimizer: lr 4e-4, betas (0.9, 0.95),
/// weight decay 0.1, eps 1e-8.
struct adamw {
  /// The hyper-parameters, set with designated initializers ({.lr = 1e-3f}).
  struct options {
    float lr = 4e-4f;           ///< learning rate
    float beta1 = 0.9f;         ///< decay rate of the first-moment (mean) estimate
    float beta2 = 0.95f;        ///< decay rate of the second-moment (uncentered variance) estimate
    /// Not an option: `.betas = {b1, b2}` stops the compiler with a message
    /// naming beta1 and beta2 (adamw_betas_refused). Declared here, between
    /// beta2 and eps, so that PyTorch's order (lr, betas, eps,
    /// weight_decay) reaches it rather than an error about designator order.
    [[no_unique_address]] adamw_betas_refused betas{};
    float eps = 1e-8f;          ///< added to the second moment's square root in the denominator
    float weight_decay = 0.1f;  ///< decoupled weight decay: p <- p - lr * weight_decay * p before the Adam step
    /// Global-norm gradient clipping as torch.nn.utils.clip_grad_norm_ does
    /// it, over all parameters of the worker; 0 disables it.
    float max_grad_norm = 0.0f;
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("lr", o.lr);
      f("beta1", o.beta1);
      f("beta2", o.beta2);
      f("eps", o.eps);
      f("weight_decay", o.weight_decay);
      f("max_grad_norm", o.max_grad_norm);
    }
  };

  static constexpr const char* name = "adamw";  ///< the policy's name in checkpoint headers and reports
  /// The slot it is written for (inner; diloco::as_outer moves it).
  static constexpr optimizer_role role = optimizer_role::inner;
  using update = kernels::adamw_update;  ///< the per-element step the executor runs

  /// Throws config_error naming the first option out of range.
  static void validate(const options& o) {
    detail::require_non_negative(o.lr, "adamw: lr");
    detail::require_unit_interval(o.beta1, "adamw: beta1");
    detail::require_unit_interval(o.beta2, "adamw: beta2");
    detail::require_non_negative(o.eps, "adamw: eps");
    detail::require_non_negative(o.weight_decay, "adamw: weight_decay");
    detail::require_non_negative(o.max_grad_norm, "adamw: max_grad_norm");
  }

  /// Two state slots per parameter: the first and second moment estimates.
  static std::size_t state_slots(const options&) { return 2; }

  /// `step` counts this optimizer's steps from 1.
  static update make_update(const options& o, std::uint64_t step) {
    const double t = static_cast<double>(step);
    const double lr = o.lr;
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
    update u;
    u.decay = static_cast<float>(1.0 - lr * static_cast<double>(o.weight_decay));
    u.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(o.beta1));
    u.beta2 = o.beta2;
    u.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(o.beta2));
    u.step_size = static_cast<float>(lr / bias_correction1);
    u.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    u.eps = o.eps;
    return u;
  }
};

}  // namespace diloco::inner

DILOCO_EXACT_FP_END
