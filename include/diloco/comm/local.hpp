#pragma once

#include <span>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm {

// A world of one worker and no communication: every collective is the
// identity. DiLoCo over it is the inner optimizer with periodic outer steps
// on its own trajectory (with outer::sgd at lr 1, the inner optimizer alone).
class local {
 public:
  int rank() const { return 0; }
  int size() const { return 1; }
  traffic_counters traffic() const { return {}; }
  void all_reduce(std::span<float>, reduce_op) {}
  void broadcast(std::span<float>, int root) {
    if (root != 0) diloco::detail::raise<config_error>("comm::local broadcast: root ", root, " is not rank 0");
  }
  void barrier() {}
};

}  // namespace diloco::comm
