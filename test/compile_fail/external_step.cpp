// SPDX-License-Identifier: Apache-2.0
// Wrapper mode's misuse (issue 40 item 1): step(grads) with inner::external
// (the user's optimizer takes the step), and step() without gradients with
// a library inner optimizer: each one static_assert naming the rule.
#include HEADER

#include <vector>

namespace dc = diloco;

int main() {
  std::vector<float> w(4);
  dc::comm::local comm;
#if defined(CASE_grads_with_external)
  dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(w, comm);
  std::vector<float> g(4);
  t.step(g);
#elif defined(CASE_no_grads_with_internal)
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(w, comm);
  t.step();
#else
#error "define one CASE_<name>"
#endif
}
