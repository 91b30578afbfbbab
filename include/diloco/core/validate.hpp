// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>

#include "diloco/core/error.hpp"

namespace diloco::detail {

// Option checks shared by the policies. Each names the option and the range
// it must lie in, so a bad value is found from the message alone.
inline void require_non_negative(double value, const char* what) {
  if (!(value >= 0.0) || !std::isfinite(value))
    raise<config_error>(what, " must be a finite number >= 0, got ", value);
}

inline void require_positive(double value, const char* what) {
  if (!(value > 0.0) || !std::isfinite(value)) raise<config_error>(what, " must be a finite number > 0, got ", value);
}

// 0 <= value < 1, as a momentum or an Adam beta must be.
inline void require_unit_interval(double value, const char* what) {
  if (!(value >= 0.0 && value < 1.0)) raise<config_error>(what, " must lie in [0, 1), got ", value);
}

}  // namespace diloco::detail
