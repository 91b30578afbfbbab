// SPDX-License-Identifier: Apache-2.0
#pragma once

// Background threads that yield to the thread that trains. A communicator's
// own threads (a transport's I/O loop, the progress thread) wake up for
// every packet or finished operation; under Linux's normal policy each
// wake-up preempts whatever runs on that core, so on a core shared with
// training the inner step is interrupted thousands of times a second, a
// context switch each time. Under SCHED_BATCH a thread keeps its fair share
// of the core but its wake-ups do not preempt: it runs when the training
// thread's time slice ends or it blocks, and then finds many packets ready
// at once. On a core of its own nothing changes (it runs at once).
//
// Threads inherit the policy of the thread that creates them, which is how
// a thread created inside a library (Gloo's event loop) is reached: create
// it under a scoped_batch_policy. Best effort everywhere: where the policy
// cannot be set (not Linux, a seccomp filter, a real-time caller) the
// threads run as they would have.

#include <sched.h>

namespace diloco::comm::detail {

// Puts the calling thread under SCHED_BATCH if it runs under the normal
// policy (SCHED_OTHER); true when it did. Threads under another policy
// (real-time, idle, already batch) are left as they are.
inline bool enter_batch_policy() noexcept {
#if defined(__linux__) && defined(SCHED_BATCH)
  if (sched_getscheduler(0) != SCHED_OTHER) return false;
  const sched_param p{};
  return sched_setscheduler(0, SCHED_BATCH, &p) == 0;  // 0: the calling thread
#else
  return false;
#endif
}

// Returns the calling thread to the normal policy (after enter_batch_policy).
inline void leave_batch_policy() noexcept {
#if defined(__linux__) && defined(SCHED_BATCH)
  const sched_param p{};
  (void)sched_setscheduler(0, SCHED_OTHER, &p);
#endif
}

// The threads created while it lives inherit SCHED_BATCH (when `on`); the
// calling thread's own policy is restored at the end of the scope.
class scoped_batch_policy {
 public:
  explicit scoped_batch_policy(bool on) noexcept : changed_(on && enter_batch_policy()) {}
  scoped_batch_policy(const scoped_batch_policy&) = delete;
  scoped_batch_policy& operator=(const scoped_batch_policy&) = delete;
  ~scoped_batch_policy() {
    if (changed_) leave_batch_policy();
  }

 private:
  bool changed_;
};

}  // namespace diloco::comm::detail
