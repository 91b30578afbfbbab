// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: device tensors in a translation unit without the CUDA
// backend (<diloco/cuda.hpp>, nvcc).
#include <diloco/diloco.hpp>

void f(diloco::device_view<float> w, diloco::comm::local& comm) {
  diloco::algorithm<diloco::inner::adamw, diloco::outer::nesterov, diloco::compress::none, diloco::comm::local> t(w,
                                                                                                                 comm);
}
