// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: comm::nccl reads and writes device memory only, so a
// host buffer passed to all_reduce is rejected at compile time. With
// DILOCO_PASS_DEVICE_VIEW the same call over a device view must compile.
#include <diloco/comm/nccl.hpp>

#include <span>
#include <vector>

void reduce(diloco::comm::nccl& comm, std::vector<float>& host, float* device_ptr) {
#ifdef DILOCO_PASS_DEVICE_VIEW
  comm.all_reduce(diloco::device_view<float>(device_ptr, host.size()), diloco::reduce_op::sum);
#else
  (void)device_ptr;
  comm.all_reduce(std::span<float>(host), diloco::reduce_op::sum);
#endif
}
