// SPDX-License-Identifier: Apache-2.0
#pragma once

// Completing MPI requests against comm::mpi's timeout. Without a timeout a
// request is completed by MPI_Waitall, as MPI users expect. With one it is
// polled with MPI_Testall, backing off from yields to short sleeps so a rank
// waiting for a dead peer does not burn a core, until the deadline; a late
// one is a comm_error (or, if the user asked for it, MPI_Abort).

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "diloco/comm/detail/mpi_call.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/timeout.hpp"

namespace diloco::comm::detail_mpi {

// How long a wait for the other ranks may take, and what a late one does.
struct wait_policy {
  std::chrono::milliseconds timeout = no_timeout;
  bool abort_on_timeout = false;
  bool timed() const { return !diloco::detail::unbounded(timeout); }
};

// Yields at first (most collectives finish within microseconds), then
// sleeps, longer the longer the wait: a rank waiting a whole timeout for a
// dead peer uses a few percent of a core, not all of it.
class poll_backoff {
 public:
  void pause() {
    ++rounds_;
    if (rounds_ < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(rounds_ < 1024 ? 20 : (rounds_ < 4096 ? 200 : 1000)));
  }

 private:
  int rounds_ = 0;
};

// MPI_Testall with its error returned, not handed to MPI_COMM_WORLD's error
// handler: Open MPI 4 reports a failed non-blocking collective through
// MPI_COMM_WORLD's handler, not the duplicate's (MPI_ERRORS_RETURN), and
// the default one (MPI_ERRORS_ARE_FATAL) ends the job where the blocking
// call would have returned the code (a truncated broadcast, say). The
// world's handler is swapped for the call and restored: the communicator is
// used from one thread at a time, and nothing else of MPI runs meanwhile.
inline int test_all_returning(int n, MPI_Request* reqs, int& done) {
  MPI_Errhandler user = MPI_ERRHANDLER_NULL;
  const bool swapped = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &user) == MPI_SUCCESS &&
                       MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) == MPI_SUCCESS;
  const int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
  if (swapped) MPI_Comm_set_errhandler(MPI_COMM_WORLD, user);
  if (user != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&user);
  return rc;
}

// Completes the `n` requests at `reqs`: MPI_Waitall without a timeout,
// otherwise MPI_Testall polled until `deadline`. Returns MPI's code (the
// call's name in `*mpi_call`); `timed_out` is set when the deadline passed
// first. The requests are still active then: MPI forbids cancelling or
// freeing the request of a collective, so the caller must leave them (and
// their buffers) alone.
inline int wait_all(int n, MPI_Request* reqs, const wait_policy& policy,
                    std::chrono::steady_clock::time_point deadline, bool& timed_out, const char** mpi_call) {
  timed_out = false;
  if (!policy.timed()) {
    *mpi_call = "MPI_Waitall";
    return MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
  }
  *mpi_call = "MPI_Testall";
  poll_backoff backoff;
  for (;;) {
    int done = 0;
    const int rc = test_all_returning(n, reqs, done);
    if (rc != MPI_SUCCESS || done) return rc;
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      return MPI_SUCCESS;
    }
    backoff.pause();
  }
}

// The message of a timeout (without the "diloco: " prefix).
inline std::string timeout_message(const char* operation, int rank, const char* mpi_call,
                                   std::chrono::milliseconds timeout) {
  return diloco::detail::concat("mpi ", operation, " on rank ", rank, ": ", mpi_call, " did not complete within the ",
                                "timeout of ", diloco::detail::describe_timeout(timeout),
                                "; a peer rank may have died or stopped responding (MPI cannot tell which); the "
                                "communicator is unusable now");
}

// Reports a timeout: MPI_Abort on `comm` when the user opted in (after
// printing the message, which would not reach them otherwise), comm_error
// otherwise.
[[noreturn]] inline void raise_timeout(MPI_Comm comm, const wait_policy& policy, const std::string& message) {
  if (policy.abort_on_timeout) {
    std::fprintf(stderr, "diloco: %s; calling MPI_Abort (abort_on_timeout is set)\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(comm == MPI_COMM_NULL ? MPI_COMM_WORLD : comm, 1);
  }
  diloco::detail::raise<comm_error>(message);
}

}  // namespace diloco::comm::detail_mpi
