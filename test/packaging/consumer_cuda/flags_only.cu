// SPDX-License-Identifier: Apache-2.0
// The smallest user of diloco::cuda: a .cu file that links it and sets no
// C++ standard of its own. packaging_cuda_consumer_pip_cmake builds it with
// a newer CMake and CMAKE_CUDA_STANDARD 20 to check the flags nvcc gets
// (exactly one -std, C++20); packaging_cuda_consumer builds main.cu, the
// guide's GPU code, with the same flags' logic on this machine's CMake.
#include <cstdio>
#include <diloco/version.hpp>

static_assert(__cplusplus >= 202002L, "diloco::cuda compiles this file as C++20");

__global__ void touch(int* x) { *x = DILOCO_VERSION; }

int main() {
  std::printf("diloco %d: compiled as C++%ld\n", DILOCO_VERSION, static_cast<long>(__cplusplus / 100 % 100));
  return 0;
}
