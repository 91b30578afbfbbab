#pragma once

// sync::blocking: DiLoCo's round (Douillard et al. 2023, Algorithm 1). After
// every H inner steps the whole model's pseudo-gradient is reduced, the
// outer step applied and every replica overwritten with theta_global, all
// before the next inner step. The default schedule.

#include <cstddef>
#include <span>

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"

namespace diloco::sync {

struct blocking {
  struct options {};
  static constexpr const char* name = "blocking";
  static constexpr bool overlaps = false;
  static constexpr schedule_kind kind = schedule_kind::periodic;

  static void validate(const options&, std::size_t, std::size_t) {}
  static fragment_plan plan(const options&, std::size_t H, std::span<const std::size_t> sizes) {
    return fragment_plan::make(H, 1, 0, fragment_assignment::contiguous, sizes, name);
  }
};

}  // namespace diloco::sync
