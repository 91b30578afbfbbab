// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/sync/concepts.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/sync/whole_model.hpp"

namespace diloco::sync {

/// DiLoCo's round (Douillard et al. 2023, Algorithm 1). After
/// every H inner steps the whole model's pseudo-gradient is reduced, the
/// outer step applied and every replica overwritten with theta_global, all
/// before the next inner step. The default schedule.
struct blocking : whole_model_schedule<schedule_kind::periodic, false> {
  static constexpr const char* name = "blocking";  ///< the schedule's name in messages, checkpoint headers and reports
};

}  // namespace diloco::sync
