// SPDX-License-Identifier: Apache-2.0
// Mistakes a user makes in naming the algorithm or passing its arguments;
// -DCASE_<name> picks one. Each must fail to compile with a message naming
// the rule (compile_fail_<name> in test/CMakeLists.txt), except
// CASE_as_outer_on_purpose, which must compile.
#include <diloco/diloco.hpp>

#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;

void train(dc::comm::threads& comm) {
  std::vector<float> w(2, 0.0f), g(2, 1.0f);
#if defined(CASE_const_parameters)
  const std::vector<float> frozen(2, 0.0f);
  trainer t(frozen, comm);
#elif defined(CASE_int_parameters)
  std::vector<int> counts(2, 0);
  trainer t(counts, comm);
#elif defined(CASE_bf16_internal_inner)
  std::vector<dc::bfloat16> half(2);
  trainer t(half, comm);
#elif defined(CASE_bf16_external)
  std::vector<dc::bfloat16> half(2);
  dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(half, comm);
  t.step();
#elif defined(CASE_host_outer_of_host_tensors)
  dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
      dc::outer_state_on_host(w), comm);
#elif defined(CASE_host_outer_internal_inner)
  trainer t(dc::outer_state_on_host(w), comm);
#elif defined(CASE_int_gradients)
  std::vector<int> counts(2, 1);
  trainer t(w, comm);
  t.step(counts);
#elif defined(CASE_outer_as_inner)
  dc::algorithm<dc::outer::nesterov, dc::inner::adamw, dc::compress::none, dc::comm::threads> t(w, comm);
#elif defined(CASE_inner_as_outer)
  dc::algorithm<dc::inner::adamw, dc::inner::sgd, dc::compress::none, dc::comm::threads> t(w, comm);
#elif defined(CASE_as_outer_on_purpose)
  dc::algorithm<dc::inner::adamw, dc::as_outer<dc::inner::sgd>, dc::compress::none, dc::comm::threads> t(
      w, comm, {.outer = {.lr = 0.7f, .momentum = 0.9f, .nesterov = true}});
  t.step(g);
#elif defined(CASE_misspelled_option)
  trainer t(w, comm, {.inner = {.learning_rate = 1e-3f}});
#elif defined(CASE_misspelled_option_declared)
  trainer::options opts{.inner = {.learning_rate = 1e-3f}};
  trainer t(w, comm, opts);
#else
#error "define one CASE_<name>"
#endif
}
