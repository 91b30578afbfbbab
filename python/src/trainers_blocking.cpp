// SPDX-License-Identifier: Apache-2.0
// The compiled trainers of sync::blocking (trainer_impl.hpp's grid).
#include "trainer_impl.hpp"

namespace diloco::python {
void register_blocking(trainer_registry& r) { register_sync<sync::blocking>(r, "blocking"); }
}  // namespace diloco::python
