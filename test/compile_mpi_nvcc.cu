// SPDX-License-Identifier: Apache-2.0
// comm::mpi compiled by nvcc (where __CUDACC__ turns the device overloads
// on): every operation instantiated, host and device. Built, never run; the
// behaviour is tested by test_comm_mpi_cuda.
#include <diloco/comm/mpi.hpp>

static_assert(diloco::communicator<diloco::comm::mpi>);
static_assert(diloco::device_communicator<diloco::comm::mpi>);

void diloco_mpi_every_operation(diloco::comm::mpi& c, float* df, std::byte* db, std::size_t n) {
  diloco::device_view<float> f{df, n};
  diloco::device_view<std::byte> b{db, n};
  std::vector<float> hf(n);
  std::vector<std::byte> hb(n), hr(n * static_cast<std::size_t>(c.size()));
  c.all_reduce(f, diloco::reduce_op::mean);
  c.broadcast(f, 0);
  c.broadcast(b, 0);
  c.all_to_all(diloco::device_view<const std::byte>(b), b);
  c.all_gather(diloco::device_view<const std::byte>(b), b);
  c.iall_reduce(f, diloco::reduce_op::sum).wait();
  c.ibroadcast(f, 0).wait();
  c.ibroadcast(b, 0).wait();
  c.iall_to_all(diloco::device_view<const std::byte>(b), b).wait();
  c.iall_gather(diloco::device_view<const std::byte>(b), b).wait();
  c.all_reduce(hf, diloco::reduce_op::sum);
  c.broadcast(std::span<float>(hf), 0);
  c.all_gather(hb, hr);
  c.ibarrier().wait();
}
