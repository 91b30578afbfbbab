// SPDX-License-Identifier: Apache-2.0
#pragma once

// The collectives every communicator runs, by one name, and the checks a
// rank makes of its own arguments before it enters one. Each check returns
// what is wrong ("" when nothing is), without the "diloco: " prefix, so a
// communicator may carry it into the agreement (agreement.hpp: the other
// ranks then fail at once, naming it) or raise it as it stands.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm::detail {

/// The collectives ranks agree on. A float and a byte broadcast are told
/// apart where the transport counts them in different units (MPI, NCCL);
/// threads and Gloo move bytes either way and use `broadcast`.
enum class collective : std::uint32_t {
  all_reduce = 1,
  broadcast,
  broadcast_fp32,
  broadcast_bytes,
  all_to_all,
  all_gather,
  barrier,
  membership_check,  // comm::threads' elastic worlds
};

inline constexpr const char* name(collective c) {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::broadcast: return "broadcast";
    case collective::broadcast_fp32: return "broadcast (fp32)";
    case collective::broadcast_bytes: return "broadcast (bytes)";
    case collective::all_to_all: return "all_to_all";
    case collective::all_gather: return "all_gather";
    case collective::barrier: return "barrier";
    case collective::membership_check: return "membership_check";
  }
  return "an unknown collective";
}

/// Whether a collective's count is in elements (fp32) rather than bytes.
inline constexpr bool counts_elements(collective c) {
  return c == collective::all_reduce || c == collective::broadcast_fp32;
}

/// Who reports: the communicator's name as messages give it ("threads",
/// "comm::gloo", "mpi", "nccl"), what it calls its group of ranks ("world",
/// "communicator") and this rank.
struct call_site {
  const char* comm;
  const char* group;
  int rank;
};

/// "<comm> <collective> on rank <r>: ", the start of every message about a call.
inline std::string call_prefix(const call_site& site, collective c) {
  return diloco::detail::concat(site.comm, " ", name(c), " on rank ", site.rank, ": ");
}

inline std::string root_problem(const call_site& site, collective c, int root, int size) {
  if (root >= 0 && root < size) return {};
  return diloco::detail::concat(call_prefix(site, c), "root ", root, " is not a rank of a ", site.group, " of ", size,
                                " ranks");
}

inline std::string reduce_problem(const call_site& site, reduce_op op) {
  if (op == reduce_op::sum || op == reduce_op::mean) return {};
  return diloco::detail::concat(call_prefix(site, collective::all_reduce), "reduce_op ", static_cast<int>(op),
                                " is neither sum nor mean");
}

/// all_to_all: send holds `size` equal blocks and recv as many bytes;
/// all_gather: recv holds `size` copies of send. Neither may overlap.
inline std::string exchange_problem(const call_site& site, collective c, const std::byte* send, std::size_t send_bytes,
                                    const std::byte* recv, std::size_t recv_bytes, int size) {
  const auto m = static_cast<std::size_t>(size);
  if (c == collective::all_to_all && send_bytes % m != 0)
    return diloco::detail::concat(call_prefix(site, c), "send has ", send_bytes,
                                  " bytes, not a multiple of the world size ", m);
  const std::size_t want = c == collective::all_to_all ? send_bytes : send_bytes * m;
  if (recv_bytes != want)
    return diloco::detail::concat(call_prefix(site, c), "recv has ", recv_bytes, " bytes, expected ", want, " for ",
                                  send_bytes, " bytes sent by each of ", m, " ranks");
  // As integers: < between pointers into different buffers is unspecified.
  const auto s0 = reinterpret_cast<std::uintptr_t>(send), r0 = reinterpret_cast<std::uintptr_t>(recv);
  if (send_bytes && recv_bytes && s0 < r0 + recv_bytes && r0 < s0 + send_bytes)
    return call_prefix(site, c) + "send and recv buffers overlap";
  return {};
}

}  // namespace diloco::comm::detail
