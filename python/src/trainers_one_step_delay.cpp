// SPDX-License-Identifier: Apache-2.0
// The compiled trainers of sync::one_step_delay (trainer_impl.hpp's grid).
#include "trainer_impl.hpp"

namespace diloco::python {
void register_one_step_delay(trainer_registry& r) { register_sync<sync::one_step_delay>(r, "one_step_delay"); }
}  // namespace diloco::python
