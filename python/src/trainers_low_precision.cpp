// SPDX-License-Identifier: Apache-2.0
// The compiled trainers over bf16 and fp16 tensors (a low-precision replica,
// docs/algorithms.md section 6a): sync::blocking, outer {nesterov, sgd}, no
// compression. A smaller grid than fp32's: each set is another instantiation
// of the engine (docs/python.md lists both grids).
#include "trainer_impl.hpp"

namespace diloco::python {
void register_low_precision(registry_of<bfloat16>& bf16, registry_of<float16>& fp16) {
  add_trainer<outer::nesterov, compress::none, sync::blocking, bfloat16>(bf16, "nesterov|none|blocking");
  add_trainer<outer::sgd, compress::none, sync::blocking, bfloat16>(bf16, "sgd|none|blocking");
  add_trainer<outer::nesterov, compress::none, sync::blocking, float16>(fp16, "nesterov|none|blocking");
  add_trainer<outer::sgd, compress::none, sync::blocking, float16>(fp16, "sgd|none|blocking");
}
}  // namespace diloco::python
