// SPDX-License-Identifier: Apache-2.0
#pragma once

// The argument check comm::gloo runs before each collective: every rank
// all-gathers a 32-byte header describing the call it is making, then all
// ranks judge the same headers with the same function, so they reach the
// same verdict and none is left waiting for a transfer that will not come.

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "diloco/core/error.hpp"

namespace diloco::comm::detail_gloo {

enum class op_code : std::uint32_t { all_reduce = 1, broadcast, all_to_all, all_gather, barrier };

inline constexpr const char* op_name(op_code op) {
  switch (op) {
    case op_code::all_reduce: return "all_reduce";
    case op_code::broadcast: return "broadcast";
    case op_code::all_to_all: return "all_to_all";
    case op_code::all_gather: return "all_gather";
    case op_code::barrier: return "barrier";
  }
  return "unknown operation";
}

struct call_header {
  std::uint32_t op = 0;        // op_code
  std::uint32_t rejected = 0;  // 1: this rank's arguments failed its own checks
  std::uint64_t count = 0;     // floats for all_reduce, bytes otherwise
  std::int64_t arg = 0;        // reduce_op for all_reduce, root for broadcast
  std::uint64_t sequence = 0;  // collectives this rank has entered, this one included
};
static_assert(sizeof(call_header) == 32 && std::is_trivially_copyable_v<call_header>);

// The error every rank raises for these headers, or "" when they agree. A
// rank that rejected its own arguments raises its own config_error; the
// others learn about it here.
inline std::string disagreement(const std::vector<call_header>& all, int rank) {
  const call_header& mine = all[static_cast<std::size_t>(rank)];
  const char* name = op_name(static_cast<op_code>(mine.op));
  auto prefix = [&] { return diloco::detail::concat("diloco: comm::gloo ", name, " on rank ", rank, ": "); };
  const int m = static_cast<int>(all.size());
  for (int k = 0; k < m; ++k)
    if (all[static_cast<std::size_t>(k)].rejected)
      return prefix() + diloco::detail::concat("rank ", k, " rejected its own arguments to ",
                                               op_name(static_cast<op_code>(all[static_cast<std::size_t>(k)].op)),
                                               " (it raised config_error); nothing was exchanged");
  for (int k = 0; k < m; ++k) {
    const call_header& h = all[static_cast<std::size_t>(k)];
    if (h.op != mine.op)
      return prefix() + diloco::detail::concat("rank ", k, " entered ", op_name(static_cast<op_code>(h.op)),
                                               " instead; every rank must call the same collective in the same "
                                               "order");
    if (h.count != mine.count)
      return prefix() + diloco::detail::concat("buffer sizes differ across ranks (rank ", k, " has ", h.count,
                                               ", rank ", rank, " has ", mine.count, ")");
    if (h.arg != mine.arg)
      return prefix() + diloco::detail::concat("ranks disagree on the ",
                                               static_cast<op_code>(mine.op) == op_code::broadcast ? "root"
                                                                                                   : "reduction",
                                               " (rank ", k, " passed ", h.arg, ", rank ", rank, " passed ",
                                               mine.arg, ")");
    if (h.sequence != mine.sequence)
      return prefix() + diloco::detail::concat("ranks are out of step: this is collective #", mine.sequence,
                                               " on rank ", rank, " but #", h.sequence, " on rank ", k,
                                               "; every rank must call the same collectives in the same order");
  }
  return {};
}

}  // namespace diloco::comm::detail_gloo
