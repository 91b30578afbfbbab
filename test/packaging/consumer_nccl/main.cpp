// SPDX-License-Identifier: Apache-2.0
// Built against an installed diloco with COMPONENTS nccl: the header and the
// linked library must be the same NCCL, a real unique id must come out of it
// (no GPU needed), and where a GPU exists a world of one must sum.
#include <cstdio>
#include <diloco/comm/nccl.hpp>

int main() {
  static_assert(diloco::device_communicator<diloco::comm::nccl>);
  int linked = 0;
  if (ncclGetVersion(&linked) != ncclSuccess) return 1;
  std::printf("NCCL header %d, library %d\n", NCCL_VERSION_CODE, linked);
  if (linked / 100 != NCCL_VERSION_CODE / 100) return 1;  // major.minor agree
  const ncclUniqueId id = diloco::comm::nccl::make_unique_id();

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: linked and ran without one\n");
    return 0;
  }
  diloco::comm::nccl comm(id, 0, 1, {.device = 0});
  float* x = nullptr;
  const float two = 2.0f;
  float out = 0.0f;
  if (cudaMalloc(reinterpret_cast<void**>(&x), sizeof(float)) != cudaSuccess) return 1;
  cudaMemcpy(x, &two, sizeof two, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  comm.all_reduce(diloco::device_view<float>(x, 1), diloco::reduce_op::sum);
  cudaMemcpy(&out, x, sizeof out, cudaMemcpyDeviceToHost);
  cudaFree(x);
  std::printf("world of one: 2 -> %g\n", static_cast<double>(out));
  return out == 2.0f ? 0 : 1;
}
