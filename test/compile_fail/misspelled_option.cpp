// SPDX-License-Identifier: Apache-2.0
// A misspelled option in the constructor call (.learning_rate for .lr)
// must not compile, and the same call spelled right (-DSPELLED_RIGHT, the
// control compile_ok_misspelled_option_control) must: so the failure is the
// spelling and nothing else in the call. The value 0.125 is exact in
// binary, so GCC's message, which drops the designators of the braced list
// that does not convert (GCC 12), names that list by its value: {{1.25e-1f}}.
#include <diloco/diloco.hpp>

#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;

void train(dc::comm::threads& comm) {
  std::vector<float> w(2, 0.0f);
#if defined(SPELLED_RIGHT)
  trainer t(w, comm, {.inner = {.lr = 0.125f}});
#else
  trainer t(w, comm, {.inner = {.learning_rate = 0.125f}});
#endif
}
