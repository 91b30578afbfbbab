// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: inner::muon over device tensors without
// <diloco/inner/muon_cuda.hpp> (its cuBLAS step) stops the compiler with a
// message naming the header and the library to link.
#include <diloco/cuda.hpp>

int main() {
  diloco::device_view<float> w(nullptr, 0);
  diloco::optimizer<diloco::inner::muon, diloco::exec::cuda> opt(w);
  opt.step(w);
}
