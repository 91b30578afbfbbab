// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

namespace diloco {

/// Reduction applied by all_reduce. Mean is the sum divided by the world size.
enum class reduce_op : std::uint8_t { sum, mean };

/// "sum" or "mean", for messages.
inline constexpr const char* to_string(reduce_op op) { return op == reduce_op::sum ? "sum" : "mean"; }

/// Bytes a ring all-reduce of `bytes` moves per rank in each direction.
inline constexpr std::uint64_t ring_all_reduce_bytes(std::uint64_t bytes, int world) {
  if (world <= 1) return 0;
  const auto m = static_cast<std::uint64_t>(world);
  return 2 * (m - 1) * bytes / m;
}

/// Cumulative bytes a communicator moved for this rank, counted by one set of
/// models whatever algorithm a backend really runs, so figures from different
/// communicators compare: what the operation costs on a network.
struct traffic_counters {
  std::uint64_t bytes_sent = 0;      ///< bytes this rank sent
  std::uint64_t bytes_received = 0;  ///< bytes this rank received

  /// All-reduce: a ring, 2(M-1)/M times the buffer in each direction.
  constexpr void add_all_reduce(std::uint64_t bytes, int world) {
    const std::uint64_t b = ring_all_reduce_bytes(bytes, world);
    bytes_sent += b;
    bytes_received += b;
  }
  /// Broadcast: a pipelined chain root -> root+1 -> ...; every rank but the
  /// last forwards the buffer once, every rank but the root receives it once.
  constexpr void add_broadcast(std::uint64_t bytes, int rank, int root, int world) {
    if (world <= 1) return;
    if (rank != root) bytes_received += bytes;
    if (rank != (root + world - 1) % world) bytes_sent += bytes;
  }
  /// All-to-all and all-gather of `block` bytes per rank: M-1 blocks out and
  /// M-1 blocks in.
  constexpr void add_exchange(std::uint64_t block, int world) {
    const std::uint64_t b = world > 1 ? static_cast<std::uint64_t>(world - 1) * block : 0;
    bytes_sent += b;
    bytes_received += b;
  }
};

}  // namespace diloco
