// SPDX-License-Identifier: Apache-2.0
// The collective-agreement check and the local argument checks that every
// communicator shares (comm/detail/agreement.hpp, arguments.hpp): the
// messages are written out here by hand, and comm::threads is run to show a
// communicator feeding the check gives the same text.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <diloco/diloco.hpp>
#include <span>
#include <string>
#include <vector>

namespace dc = diloco;
namespace cd = diloco::comm::detail;
using cd::call_record;
using cd::collective;

namespace {

call_record rec(collective c, std::uint64_t count, std::int64_t arg = 0, std::uint64_t sequence = 0) {
  return {static_cast<std::uint32_t>(c), 0, count, arg, sequence};
}

std::string verdict(const std::vector<call_record>& all, const char* comm, int rank) {
  return cd::disagreement(std::span<const call_record>(all), cd::call_site{comm, "world", rank});
}

}  // namespace

TEST_CASE("records that agree give no verdict on any rank") {
  const std::vector<call_record> same(3, rec(collective::all_reduce, 8, 1, 4));
  for (int r = 0; r < 3; ++r) CHECK(verdict(same, "threads", r).empty());
}

TEST_CASE("every mismatch is named, with the same words after each communicator's prefix") {
  struct expected {
    std::vector<call_record> all;
    int rank;
    std::string op, text;  // the message after "<comm> <op> on rank <rank>: "
  };
  const auto sum = static_cast<std::int64_t>(dc::reduce_op::sum), mean = static_cast<std::int64_t>(dc::reduce_op::mean);
  call_record nonblocking = rec(collective::barrier, 0), timed = rec(collective::barrier, 0);
  nonblocking.flags = call_record::nonblocking;
  timed.flags = call_record::timed;
  const std::vector<expected> cases{
      {{rec(collective::all_reduce, 8), rec(collective::all_reduce, 8), rec(collective::all_reduce, 9)},
       0,
       "all_reduce",
       "buffer sizes differ across ranks (smallest 8, largest 9, this rank 8 elements); every rank must pass the "
       "same size; no rank ran the operation"},
      {{rec(collective::all_gather, 6), rec(collective::all_gather, 5)},
       1,
       "all_gather",
       "buffer sizes differ across ranks (smallest 5, largest 6, this rank 5 bytes); every rank must pass the same "
       "size; no rank ran the operation"},
      {{rec(collective::all_reduce, 8, sum), rec(collective::broadcast_fp32, 8)},
       0,
       "all_reduce",
       "ranks called different collectives (all_reduce and broadcast (fp32)): rank 1 entered broadcast (fp32) "
       "instead; every rank must call the same collective in the same order"},
      {{rec(collective::barrier, 0), nonblocking},
       0,
       "barrier",
       "ranks called different collectives (barrier and non-blocking barrier): rank 1 entered non-blocking barrier "
       "instead; every rank must call the same collective in the same order"},
      {{timed, rec(collective::barrier, 0)},
       0,
       "barrier",
       "ranks called different collectives (barrier without a timeout and barrier with a timeout): rank 1 entered "
       "barrier without a timeout instead; every rank must call the same collective in the same order and set "
       "comm::mpi's timeout on every rank or on none"},
      {{rec(collective::broadcast, 4, 0), rec(collective::broadcast, 4, 0), rec(collective::broadcast, 4, 2)},
       2,
       "broadcast",
       "ranks disagree on the root (smallest 0, largest 2, this rank 2); no rank ran the operation"},
      {{rec(collective::all_reduce, 4, sum), rec(collective::all_reduce, 4, mean)},
       1,
       "all_reduce",
       "ranks disagree on the reduction (both sum and mean were asked for, this rank asked for mean); no rank ran "
       "the operation"},
      {{rec(collective::all_reduce, 4, 0, 1), rec(collective::all_reduce, 4, 0, 2)},
       0,
       "all_reduce",
       "ranks are out of step: this is collective #1 on rank 0 but #2 on rank 1; every rank must call the same "
       "collectives in the same order"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    for (const char* comm : {"threads", "comm::gloo", "mpi", "nccl"})
      CHECK(verdict(c.all, comm, c.rank) == std::string(comm) + " " + c.op + " on rank " + std::to_string(c.rank) +
                                                ": " + c.text);
    // Every rank raises, whichever it is.
    for (int r = 0; r < static_cast<int>(c.all.size()); ++r) CHECK(!verdict(c.all, "mpi", r).empty());
  }
}

TEST_CASE("a rank that rejected its own arguments is reported before any other difference") {
  std::vector<call_record> all(3, rec(collective::all_reduce, 8, 0, 1));
  all[1].flags = call_record::rejected;
  all[2].count = 3;
  all[2].sequence = 5;
  CHECK(verdict(all, "comm::gloo", 0) ==
        "comm::gloo all_reduce on rank 0: rank 1 passed invalid arguments: rank 1 rejected its own arguments to "
        "all_reduce (it raised config_error); no rank ran the operation");
  // Where the transport can tell what was wrong (threads), it is quoted.
  const auto detail = [](int k) { return std::string_view(k == 1 ? "root 7 is not a rank" : ""); };
  CHECK(cd::disagreement(std::span<const call_record>(all), cd::call_site{"threads", "world", 2}, detail) ==
        "threads all_reduce on rank 2: rank 1 passed invalid arguments (root 7 is not a rank): rank 1 rejected its "
        "own arguments to all_reduce (it raised config_error); no rank ran the operation");
}

TEST_CASE("agree(): config_error on the rank with a problem, comm_error elsewhere, settle() only on a bad verdict") {
  std::vector<call_record> all(2, rec(collective::broadcast, 4, 0));
  int settled = 0;
  auto exchange = [&](int rank) {
    return [&all, rank](const call_record& mine) {
      all[static_cast<std::size_t>(rank)] = mine;
      return std::span<const call_record>(all);
    };
  };
  const cd::call_site site0{"threads", "world", 0}, site1{"threads", "world", 1};
  cd::agree(site0, rec(collective::broadcast, 4, 0), {}, exchange(0), [&] { ++settled; });
  CHECK(settled == 0);

  all[1].flags = call_record::rejected;  // rank 1's record, as it will send it
  CHECK_THROWS_WITH_AS(cd::agree(site0, rec(collective::broadcast, 4, 0), {}, exchange(0), [&] { ++settled; }),
                       "diloco: threads broadcast on rank 0: rank 1 passed invalid arguments: rank 1 rejected its own "
                       "arguments to broadcast (it raised config_error); no rank ran the operation",
                       dc::comm_error);
  CHECK_THROWS_WITH_AS(
      cd::agree(site1, rec(collective::broadcast, 4, 5), "threads broadcast on rank 1: root 5 is not a rank",
                exchange(1), [&] { ++settled; }),
      "diloco: threads broadcast on rank 1: root 5 is not a rank", dc::config_error);
  CHECK(settled == 2);
  CHECK(all[1].flags == call_record::rejected);  // the problem travelled in the record
}

TEST_CASE("the local argument checks") {
  const cd::call_site mpi{"mpi", "communicator", 2}, gloo{"comm::gloo", "world", 0};
  CHECK(cd::root_problem(mpi, collective::broadcast_fp32, 1, 3).empty());
  CHECK(cd::root_problem(mpi, collective::broadcast_fp32, 3, 3) ==
        "mpi broadcast (fp32) on rank 2: root 3 is not a rank of a communicator of 3 ranks");
  CHECK(cd::root_problem(gloo, collective::broadcast, -1, 2) ==
        "comm::gloo broadcast on rank 0: root -1 is not a rank of a world of 2 ranks");
  CHECK(cd::reduce_problem(gloo, dc::reduce_op::mean).empty());
  CHECK(cd::reduce_problem(gloo, static_cast<dc::reduce_op>(7)) ==
        "comm::gloo all_reduce on rank 0: reduce_op 7 is neither sum nor mean");

  std::array<std::byte, 32> buf{};
  const std::byte* b = buf.data();
  CHECK(cd::exchange_problem(gloo, collective::all_to_all, b, 6, b + 16, 6, 2).empty());
  CHECK(cd::exchange_problem(gloo, collective::all_gather, b, 4, b + 16, 8, 2).empty());
  CHECK(cd::exchange_problem(gloo, collective::all_to_all, b, 7, b + 16, 7, 2) ==
        "comm::gloo all_to_all on rank 0: send has 7 bytes, not a multiple of the world size 2");
  CHECK(cd::exchange_problem(gloo, collective::all_gather, b, 4, b + 16, 7, 2) ==
        "comm::gloo all_gather on rank 0: recv has 7 bytes, expected 8 for 4 bytes sent by each of 2 ranks");
  CHECK(cd::exchange_problem(gloo, collective::all_gather, b, 4, b + 3, 8, 2) ==
        "comm::gloo all_gather on rank 0: send and recv buffers overlap");
  CHECK(cd::exchange_problem(gloo, collective::all_gather, b, 4, b + 4, 8, 2).empty());  // adjacent, not overlapping
}

TEST_CASE("comm::threads feeds the shared check: mismatched size, root and collective give its messages") {
  dc::comm::threads::world world(2);
  std::atomic<int> checked{0};
  world.run([&](dc::comm::threads& comm) {
    const int r = comm.rank();
    const std::string prefix = "diloco: threads ";
    std::vector<float> x(r == 0 ? 4 : 5);
    const std::string sizes = prefix + "all_reduce on rank " + std::to_string(r) +
                              ": buffer sizes differ across ranks (smallest 4, largest 5, this rank " +
                              std::to_string(4 + r) +
                              " elements); every rank must pass the same size; no rank ran the operation";
    CHECK_THROWS_WITH_AS(comm.all_reduce(x, dc::reduce_op::sum), sizes.c_str(), dc::comm_error);
    std::vector<float> y(3);
    const std::string roots = prefix + "broadcast on rank " + std::to_string(r) +
                              ": ranks disagree on the root (smallest 0, largest 1, this rank " + std::to_string(r) +
                              "); no rank ran the operation";
    CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(y), r), roots.c_str(), dc::comm_error);
    std::vector<std::byte> send(2), recv(r == 0 ? 4 : 2);  // valid arguments on each rank
    if (r == 0)
      CHECK_THROWS_WITH_AS(comm.all_gather(send, recv),
                           "diloco: threads all_gather on rank 0: ranks called different collectives (all_to_all and "
                           "all_gather): rank 1 entered all_to_all instead; every rank must call the same collective "
                           "in the same order",
                           dc::comm_error);
    else
      CHECK_THROWS_AS(comm.all_to_all(send, recv), dc::comm_error);
    // Nothing moved, and the communicator still works.
    std::vector<float> z(2, 1.0f);
    comm.all_reduce(z, dc::reduce_op::sum);
    CHECK(z[0] == 2.0f);
    checked.fetch_add(1);
  });
  CHECK(checked.load() == 2);
}
