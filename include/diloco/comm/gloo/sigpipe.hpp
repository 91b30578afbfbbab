// SPDX-License-Identifier: Apache-2.0
#pragma once

// Gloo's TCP transport sends with writev(2), without MSG_NOSIGNAL. Writing
// to a peer that has vanished raises SIGPIPE, whose default action kills the
// process: the survivors of a lost peer would die before Gloo could report
// EPIPE. Ignoring SIGPIPE process-wide, or installing a handler, would change
// the user's process behind their back, so neither is done. Instead, while
// a Gloo call runs, SIGPIPE is blocked in the calling thread; a SIGPIPE the
// call raised is consumed before the thread's mask is restored, and a
// SIGPIPE that was already pending is left alone. Gloo's event-loop thread
// inherits the mask of the thread that creates the transport device, so the
// device is created under this guard too and that thread never takes one.

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace diloco::comm::detail_gloo {

class sigpipe_guard {
 public:
  sigpipe_guard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  sigpipe_guard(const sigpipe_guard&) = delete;
  sigpipe_guard& operator=(const sigpipe_guard&) = delete;

  ~sigpipe_guard() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec now{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &now) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }

 private:
  sigset_t pipe_;
  sigset_t previous_;
  bool was_pending_ = false;
};

}  // namespace diloco::comm::detail_gloo
