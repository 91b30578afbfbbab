// SPDX-License-Identifier: Apache-2.0
// A count above INT_MAX for real (opt-in: DILOCO_TEST_LARGE_COUNTS=ON; it
// needs about 2.2 GB per rank): a byte broadcast of INT_MAX + 17 bytes,
// which MPI's int count cannot describe in one call. Every byte is checked
// against the root's pattern, recomputed on each rank.
#include <doctest/doctest.h>
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <diloco/comm/mpi.hpp>
#include <vector>

namespace {
std::byte pattern(std::size_t i) { return static_cast<std::byte>((i * 131u + (i >> 20)) & 0xffu); }
}  // namespace

TEST_CASE("broadcast of INT_MAX + 17 bytes") {
  diloco::comm::mpi comm(MPI_COMM_WORLD);
  const std::size_t n = static_cast<std::size_t>(INT_MAX) + 17;
  std::vector<std::byte> buf(n, std::byte{0});
  if (comm.rank() == 0)
    for (std::size_t i = 0; i < n; ++i) buf[i] = pattern(i);
  comm.broadcast(std::span<std::byte>(buf), 0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += buf[i] != pattern(i);
  CHECK(wrong == 0);
  // The model counts the whole buffer, once, whatever the number of calls.
  if (comm.rank() != 0) CHECK(comm.traffic().bytes_received == n);
}
