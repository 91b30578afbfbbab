// SPDX-License-Identifier: Apache-2.0
// The compiled trainers of sync::streaming (trainer_impl.hpp's grid).
#include "trainer_impl.hpp"

namespace diloco::python {
void register_streaming(trainer_registry& r) { register_sync<sync::streaming>(r, "streaming"); }
}  // namespace diloco::python
