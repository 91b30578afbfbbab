// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstring>
#include <span>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm {

/// A world of one worker and no communication: every collective is the
/// identity (all-to-all and all-gather copy send to recv). DiLoCo over it is
/// the inner optimizer with periodic outer steps on its own trajectory (with
/// outer::sgd at lr 1, the inner optimizer alone).
class local {
 public:
  /// Operations complete when issued.
  struct request {
    ///@{
    /// Nothing to wait for.
    void wait() {}
    bool test() { return true; }
    ///@}
  };

  ///@{
  /// Rank 0 of a world of one; nothing travels, so no traffic.
  int rank() const { return 0; }
  int size() const { return 1; }
  traffic_counters traffic() const { return {}; }
  ///@}

  ///@{
  /// The collectives of a world of one: all_reduce and barrier do nothing, broadcast checks
  /// that root is 0, all_to_all and all_gather copy send to recv (config_error if their sizes
  /// differ).
  void all_reduce(std::span<float>, reduce_op) {}
  void broadcast(std::span<float>, int root) { check_root(root); }
  void broadcast(std::span<std::byte>, int root) { check_root(root); }
  void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) { copy("all_to_all", send, recv); }
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) { copy("all_gather", send, recv); }
  void barrier() {}
  ///@}

  ///@{
  /// The same operations, complete when they return.
  request iall_reduce(std::span<float> b, reduce_op op) { return all_reduce(b, op), request{}; }
  request ibroadcast(std::span<float> b, int root) { return broadcast(b, root), request{}; }
  request ibroadcast(std::span<std::byte> b, int root) { return broadcast(b, root), request{}; }
  request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) { return all_to_all(s, r), request{}; }
  request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) { return all_gather(s, r), request{}; }
  request ibarrier() { return request{}; }
  ///@}

 private:
  static void check_root(int root) {
    if (root != 0) diloco::detail::raise<config_error>("comm::local broadcast: root ", root, " is not rank 0");
  }
  static void copy(const char* op, std::span<const std::byte> send, std::span<std::byte> recv) {
    if (send.size() != recv.size())
      diloco::detail::raise<config_error>("comm::local ", op, ": recv has ", recv.size(), " bytes, expected ",
                                          send.size());
    if (!send.empty() && send.data() != recv.data()) std::memmove(recv.data(), send.data(), send.size());
  }
};

}  // namespace diloco::comm
