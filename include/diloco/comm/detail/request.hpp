// SPDX-License-Identifier: Apache-2.0
#pragma once

// The handle every communicator's non-blocking operations return. What
// differs between transports (a progress thread's completion, MPI requests,
// a CUDA event) is the operation in flight, `Op`; what a caller may rely on
// (move-only, waits before it is reassigned or destroyed, wait() rethrows,
// test() polls) is written here once.

#include <utility>

namespace diloco::comm::detail {

/// `Op`, the operation in flight, provides
///   bool active() const  // false once completed, moved from or never issued
///   void wait()          // completes it (rethrowing its error); inactive afterwards
///   bool test()          // false while it runs; else as wait(), then true
/// and moves leaving its source inactive. `Op::issuer` (the communicator
/// that fills an operation in while it starts) may reach it.
template <class Op>
class basic_request {
 public:
  basic_request() = default;
  /// A request for the operation `op` (the communicator makes it).
  explicit basic_request(Op op) : op_(std::move(op)) {}
  ///@{
  /// Moving hands the operation over; assigning to a request first waits for the one it holds.
  basic_request(basic_request&&) noexcept = default;
  basic_request& operator=(basic_request&& other) noexcept {
    if (this != &other) {
      drain();
      op_ = std::move(other.op_);
    }
    return *this;
  }
  ///@}
  basic_request(const basic_request&) = delete;
  basic_request& operator=(const basic_request&) = delete;
  /// A request destroyed unwaited waits here; its error is dropped (call wait() to see it).
  ~basic_request() { drain(); }

  /// False for a default-constructed, moved-from or completed request.
  bool valid() const { return op_.active(); }

  /// Blocks until the operation has completed and rethrows its error; a second call returns at once.
  void wait() {
    if (op_.active()) op_.wait();
  }

  /// True once the operation has completed (then as wait(), rethrowing its error); false while it runs.
  bool test() { return !op_.active() || op_.test(); }

 private:
  // Doxygen cannot resolve a dependent friend: hidden from it.
  /// @cond
  friend typename Op::issuer;
  /// @endcond

  void drain() noexcept {
    try {
      wait();
    } catch (...) {
      // Dropped, as documented: wait() is where an error is seen.
    }
  }

  Op op_;
};

}  // namespace diloco::comm::detail
