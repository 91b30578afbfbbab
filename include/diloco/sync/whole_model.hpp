// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <span>

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"

namespace diloco::sync {

/// What the whole-model schedules (blocking, one_step_delay, eager) share:
/// no options, one fragment holding every tensor, nothing to validate.
template <schedule_kind Kind, bool Overlaps>
struct whole_model_schedule {
  /// No options.
  struct options {};
  static constexpr bool overlaps = Overlaps;   ///< whether a reduction stays in flight while inner steps run
  static constexpr schedule_kind kind = Kind;  ///< periodic (blocking) or delayed (one_step_delay, eager)

  /// Nothing to validate.
  static void validate(const options&, std::size_t, std::size_t) {}
  /// One fragment holding every tensor, applied after every H-th step.
  static fragment_plan plan(const options&, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, 1, 0, fragment_assignment::contiguous, sizes, "a whole-model schedule");
  }
};

}  // namespace diloco::sync
