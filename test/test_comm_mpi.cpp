// SPDX-License-Identifier: Apache-2.0
// comm::mpi under mpirun (CTest starts it with -np 2 and -np 4): every
// operation against values each rank computes itself, traffic against the
// closed-form models, determinism, and bad input on one or all ranks.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <string>
#include <thread>
#include <vector>

#include "comm_conformance.hpp"
#include "test_probes.hpp"

namespace dc = diloco;
using dc::comm::mpi;

namespace {

// Every rank's bytes, gathered with plain MPI (not the code under test).
std::vector<std::vector<std::uint8_t>> gather_bits(const void* data, std::size_t bytes) {
  const int m = world_size();
  std::vector<std::uint8_t> all(bytes * static_cast<std::size_t>(m));
  MPI_Allgather(data, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE,
                MPI_COMM_WORLD);
  std::vector<std::vector<std::uint8_t>> out;
  for (int k = 0; k < m; ++k)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(bytes) * k,
                     all.begin() + static_cast<std::ptrdiff_t>(bytes) * (k + 1));
  return out;
}

// True on every rank iff `ok` holds on every rank (plain MPI).
bool all_ranks(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs f and returns the message of the diloco error it throws, which must
// be of type E; fails the test if it throws nothing or something else.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw the wrong exception type: ", e.what());
  }
  FAIL("no exception thrown");
  return {};
}

}  // namespace

TEST_CASE("every operation, blocking and non-blocking, against each rank's closed form") {
  static_assert(dc::communicator<mpi>);
  mpi comm(MPI_COMM_WORLD);
  REQUIRE(comm.size() == world_size());
  REQUIRE(comm.rank() == world_rank());
  SUBCASE("argument checks on (the default)") { conformance::check_all_operations(comm); }
  SUBCASE("argument checks off") {
    mpi unchecked(MPI_COMM_WORLD, {.check_arguments = false});
    conformance::check_all_operations(unchecked);
  }
  SUBCASE("buffers split into several MPI calls (at most 1000 elements each)") {
    // The path taken by counts above INT_MAX, exercised on small buffers:
    // 4097 elements go in 5 pieces (reductions, broadcasts) or 5 strided
    // slices per block (exchanges); 1000 is exactly one.
    mpi split(MPI_COMM_WORLD, {.max_count_per_call = 1000});
    conformance::check_all_operations(split);
  }
  // With a timeout every operation is non-blocking MPI polled against it:
  // the results must not change.
  SUBCASE("with a 1000 ms timeout") {
    mpi timed(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(1000)});
    conformance::check_all_operations(timed);
  }
  SUBCASE("with a timeout, argument checks off and buffers split") {
    mpi timed(MPI_COMM_WORLD,
              {.check_arguments = false, .max_count_per_call = 1000, .timeout = std::chrono::milliseconds(1000)});
    conformance::check_all_operations(timed);
  }
}

TEST_CASE("timeout: sums against the closed form, over many calls, and the option's range") {
  const int r = world_rank(), m = world_size();
  mpi timed(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(1000)});
  CHECK(timed.settings().timeout == std::chrono::milliseconds(1000));
  // Rank k contributes (k + 1) * (i + 1) + round: the sum is
  // (i + 1) m (m + 1) / 2 + m round, small integers exact in float.
  for (int round = 0; round < 50; ++round) {
    std::vector<float> x(257);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>((r + 1) * static_cast<int>(i + 1) + round);
    if (round % 2)
      timed.iall_reduce(x, dc::reduce_op::sum).wait();
    else
      timed.all_reduce(x, dc::reduce_op::sum);
    for (std::size_t i = 0; i < x.size(); ++i)
      REQUIRE(x[i] == static_cast<float>(static_cast<int>(i + 1) * m * (m + 1) / 2 + m * round));
  }
  // A rank late by less than the timeout is no failure: rank 0 arrives
  // 300 ms after the others.
  if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<float> one{static_cast<float>(r)};
  timed.all_reduce(one, dc::reduce_op::sum);
  CHECK(one[0] == static_cast<float>(m * (m - 1) / 2));

  // Out of range: config_error naming the option and the range.
  const auto two_years = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::hours(2 * 24 * 365));
  auto msg = error_of<dc::config_error>([&] { mpi c(MPI_COMM_WORLD, {.timeout = two_years}); });
  CHECK(contains(msg, "comm::mpi: timeout is " + std::to_string(two_years.count()) + " ms"));
  CHECK(contains(msg, "one year"));
  error_of<dc::config_error>([] { mpi c(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(0)}); });
  error_of<dc::config_error>([] { mpi c(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(-5)}); });
  // no_timeout (MPI's own blocking calls) and exactly one year are accepted.
  mpi unbounded(MPI_COMM_WORLD, {.timeout = dc::no_timeout});
  mpi year(MPI_COMM_WORLD, {.timeout = dc::max_finite_timeout});
  std::vector<float> y{1.0f};
  year.all_reduce(y, dc::reduce_op::sum);
  CHECK(y[0] == static_cast<float>(m));
  CHECK_FALSE(mpi::options{}.abort_on_timeout);
  // Finite by default, 30 s as comm::gloo's (issue 38 item 6: without one a
  // killed peer in a job mpirun keeps alive left the others in MPI_Waitall
  // forever; test_comm_mpi_peer_death_default_np3 shows it with processes).
  CHECK(mpi::options{}.timeout == std::chrono::seconds(30));
  mpi plain(MPI_COMM_WORLD);
  CHECK(plain.settings().timeout == std::chrono::seconds(30));

  // DILOCO_TIMEOUT_MS, as comm::gloo reads it.
  ::unsetenv("DILOCO_TIMEOUT_MS");
  CHECK(mpi::options_from_env().timeout == std::chrono::seconds(30));
  CHECK(mpi::options_from_env({.expected_size = m}).expected_size == m);
  ::setenv("DILOCO_TIMEOUT_MS", "2500", 1);
  CHECK(mpi::options_from_env().timeout == std::chrono::milliseconds(2500));
  ::setenv("DILOCO_TIMEOUT_MS", "none", 1);
  CHECK(mpi::options_from_env({.timeout = std::chrono::milliseconds(7)}).timeout == dc::no_timeout);
  ::setenv("DILOCO_TIMEOUT_MS", "63072000000", 1);  // two years
  msg = error_of<dc::config_error>([] { (void)mpi::options_from_env(); });
  CHECK(contains(msg, "DILOCO_TIMEOUT_MS is '63072000000'"));
  ::unsetenv("DILOCO_TIMEOUT_MS");
  all_ranks(true);
}

TEST_CASE("timeout set on some ranks only: comm_error on every rank, no hang") {
  // Rank 0 has a timeout, the others none: the argument check (issued the
  // same way on both) reports it instead of letting the data calls, issued
  // differently, wait for each other.
  if (world_size() < 2) return;
  mpi::options o{.timeout = dc::no_timeout};
  if (world_rank() == 0) o.timeout = std::chrono::milliseconds(5000);
  mpi comm(MPI_COMM_WORLD, o);
  std::vector<float> x(3, 1.0f);
  const auto msg = error_of<dc::comm_error>([&] { comm.all_reduce(x, dc::reduce_op::sum); });
  CHECK(contains(msg, "(all_reduce without a timeout and all_reduce with a timeout)"));
  CHECK(contains(msg, "set comm::mpi's timeout on every rank or on none"));
  all_ranks(true);
}

TEST_CASE("workers_on_host counts the ranks sharing this host") {
  // CTest starts every rank on this one machine.
  mpi comm(MPI_COMM_WORLD);
  CHECK(comm.workers_on_host() == world_size());
}

TEST_CASE("traffic follows the same models as comm::threads") {
  mpi comm(MPI_COMM_WORLD);
  const int r = comm.rank(), m = comm.size();
  const auto mm = static_cast<std::uint64_t>(m);
  std::uint64_t sent = 0, received = 0;
  auto expect = [&] {
    CHECK(comm.traffic().bytes_sent == sent);
    CHECK(comm.traffic().bytes_received == received);
  };
  // All-reduce of 1000 floats: a ring moves 2 (M-1)/M of the buffer each way.
  std::vector<float> x(1000, 1.0f);
  comm.all_reduce(x, dc::reduce_op::sum);
  sent += 2 * (mm - 1) * 4000 / mm;
  received += 2 * (mm - 1) * 4000 / mm;
  expect();
  // Broadcast of 64 bytes from root 1 along the chain 1 -> 2 -> ... -> 0:
  // the root does not receive, the last link (rank 0) does not send.
  std::vector<std::byte> b(64);
  comm.broadcast(std::span<std::byte>(b), 1);
  if (r != 1) received += 64;
  if (r != 0) sent += 64;
  expect();
  // All-gather of 10 bytes and all-to-all of M blocks of 3: M-1 blocks each way.
  std::vector<std::byte> send(10), gathered(10 * mm);
  comm.iall_gather(send, gathered).wait();
  sent += (mm - 1) * 10;
  received += (mm - 1) * 10;
  std::vector<std::byte> blocks(3 * mm), swapped(3 * mm);
  comm.all_to_all(blocks, swapped);
  sent += (mm - 1) * 3;
  received += (mm - 1) * 3;
  expect();
  comm.barrier();
  expect();  // a barrier carries no payload
}

TEST_CASE("determinism: repeated all-reduces give the same bits, on every rank") {
  mpi comm(MPI_COMM_WORLD);
  conformance::check_deterministic(comm, 10);
  // The non-blocking path (another MPI algorithm) is deterministic too, and
  // all ranks hold the same bits: replicas in the algorithm must not drift.
  for (bool nonblocking : {false, true}) {
    CAPTURE(nonblocking);
    std::vector<float> input(10007);
    for (std::size_t i = 0; i < input.size(); ++i)
      input[i] = static_cast<float>((i * 2654435761u + static_cast<std::size_t>(comm.rank()) * 40503u) % 100003) *
                 (i % 3 == 0 ? 1e-4f : 1.7f);
    std::vector<float> first;
    for (int rep = 0; rep < 5; ++rep) {
      std::vector<float> v = input;
      if (nonblocking)
        comm.iall_reduce(v, dc::reduce_op::mean).wait();
      else
        comm.all_reduce(v, dc::reduce_op::mean);
      if (rep == 0) first = v;
      REQUIRE(std::memcmp(v.data(), first.data(), v.size() * sizeof(float)) == 0);
    }
    const auto bits = gather_bits(first.data(), first.size() * sizeof(float));
    for (const auto& other : bits) CHECK(other == bits[0]);
  }
}

TEST_CASE("requests: test() polls to completion, moves keep the operation, destruction waits") {
  mpi comm(MPI_COMM_WORLD);
  const int r = comm.rank(), m = comm.size();
  std::vector<float> a(257, static_cast<float>(r + 1));
  auto req = comm.iall_reduce(a, dc::reduce_op::mean);
  dc::comm::mpi_request moved = std::move(req);
  CHECK_FALSE(req.valid());
  CHECK(req.test());  // an empty request is complete
  while (!moved.test()) {
  }
  CHECK_FALSE(moved.valid());
  for (float v : a) REQUIRE(v == static_cast<float>(m * (m + 1) / 2) / static_cast<float>(m));
  std::vector<float> b(3, static_cast<float>(r));
  {
    auto dropped = comm.iall_reduce(b, dc::reduce_op::sum);  // destructor completes it
  }
  for (float v : b) CHECK(v == static_cast<float>(m * (m - 1) / 2));
  // A request may outlive the communicator object that issued it.
  std::vector<float> c(5, static_cast<float>(r == 0 ? 7 : 0));
  dc::comm::mpi_request late;
  {
    mpi short_lived(MPI_COMM_WORLD);
    late = short_lived.ibroadcast(std::span<float>(c), 0);
  }
  late.wait();
  for (float v : c) CHECK(v == 7.0f);
}

TEST_CASE("different sizes on different ranks: comm_error on every rank, no hang, the communicator still works") {
  mpi comm(MPI_COMM_WORLD);
  const int r = comm.rank(), m = comm.size();
  const auto mm = static_cast<std::size_t>(m);
  const std::size_t n = 10 + static_cast<std::size_t>(r);  // differs on every rank
  std::vector<float> f(n, 1.0f);
  std::vector<std::byte> bytes(n);
  std::vector<std::byte> gathered(n * mm), blocks(n * mm), swapped(n * mm);

  auto msg = error_of<dc::comm_error>([&] { comm.all_reduce(f, dc::reduce_op::sum); });
  CHECK(contains(msg, "diloco: mpi all_reduce on rank " + std::to_string(r)));
  CHECK(contains(msg, "buffer sizes differ across ranks (smallest 10, largest " + std::to_string(9 + m) +
                          ", this rank " + std::to_string(n) + " elements)"));
  error_of<dc::comm_error>([&] { comm.iall_reduce(f, dc::reduce_op::mean).wait(); });
  msg = error_of<dc::comm_error>([&] { comm.broadcast(std::span<float>(f), 0); });
  CHECK(contains(msg, "broadcast (fp32)"));
  error_of<dc::comm_error>([&] { comm.ibroadcast(std::span<std::byte>(bytes), 0).wait(); });
  msg = error_of<dc::comm_error>([&] { comm.all_gather(bytes, gathered); });
  CHECK(contains(msg, "bytes)"));
  error_of<dc::comm_error>([&] { comm.iall_to_all(blocks, swapped).wait(); });
  for (float v : f) CHECK(v == 1.0f);  // nothing moved

  // The failed calls left nothing half-done: the next collective works.
  std::vector<float> ok(7, 1.0f);
  comm.all_reduce(ok, dc::reduce_op::sum);
  for (float v : ok) CHECK(v == static_cast<float>(m));
}

TEST_CASE("mismatched operation, root or reduction: comm_error on every rank") {
  mpi comm(MPI_COMM_WORLD);
  const int r = comm.rank(), m = comm.size();
  std::vector<float> f(8, 0.0f);
  auto msg = error_of<dc::comm_error>([&] {
    if (r == 0)
      comm.all_reduce(f, dc::reduce_op::sum);
    else
      comm.broadcast(std::span<float>(f), 0);
  });
  CHECK(contains(msg, "ranks called different collectives (all_reduce and broadcast (fp32))"));
  msg = error_of<dc::comm_error>([&] { comm.broadcast(std::span<float>(f), r == m - 1 ? 1 : 0); });
  CHECK(contains(msg, "ranks disagree on the root (smallest 0, largest 1"));
  msg = error_of<dc::comm_error>([&] { comm.all_reduce(f, r == 0 ? dc::reduce_op::mean : dc::reduce_op::sum); });
  CHECK(contains(msg, "ranks disagree on the reduction"));
  // MPI never pairs a blocking collective with a non-blocking one: that
  // would hang, so it is a mismatch too.
  msg = error_of<dc::comm_error>([&] {
    if (r == 0)
      comm.barrier();
    else
      comm.ibarrier().wait();
  });
  CHECK(contains(msg, "ranks called different collectives (barrier and non-blocking barrier)"));
  msg = error_of<dc::comm_error>([&] {
    if (r == 1)
      comm.iall_reduce(f, dc::reduce_op::sum).wait();
    else
      comm.all_reduce(f, dc::reduce_op::sum);
  });
  CHECK(contains(msg, "(all_reduce and non-blocking all_reduce)"));
  comm.barrier();  // in step again
}

TEST_CASE("invalid arguments on one rank: config_error there, comm_error on the others") {
  mpi comm(MPI_COMM_WORLD);
  const int r = comm.rank(), m = comm.size();
  const int bad = m - 1;
  std::vector<float> f(4, 0.0f);
  // A root that is not a rank, on the last rank only.
  if (r == bad) {
    const auto msg = error_of<dc::config_error>([&] { comm.broadcast(std::span<float>(f), m); });
    CHECK(contains(msg, "root " + std::to_string(m) + " is not a rank of a communicator of " + std::to_string(m)));
  } else {
    const auto msg = error_of<dc::comm_error>([&] { comm.broadcast(std::span<float>(f), 0); });
    CHECK(contains(msg, "rank " + std::to_string(bad) + " passed invalid arguments"));
  }
  // A receive buffer of the wrong size on rank 0 only.
  std::vector<std::byte> send(6), recv(6 * static_cast<std::size_t>(m) + (r == 0 ? 1 : 0));
  if (r == 0) {
    const auto msg = error_of<dc::config_error>([&] { comm.iall_gather(send, recv).wait(); });
    CHECK(contains(msg, "recv has " + std::to_string(recv.size()) + " bytes, expected " + std::to_string(6 * m)));
  } else {
    error_of<dc::comm_error>([&] { comm.all_gather(send, recv); });
  }
  // All-to-all input that does not split into M blocks, and overlapping
  // buffers, everywhere.
  std::vector<std::byte> odd(static_cast<std::size_t>(m) * 2 + 1), out(odd.size());
  auto msg = error_of<dc::config_error>([&] { comm.all_to_all(odd, out); });
  CHECK(contains(msg, "not a multiple of the world size"));
  std::vector<std::byte> same(static_cast<std::size_t>(m) * 4);
  msg = error_of<dc::config_error>([&] { comm.all_to_all(same, same); });
  CHECK(contains(msg, "send and recv buffers overlap"));
  // Unchecked, a problem every rank shares is still reported, without a collective.
  mpi unchecked(MPI_COMM_WORLD, {.check_arguments = false});
  error_of<dc::config_error>([&] { unchecked.broadcast(std::span<float>(f), -1); });
  // Still in step afterwards.
  std::vector<float> ok(3, 2.0f);
  comm.all_reduce(ok, dc::reduce_op::mean);
  for (float v : ok) CHECK(v == 2.0f);
}

TEST_CASE("bad communicators and options: config_error") {
  const int m = world_size();
  auto msg = error_of<dc::config_error>([] { mpi c(MPI_COMM_NULL); });
  CHECK(contains(msg, "MPI_COMM_NULL"));
  // A communicator this rank is not a member of is MPI_COMM_NULL here.
  MPI_Comm excluded = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? MPI_UNDEFINED : 1, 0, &excluded);
  if (world_rank() == 0) {
    REQUIRE(excluded == MPI_COMM_NULL);
    error_of<dc::config_error>([&] { mpi c(excluded); });
  } else {
    mpi c(excluded);  // the other ranks form a valid communicator
    CHECK(c.size() == m - 1);
    MPI_Comm_free(&excluded);
  }
  // An intercommunicator between the even and the odd ranks.
  MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() % 2, world_rank(), &half);
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, world_rank() % 2 == 0 ? 1 : 0, 77, &inter);
  msg = error_of<dc::config_error>([&] { mpi c(inter); });
  CHECK(contains(msg, "intercommunicator"));
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);

  // The wrong rank count.
  msg = error_of<dc::config_error>([&] { mpi c(MPI_COMM_WORLD, {.expected_size = m + 2}); });
  CHECK(contains(msg, "diloco: comm::mpi: expected " + std::to_string(m + 2) + " ranks, the MPI communicator has " +
                          std::to_string(m)));
  mpi right(MPI_COMM_WORLD, {.expected_size = m});
  CHECK(right.size() == m);
  error_of<dc::config_error>([] { mpi c(MPI_COMM_WORLD, {.expected_size = -1}); });
  msg = error_of<dc::config_error>([] { mpi c(MPI_COMM_WORLD, {.max_count_per_call = 0}); });
  CHECK(contains(msg, "max_count_per_call"));
  error_of<dc::config_error>(
      [] { mpi c(MPI_COMM_WORLD, {.max_count_per_call = static_cast<std::size_t>(INT_MAX) + 1}); });
  all_ranks(true);  // in step before the next test case
}

TEST_CASE("unchecked mismatch: MPI's own error comes back as comm_error naming the call and MPI's text") {
  // Ranks 0 and 1 only: with more ranks a broadcast tree could leave a rank
  // waiting on a parent that failed, which is exactly what the argument
  // check prevents and this test switches off.
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < 2 ? 0 : MPI_UNDEFINED, world_rank(), &pair);
  if (pair != MPI_COMM_NULL) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(MPI_ERR_TRUNCATE, text, &length);
    const std::string truncated(text, static_cast<std::size_t>(length));
    // MPI's blocking call (no timeout), and the default: the non-blocking
    // call polled against the timeout, whose error Open MPI 4 would hand to
    // MPI_COMM_WORLD's fatal handler if diloco did not ask for the code.
    for (const bool timed : {false, true}) {
      CAPTURE(timed);
      mpi comm(pair, {.check_arguments = false, .timeout = timed ? mpi::options::default_timeout : dc::no_timeout});
      // The root sends more than the other rank can hold.
      std::vector<std::byte> b(comm.rank() == 0 ? 100 : 10);
      if (comm.rank() == 0) {
        comm.broadcast(std::span<std::byte>(b), 0);
      } else {
        const auto msg = error_of<dc::comm_error>([&] { comm.broadcast(std::span<std::byte>(b), 0); });
        CHECK_MESSAGE(contains(msg, timed ? "diloco: mpi broadcast on rank 1: MPI_Testall failed: "
                                          : "diloco: mpi broadcast on rank 1: MPI_Bcast failed: "),
                      msg);
        // Open MPI's non-blocking broadcast reports its own code for the
        // failed schedule, not MPI_ERR_TRUNCATE: the blocking call's text
        // is checked, the polled call's error is a comm_error all the same.
        if (!timed) CHECK(contains(msg, truncated));
      }
    }
    MPI_Comm_free(&pair);
  }
  all_ranks(true);
}
