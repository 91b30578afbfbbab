// SPDX-License-Identifier: Apache-2.0
// Habits a user brings from PyTorch or guesses at, each stopped by one
// message that names what to write instead (issue 38, item 13); -DCASE_<name>
// picks one (compile_fail_<name> in test/CMakeLists.txt). The header comes as
// -DHEADER=<diloco/diloco.hpp> (expect_short_failure.cmake also counts the
// error lines: the static_assert must be the only error, so the first).
#include HEADER

#include <vector>

namespace dc = diloco;

void train(dc::comm::local& comm) {
  std::vector<float> w(4, 0.0f);
#if defined(CASE_adamw_betas)
  // torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999)), in a constructor call.
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(
      w, comm, {.inner = {.lr = 1e-3f, .betas = {0.9f, 0.999f}, .weight_decay = 0.01f}});
#elif defined(CASE_adamw_betas_optimizer)
  // The same as an optimizer's options variable.
  dc::inner::adamw::options o{.lr = 1e-3f, .betas = {0.9f, 0.999f}};
  dc::optimizer<dc::inner::adamw> opt(w, o);
#elif defined(CASE_blockwise_float)
  // fp32 is no element format of blockwise (compress::none sends fp32).
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::blockwise<float, 128>, dc::comm::local> t(w, comm);
#elif defined(CASE_blockwise_bf16)
  // bf16 is cast<bf16>'s format, not a block format.
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::blockwise<dc::bf16>, dc::comm::local> t(w, comm);
#else
#error "define one CASE_<name>"
#endif
}
