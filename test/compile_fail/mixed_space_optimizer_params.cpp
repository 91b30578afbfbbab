// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a host optimizer (exec::host) over device tensors.
#include <diloco/diloco.hpp>

void f(diloco::device_view<float> w) { diloco::optimizer<diloco::inner::adamw> opt(w); }
