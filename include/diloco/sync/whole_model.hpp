// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the whole-model schedules (blocking, one_step_delay, eager) share:
// no options, one fragment holding every tensor, nothing to validate.

#include <cstddef>
#include <span>

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"

namespace diloco::sync {

template <schedule_kind Kind, bool Overlaps>
struct whole_model_schedule {
  struct options {};
  static constexpr bool overlaps = Overlaps;
  static constexpr schedule_kind kind = Kind;

  static void validate(const options&, std::size_t, std::size_t) {}
  static fragment_plan plan(const options&, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, 1, 0, fragment_assignment::contiguous, sizes, "a whole-model schedule");
  }
};

}  // namespace diloco::sync
