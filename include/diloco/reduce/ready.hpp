// SPDX-License-Identifier: Apache-2.0
#pragma once

// A reduction whose collectives have completed but which has not been
// applied yet ("ready"): what a checkpoint taken while it was in flight
// stores so that it is applied later, at the schedule's own step, with the
// same inputs (checkpoint/state_io.hpp). Each reducer names the buffers its
// apply() reads (visit_ready); the engine adds the round's verdict.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "diloco/reduce/verdict.hpp"

namespace diloco::reduce {

/// Receives a ready reduction's entries by name, writable (a restore sets
/// them). Buffers stay in their memory space (`device`).
class ready_visitor {
 public:
  virtual ~ready_visitor() = default;
  /// fp32 values (a reduced mean, the error-feedback residual to commit).
  virtual void floats(std::string_view name, float* data, std::size_t size, bool device) = 0;
  /// Raw bytes (the gathered wire segments a decode-apply reads).
  virtual void bytes(std::string_view name, std::byte* data, std::size_t size, bool device) = 0;
  /// An integer, by reference.
  virtual void scalar(std::string_view name, std::uint64_t& value) = 0;
  /// A text of any length, by reference.
  virtual void text(std::string_view name, std::string& value) = 0;
};

/// The verdict's fields under `prefix` (doubles as their bits). Each is
/// read back after the visitor saw it, so a restoring visitor sets them.
inline void visit_verdict(ready_visitor& v, const std::string& prefix, verdict& out) {
  std::uint64_t accepted = out.accepted ? 1 : 0, corrupt = out.corrupt ? 1 : 0;
  std::uint64_t delta = std::bit_cast<std::uint64_t>(out.delta_norm);
  std::uint64_t error = std::bit_cast<std::uint64_t>(out.error_norm);
  std::uint64_t encoded = out.encoded_bytes;
  v.scalar(prefix + "accepted", accepted);
  v.scalar(prefix + "corrupt", corrupt);
  v.scalar(prefix + "delta_norm", delta);
  v.scalar(prefix + "error_norm", error);
  v.scalar(prefix + "encoded_bytes", encoded);
  v.text(prefix + "problem", out.problem);
  out.accepted = accepted != 0;
  out.corrupt = corrupt != 0;
  out.delta_norm = std::bit_cast<double>(delta);
  out.error_norm = std::bit_cast<double>(error);
  out.encoded_bytes = static_cast<std::size_t>(encoded);
}

}  // namespace diloco::reduce
