// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: host parameters stepped with device gradients.
#include <diloco/diloco.hpp>

#include <vector>

void f(std::vector<float>& w, diloco::device_view<const float> g) {
  diloco::optimizer<diloco::inner::adamw> opt(w);
  opt.step(g);
}
