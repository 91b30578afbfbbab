#pragma once

#include <cstddef>
#include <cstdint>

namespace diloco {

// Reduction applied by all_reduce. Mean is the sum divided by the world size.
enum class reduce_op : std::uint8_t { sum, mean };

inline constexpr const char* to_string(reduce_op op) { return op == reduce_op::sum ? "sum" : "mean"; }

// Cumulative bytes a communicator moved for this rank. For all-reduce the
// count is that of a ring all-reduce, 2(M-1)/M times the buffer, sent and
// received: it is what the operation costs on a network whatever algorithm
// the backend uses, so numbers from different communicators compare.
struct traffic_counters {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

// Bytes a ring all-reduce of `bytes` moves per rank in each direction.
inline constexpr std::uint64_t ring_all_reduce_bytes(std::uint64_t bytes, int world) {
  if (world <= 1) return 0;
  const auto m = static_cast<std::uint64_t>(world);
  return 2 * (m - 1) * bytes / m;
}

}  // namespace diloco
