// SPDX-License-Identifier: Apache-2.0
// comm::mpi with a timeout when a rank dies and mpirun keeps the job alive
// (--mca orte_abort_on_non_zero_status 0). Run by
// test/run_mpi_peer_death.cmake under mpirun -np 3: every rank builds its
// communicators and checks one all-reduce, then the last rank kills itself
// with SIGKILL. Each survivor prints one line per case, "PASS <case>" or
// "FAIL <case>: why"; the script counts them (mpirun's own status is useless
// here: a rank died). Survivors leave with _Exit, without MPI_Finalize,
// which could wait for the dead rank.
//
//   mode "error": three waits (an argument check, the wait() of a
//   non-blocking all-reduce, a blocking broadcast from the dead rank without
//   the check) each
//   raise comm_error within the timeout + 2 s, naming the operation, the
//   rank, the timeout and a possibly dead peer, using a small fraction of a
//   core while they wait; later calls fail at once.
//   mode "abort": with abort_on_timeout the survivors end the job with
//   MPI_Abort after printing the message; nothing after the call may run.
//   mode "default": communicators with default options (no timeout set):
//   the argument check of an all-reduce raises comm_error within the
//   default timeout (30 s) + 2 s, and later calls fail at once (issue 38
//   item 6: before, the default was no timeout and the survivors waited in
//   MPI forever). The one slow case: it waits the whole default timeout.
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <diloco/comm/mpi.hpp>
#include <string>
#include <vector>

namespace dc = diloco;
using dc::comm::mpi;

namespace {

// The timeout the survivors wait for: 1000 ms set in the options, or the
// default in mode "default".
auto timeout = std::chrono::milliseconds(1000);
constexpr auto margin = std::chrono::seconds(2);

int my_rank = -1;
int failures = 0;

void report(bool ok, const char* what, const std::string& detail) {
  std::printf("rank %d: %s %s%s%s\n", my_rank, ok ? "PASS" : "FAIL", what, ok ? "" : ": ", ok ? "" : detail.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Runs f, which must throw comm_error within timeout + margin whose message
// names `operation` and the rest; reports the outcome as `name`.
template <class F>
void expect_timeout(const char* name, const char* operation, F&& f) {
  const double cpu0 = thread_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  bool threw = false;
  try {
    f();
  } catch (const dc::comm_error& e) {
    threw = true;
    message = e.what();
  } catch (const std::exception& e) {
    report(false, name, std::string("threw something other than comm_error: ") + e.what());
    return;
  }
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  const double cpu = thread_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(elapsed).count();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
  const std::string where = dc::detail::concat("mpi ", operation, " on rank ", my_rank, ": ");
  std::string why;
  if (!threw)
    why = "no exception after the peer died";
  else if (elapsed < timeout)
    why = dc::detail::concat("raised after ", ms, " ms, before the timeout: ", message);
  else if (elapsed > timeout + margin)
    why = dc::detail::concat("raised after ", ms, " ms, more than the timeout + 2 s: ", message);
  else if (!contains(message, where) ||
           !contains(message, "timeout of " + dc::detail::describe_timeout(timeout)) ||
           !contains(message, "a peer rank may have died"))
    why = "unexpected message: " + message;
  else if (cpu > 0.5 * wall)
    why = dc::detail::concat("the wait used ", cpu, " s of CPU in ", wall, " s: it spins");
  report(why.empty(), name, why);
  if (why.empty()) std::printf("rank %d: %s after %lld ms, %.3f s CPU: %s\n", my_rank, name, static_cast<long long>(ms),
                               cpu, message.c_str());
  std::fflush(stdout);
}

// A timed-out communicator refuses further work at once; then the survivor
// leaves (without MPI_Finalize, which could wait for the dead rank).
[[noreturn]] void finish_after_timeout(mpi& a) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    a.barrier();
    report(false, "after the timeout", "barrier returned");
  } catch (const dc::comm_error& e) {
    const bool quick = std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500);
    report(quick && contains(e.what(), "unusable after an earlier timeout"), "after the timeout",
           quick ? std::string("unexpected message: ") + e.what() : "took 500 ms or more");
  }
  std::printf("rank %d: done, %d failure(s)\n", my_rank, failures);
  std::fflush(stdout);
  std::_Exit(failures == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (size != 3 || (mode != "error" && mode != "abort" && mode != "default")) {
    std::fprintf(stderr, "usage: mpirun -np 3 %s error|abort|default\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int victim = size - 1;

  mpi::options checked;
  if (mode == "default") {
    timeout = checked.timeout;  // what a user gets without setting one
    if (dc::detail::unbounded(timeout) || timeout > std::chrono::seconds(60)) {
      std::printf("rank %d: FAIL default: the default timeout is %s, expected a finite one of at most 60 s\n", my_rank,
                  dc::detail::describe_timeout(timeout).c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
  } else {
    checked.timeout = timeout;
  }
  checked.abort_on_timeout = mode == "abort";
  mpi::options unchecked = checked;
  unchecked.check_arguments = false;
  mpi a(MPI_COMM_WORLD, checked);
  mpi b(MPI_COMM_WORLD, unchecked);
  mpi c(MPI_COMM_WORLD, unchecked);

  // All three ranks alive: the timed all-reduce gives the sum 1 + 2 + 3.
  std::vector<float> x(5, static_cast<float>(my_rank + 1));
  a.all_reduce(x, dc::reduce_op::sum);
  bool sums = true;
  for (float v : x) sums = sums && v == 6.0f;
  if (my_rank != victim) report(sums, "sum before the death", "all_reduce did not give 6");

  // Everyone has finished the all-reduce (a plain barrier) before the
  // victim dies, so the survivors' next calls can only wait for a dead rank.
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank == victim) {
    std::raise(SIGKILL);
    std::_Exit(3);  // not reached
  }

  if (mode == "abort") {
    try {
      a.all_reduce(x, dc::reduce_op::sum);
      report(false, "abort", "the all-reduce returned");
    } catch (const std::exception& e) {
      report(false, "abort", std::string("threw instead of aborting: ") + e.what());
    }
    std::_Exit(1);
  }

  // The argument check (an MPI_Iallreduce) waits for the dead rank.
  expect_timeout("blocking all_reduce (argument check)", "all_reduce", [&] { a.all_reduce(x, dc::reduce_op::sum); });
  if (mode == "default") {
    // One wait of the default timeout is enough (and long enough).
    finish_after_timeout(a);
  }
  // Unchecked, iall_reduce returns at once; wait() honours the timeout.
  auto r = b.iall_reduce(x, dc::reduce_op::sum);
  expect_timeout("iall_reduce wait()", "all_reduce", [&] { r.wait(); });
  // Unchecked, the blocking broadcast itself is polled. Its root is the
  // dead rank (from a live root a short broadcast may complete without it).
  std::vector<std::byte> bytes(64);
  expect_timeout("blocking broadcast", "broadcast", [&] { c.broadcast(std::span<std::byte>(bytes), victim); });

  finish_after_timeout(a);
}
