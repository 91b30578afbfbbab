// SPDX-License-Identifier: Apache-2.0
#pragma once

// The visitable state of an algorithm instance: every stateful part
// (theta_global, outer and inner optimizer slots and step counts,
// error-feedback residuals, round counters, the schedule's position and
// buffers) exposes visit_state(state_visitor&) over named fp32 buffers in
// their memory space and named integer scalars. Checkpoints, elastic joins
// and tests walk the same list; nothing stateful is reachable only through
// a private member.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace diloco {

/// Receives the state as visit_state walks it: every named buffer and scalar, writable.
class state_visitor {
 public:
  virtual ~state_visitor() = default;
  /// `device`: the buffer lives in device memory.
  virtual void buffer(std::string_view name, float* data, std::size_t size, bool device) = 0;
  /// An integer scalar (step counts, rounds, the schedule's clock), by reference.
  virtual void scalar(std::string_view name, std::uint64_t& value) = 0;
};

/// One entry of a read-only walk (algorithm::state()).
struct state_entry {
  std::string name;              ///< the entry's name, as visit_state gives it
  bool is_scalar = false;        ///< a scalar (value) rather than a buffer (data, size)
  bool device = false;           ///< buffers: in device memory
  const float* data = nullptr;   ///< buffers
  std::size_t size = 0;          ///< buffers: elements
  std::uint64_t value = 0;       ///< scalars
};

namespace checkpoint {
/// The visited entries that every rank holds identically. A new entry that
/// is equal across ranks and belongs in save_global's file is added here.
inline bool is_global_entry(std::string_view name) {
  if (name == "theta_global" || name == "outer.slots" || name == "rounds" || name == "schedule.position" ||
      name == "schedule.steps_in_round")
    return true;
  // adaptive compression's rule memory (agreed across ranks).
  return name.starts_with("fragment.") && (name.ends_with(".outer_steps") || name.find(".adaptive.") != name.npos);
}
}  // namespace checkpoint

}  // namespace diloco
