// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <diloco/diloco.hpp>
#include <mutex>
#include <random>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm_conformance.hpp"

namespace dc = diloco;
using dc::comm::threads;

TEST_CASE("all_reduce sum and mean equal the closed form") {
  for (int m : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      CAPTURE(m);
      CAPTURE(n);
      threads::world world(m);
      world.run([&](threads& comm) {
        const int r = comm.rank();
        // x_r[i] = 1000 r + i: sums are integers below 2^24, exact in fp32.
        std::vector<float> sum(n), mean(n);
        for (std::size_t i = 0; i < n; ++i) sum[i] = mean[i] = static_cast<float>(1000 * r) + static_cast<float>(i);
        comm.all_reduce(sum, dc::reduce_op::sum);
        comm.all_reduce(mean, dc::reduce_op::mean);
        for (std::size_t i = 0; i < n; ++i) {
          const double want = 1000.0 * m * (m - 1) / 2.0 + static_cast<double>(m) * static_cast<double>(i);
          REQUIRE(sum[i] == static_cast<float>(want));
          REQUIRE(mean[i] == doctest::Approx(want / m).epsilon(1e-7));
        }
        const auto bytes = 2 * dc::ring_all_reduce_bytes(n * sizeof(float), m);
        CHECK(comm.traffic().bytes_sent == bytes);
        CHECK(comm.traffic().bytes_received == bytes);
      });
    }
  }
}

TEST_CASE("all_reduce is bitwise deterministic over 50 repetitions") {
  constexpr int m = 4;
  constexpr std::size_t n = 4099;
  std::vector<std::vector<std::uint32_t>> first(m);
  threads::world world(m);
  for (int rep = 0; rep < 50; ++rep) {
    world.run([&](threads& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      // Values of mixed magnitude, where the summation order changes the bits.
      std::mt19937 rng(static_cast<unsigned>(r) + 11);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> x(n);
      for (auto& v : x) v = u(rng) * std::pow(10.0f, static_cast<float>(rng() % 9) - 4.0f);
      // Stagger the ranks so arrival order differs between repetitions.
      std::this_thread::sleep_for(std::chrono::microseconds((rng() + static_cast<unsigned>(rep) * 7919u) % 300));
      comm.all_reduce(x, dc::reduce_op::sum);
      std::vector<std::uint32_t> bits(n);
      std::memcpy(bits.data(), x.data(), n * sizeof(float));
      if (rep == 0) {
        first[r] = bits;
      } else {
        REQUIRE(bits == first[r]);
      }
    });
  }
  for (int r = 1; r < m; ++r) CHECK(first[static_cast<std::size_t>(r)] == first[0]);  // same on every rank
}

TEST_CASE("every operation, blocking and non-blocking, for M = 1..4") {
  static_assert(dc::communicator<threads>);
  static_assert(dc::communicator<dc::comm::local>);
  for (int m = 1; m <= 4; ++m) {
    CAPTURE(m);
    threads::world world(m);
    world.run([](threads& comm) {
      conformance::check_all_operations(comm);
      conformance::check_deterministic(comm, 10);
    });
  }
}

TEST_CASE("the local communicator passes the same checks") {
  dc::comm::local comm;
  conformance::check_all_operations(comm);
}

TEST_CASE("bad byte-buffer arguments are config errors") {
  threads::world world(2);
  world.run([](threads& comm) {
    std::vector<std::byte> send(5), recv(5);
    CHECK_THROWS_WITH_AS(comm.all_to_all(send, recv), doctest::Contains("not a multiple of the world size"),
                         dc::config_error);
    std::vector<std::byte> small(3);
    CHECK_THROWS_WITH_AS(comm.all_gather(send, small), doctest::Contains("recv has 3 bytes, expected 10"),
                         dc::config_error);
    std::vector<std::byte> both(8);
    CHECK_THROWS_WITH_AS(comm.all_gather(std::span<const std::byte>(both.data(), 4), std::span<std::byte>(both)),
                         doctest::Contains("overlap"), dc::config_error);
  });
}

TEST_CASE("a rank with invalid arguments tells the others at once: config_error there, comm_error elsewhere") {
  threads::world world(3, std::chrono::seconds(60));
  std::atomic<int> config{0}, comm{0};
  const auto t0 = std::chrono::steady_clock::now();
  world.run([&](threads& c) {
    std::vector<float> x(4);
    try {
      c.broadcast(std::span<float>(x), c.rank() == 1 ? 7 : 0);  // rank 1 names a root that does not exist
    } catch (const dc::config_error& e) {
      CHECK(c.rank() == 1);
      CHECK(std::string(e.what()).find("root 7 is not a rank") != std::string::npos);
      config.fetch_add(1);
    } catch (const dc::comm_error& e) {
      CHECK(std::string(e.what()).find("rank 1 passed invalid arguments") != std::string::npos);
      comm.fetch_add(1);
    }
    // The communicator is still usable afterwards.
    std::vector<float> y(3, 1.0f);
    c.all_reduce(y, dc::reduce_op::sum);
    CHECK(y[0] == 3.0f);
  });
  CHECK(config.load() == 1);
  CHECK(comm.load() == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // nobody waited for the timeout
}

TEST_CASE("an error in a non-blocking operation surfaces at wait()") {
  threads::world world(2, std::chrono::milliseconds(300));
  CHECK_THROWS_AS(world.run([](threads& comm) {
    std::vector<float> x(comm.rank() == 0 ? 3 : 4);
    auto req = comm.iall_reduce(x, dc::reduce_op::sum);
    req.wait();
  }),
                  dc::comm_error);
}

TEST_CASE("broadcast copies the root's buffer to every rank") {
  for (int root = 0; root < 3; ++root) {
    threads::world world(3);
    world.run([&](threads& comm) {
      std::vector<float> x(5, static_cast<float>(comm.rank()));
      comm.broadcast(std::span<float>(x), root);
      for (float v : x) REQUIRE(v == static_cast<float>(root));
    });
  }
}

TEST_CASE("barrier holds every rank until all arrive") {
  std::atomic<int> before{0};
  threads::world world(4);
  world.run([&](threads& comm) {
    before.fetch_add(1);
    comm.barrier();
    CHECK(before.load() == 4);
  });
}

TEST_CASE("buffers of different sizes on different ranks give comm_error") {
  threads::world world(2);
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    std::vector<float> x(comm.rank() == 0 ? 4 : 5);
    comm.all_reduce(x, dc::reduce_op::sum);
  }),
                       doctest::Contains("buffer sizes differ across ranks"), dc::comm_error);
}

TEST_CASE("ranks calling different collectives give comm_error") {
  threads::world world(2);
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    std::vector<float> x(4);
    if (comm.rank() == 0)
      comm.all_reduce(x, dc::reduce_op::sum);
    else
      comm.broadcast(std::span<float>(x), 0);
  }),
                       doctest::Contains("every rank must call the same collective"), dc::comm_error);
}

TEST_CASE("a rank that leaves early releases the others with comm_error") {
  threads::world world(3);
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    if (comm.rank() == 1) return;  // leaves without taking part
    std::vector<float> x(8);
    comm.all_reduce(x, dc::reduce_op::sum);
  }),
                       doctest::Contains("rank 1 has left the group"), dc::comm_error);
}

TEST_CASE("a rank that throws releases the others and its error is the one reported") {
  threads::world world(3);
  std::atomic<int> released{0};
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    if (comm.rank() == 2) throw std::invalid_argument("boom on rank 2");
    try {
      comm.barrier();
    } catch (const dc::comm_error&) {
      released.fetch_add(1);
      throw;
    }
  }),
                       "boom on rank 2", std::invalid_argument);
  CHECK(released.load() == 2);
}

TEST_CASE("a rank that never arrives times out with comm_error naming it") {
  threads::world world(2, std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    comm.barrier();
  }),
                       doctest::Contains("timed out after 200 ms waiting for rank(s) 1"), dc::comm_error);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited < 10.0);
}

TEST_CASE("no timeout (milliseconds::max()) waits for a late peer instead of overflowing the deadline") {
  // now() + milliseconds::max() overflows to a deadline in the past: before
  // the fix this failed at once with "timed out after 9223372036854775807 ms".
  threads::world world(2, std::chrono::milliseconds::max());
  std::vector<float> sums(2);
  const auto t0 = std::chrono::steady_clock::now();
  world.run([&](threads& comm) {
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<float> x{static_cast<float>(comm.rank() + 1)};
    comm.all_reduce(x, dc::reduce_op::sum);
    sums[static_cast<std::size_t>(comm.rank())] = x[0];
  });
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
  CHECK(sums[0] == 3.0f);  // 1 + 2
  CHECK(sums[1] == 3.0f);
  // The named constant is the same thing.
  CHECK(dc::no_timeout == std::chrono::milliseconds::max());
}

TEST_CASE("a finite timeout above one year is a config_error naming it and the allowed range") {
  using std::chrono::hours;
  using std::chrono::milliseconds;
  // 2 years = 2 * 365 * 24 * 3600 * 1000 ms.
  CHECK_THROWS_WITH_AS(threads::world(2, hours(2 * 365 * 24)),
                       doctest::Contains("timeout is 63072000000 ms; expected a timeout in [1, 31536000000] ms"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(threads::world(2, milliseconds::max() - milliseconds(1)), doctest::Contains("9223372036854775806 ms"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(threads::world(2, milliseconds(-3)), doctest::Contains("is -3 ms"), dc::config_error);
  CHECK_NOTHROW(threads::world(2, hours(365 * 24)));  // exactly one year
  CHECK_NOTHROW(threads::world(2, milliseconds(1)));
}

TEST_CASE("deadlines saturate instead of overflowing") {
  using clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  const clock::time_point zero{};
  CHECK(dc::detail::deadline_after<clock>(milliseconds(3000), zero) == zero + std::chrono::seconds(3));
  CHECK(dc::detail::deadline_after<clock>(milliseconds::max(), zero) == clock::time_point::max());
  // A finite timeout that would pass the clock's end stops at the end.
  const auto late = clock::time_point::max() - std::chrono::seconds(1);
  CHECK(dc::detail::deadline_after<clock>(std::chrono::hours(1), late) == clock::time_point::max());
  CHECK(dc::detail::deadline_after<clock>(milliseconds(999), late) == late + milliseconds(999));
  // exceeded() compares without converting milliseconds::max() to nanoseconds.
  CHECK_FALSE(dc::detail::exceeded(std::chrono::hours(24 * 365 * 200), milliseconds::max()));
  CHECK(dc::detail::exceeded(std::chrono::nanoseconds(3'000'000'001), milliseconds(3000)));
  CHECK_FALSE(dc::detail::exceeded(std::chrono::nanoseconds(3'000'000'000), milliseconds(3000)));
}

TEST_CASE("an error quoted in another rank's message carries no second \"diloco: \" prefix") {
  // Rank 2 arrives late: rank 0, 100 ms ahead of rank 1, times out first
  // and breaks the group, rank 1 is aborted quoting it, and rank 2 finds the
  // group broken. Before, the quotes read "aborted: diloco: threads ...".
  threads::world world(3, std::chrono::milliseconds(200));
  std::vector<std::string> messages(3);
  // run() rethrows the first failure, the timeout, though every rank caught its own.
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    std::vector<float> x(4, 1.0f);
    try {
      comm.all_reduce(x, dc::reduce_op::sum);
    } catch (const dc::comm_error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  }),
                       doctest::Contains("timed out after 200 ms waiting for rank(s) 2"), dc::comm_error);
  std::string all;
  for (const auto& m : messages) {
    CAPTURE(m);
    CHECK(m.rfind("diloco: threads all_reduce on rank ", 0) == 0);
    CHECK(m.find("diloco: ", 1) == std::string::npos);
    all += m + "\n";
  }
  CAPTURE(all);
  CHECK(all.find("timed out after 200 ms waiting for rank(s) 2") != std::string::npos);
  CHECK(messages[1].find("on rank 1 aborted: threads all_reduce on rank 0 timed out") != std::string::npos);
  CHECK(messages[2].find("on rank 2: the group is broken: threads all_reduce on rank 0 timed out") !=
        std::string::npos);

  // A worker's own exception, quoted to the others.
  std::string quoted;
  threads::world w2(2);
  CHECK_THROWS_AS(w2.run([&](threads& comm) {
    if (comm.rank() == 1) dc::detail::raise<dc::numeric_error>("bad numbers");
    try {
      comm.barrier();
    } catch (const dc::comm_error& e) {
      quoted = e.what();
    }
  }),
                  dc::numeric_error);
  CAPTURE(quoted);
  CHECK(quoted.find("rank 1 failed: bad numbers") != std::string::npos);
  CHECK(quoted.find("diloco: ", 1) == std::string::npos);
}

TEST_CASE("bad world arguments are config errors") {
  CHECK_THROWS_WITH_AS(threads::world(0), doctest::Contains("at least 1 worker, got 0"), dc::config_error);
  CHECK_THROWS_AS(threads::world(2, std::chrono::milliseconds(0)), dc::config_error);
  threads::world world(2);
  CHECK_THROWS_WITH_AS(world.run([&](threads& comm) {
    std::vector<float> x(3);
    comm.broadcast(std::span<float>(x), 2);
  }),
                       doctest::Contains("root 2 is not a rank"), dc::config_error);
}
