// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "diloco/core/error.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/core/optimizer_role.hpp"
#include "diloco/core/validate.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::outer {

/// The delayed Nesterov outer step of asynchronous local-SGD (Liu et al.
/// 2024, arXiv 2401.09135, "DN"), for the delayed schedules
/// (sync::one_step_delay, sync::delayed), whose outer step sees means one
/// round old. Nesterov momentum applied at every outer step re-applies the
/// stale direction each round; here the momentum buffer m is updated, and
/// applied, only every N-th outer step (N = `period`), with the mean of the
/// N pseudo-gradients since, while every step applies its own mean d at a
/// weight of 1/N without momentum. Outer step t (from 1), per element, with
/// a the sum of the period's means so far (slot 1, zero at the start):
///   a <- a + d
///   t mod N != 0:  theta_global <- theta_global - lr * (d / N)
///   t mod N == 0:  m <- mu*m + a / N;  a <- 0;
///                  theta_global <- theta_global - lr * (d / N + mu*m)
/// Over a period theta_global moves by -lr * (mean of the period's d +
/// mu*m): one Nesterov step on the period's average. N = 1 is
/// outer::nesterov (torch.optim.SGD(nesterov=True)) bit for bit: m starts at
/// zero, so the first step sets m = d. Defaults lr 0.7, momentum 0.9, N = 2.
/// The step count t is the fragment's outer step count, which checkpoints
/// keep; m and a are the two state slots. Any schedule takes it (it is an
/// outer optimizer like the others); it was written, tested and measured
/// for one_step_delay.
struct delayed_nesterov {
  /// The hyper-parameters, set with designated initializers ({.period = 3}).
  struct options {
    float lr = 0.7f;            ///< outer learning rate
    float momentum = 0.9f;      ///< Nesterov momentum factor mu, in (0, 1)
    std::uint32_t period = 2;   ///< N: outer steps per momentum update, >= 1
    /// Every field by name (core/options.hpp's visit_options customisation point).
    template <class F>
    friend void visit_options(const options& o, F&& f) {
      f("lr", o.lr);
      f("momentum", o.momentum);
      f("period", o.period);
    }
  };

  /// The per-element step of one outer step; slot 0 is m, slot 1 is a.
  struct update {
    float lr = 0.0f;        ///< learning rate
    float momentum = 0.0f;  ///< mu
    float n = 1.0f;         ///< N, as a float (the divisor of d and a)
    bool milestone = true;  ///< t mod N == 0: update and apply m, clear a

    /// One element: p is theta_global, d the mean pseudo-gradient, s the
    /// element's slots (m at s[0], a at s[stride]). Each operation rounded
    /// on its own (core/exact_float.hpp), so a device gives the host's bits.
    DILOCO_HD DILOCO_FORCEINLINE void operator()(float& p, float d, float* s, std::size_t stride) const {
      const float share = kernels::div_rn(d, n);
      if (milestone) {
        const float a = kernels::add_rn(s[stride], d);
        const float m = kernels::add_rn(kernels::mul_rn(momentum, s[0]), kernels::div_rn(a, n));
        s[0] = m;
        s[stride] = 0.0f;
        p = kernels::sub_rn(p, kernels::mul_rn(lr, kernels::add_rn(share, kernels::mul_rn(momentum, m))));
      } else {
        s[stride] = kernels::add_rn(s[stride], d);
        p = kernels::sub_rn(p, kernels::mul_rn(lr, share));
      }
    }
  };

  static constexpr const char* name = "outer delayed_nesterov";  ///< the policy's name in checkpoint headers and reports
  /// The slot it is written for (outer).
  static constexpr optimizer_role role = optimizer_role::outer;

  /// Throws config_error naming the first option out of range: lr >= 0,
  /// momentum in (0, 1), period in [1, 2^20].
  static void validate(const options& o) {
    detail::require_non_negative(o.lr, "outer delayed_nesterov: lr");
    if (!(o.momentum > 0.0f))
      detail::raise<config_error>("outer delayed_nesterov: momentum must be in (0, 1), got ", o.momentum);
    detail::require_unit_interval(o.momentum, "outer delayed_nesterov: momentum");
    if (o.period < 1 || o.period > (1u << 20))
      detail::raise<config_error>("outer delayed_nesterov: period (N) must be in [1, 1048576], got ", o.period);
  }
  /// Two state slots per parameter: the momentum buffer m and the period's sum a.
  static std::size_t state_slots(const options&) { return 2; }
  /// The element step for outer step `step` (from 1).
  static update make_update(const options& o, std::uint64_t step) {
    update u;
    u.lr = o.lr;
    u.momentum = o.momentum;
    u.n = static_cast<float>(o.period);
    u.milestone = step % o.period == 0;
    return u;
  }
};

}  // namespace diloco::outer

DILOCO_EXACT_FP_END
