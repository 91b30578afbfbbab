// SPDX-License-Identifier: Apache-2.0
#pragma once

// One test body for every communicator: each rank checks every collective,
// blocking and non-blocking, over sizes including 0 and odd counts, against
// values it computes on its own from the rank-dependent inputs' closed form.
// Used by the threads tests in-process and by the MPI and Gloo tests in
// separate processes.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <diloco/core/concepts.hpp>
#include <random>
#include <span>
#include <vector>

namespace conformance {

inline const std::size_t sizes[] = {0, 1, 3, 17, 1000, 4097};

// x_r[i] = (r + 1) / 2 + i: sums over ranks are exact in fp32 here.
inline float value(int r, std::size_t i) { return 0.5f * static_cast<float>(r + 1) + static_cast<float>(i); }
inline double sum_over_ranks(int m, std::size_t i) {
  return 0.25 * m * (m + 1) + static_cast<double>(m) * static_cast<double>(i);
}
inline std::byte pattern(int a, int b, std::size_t j) {
  return static_cast<std::byte>((a * 31 + b * 7 + static_cast<int>(j % 251)) & 0xff);
}

template <diloco::communicator C>
void check_all_reduce(C& comm, std::size_t n, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  std::vector<float> sum(n), mean(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = mean[i] = value(r, i);
  if (nonblocking) {
    auto a = comm.iall_reduce(sum, diloco::reduce_op::sum);
    auto b = comm.iall_reduce(mean, diloco::reduce_op::mean);
    b.wait();  // waiting out of order is allowed
    a.wait();
  } else {
    comm.all_reduce(sum, diloco::reduce_op::sum);
    comm.all_reduce(mean, diloco::reduce_op::mean);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double want = sum_over_ranks(m, i);
    REQUIRE(sum[i] == static_cast<float>(want));
    REQUIRE(mean[i] == doctest::Approx(want / m).epsilon(1e-6));
  }
}

template <diloco::communicator C>
void check_broadcast(C& comm, std::size_t n, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  const int root = static_cast<int>(n % static_cast<std::size_t>(m));
  std::vector<float> f(n);
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) {
    f[i] = value(r, i);
    b[i] = pattern(r, 0, i);
  }
  if (nonblocking) {
    auto a = comm.ibroadcast(std::span<float>(f), root);
    auto c = comm.ibroadcast(std::span<std::byte>(b), root);
    a.wait();
    c.wait();
  } else {
    comm.broadcast(std::span<float>(f), root);
    comm.broadcast(std::span<std::byte>(b), root);
  }
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(f[i] == value(root, i));
    REQUIRE(b[i] == pattern(root, 0, i));
  }
}

// Block k of rank r's send is meant for rank k: pattern(r, k, j).
template <diloco::communicator C>
void check_all_to_all(C& comm, std::size_t block, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  const auto mm = static_cast<std::size_t>(m);
  std::vector<std::byte> send(block * mm), recv(block * mm, std::byte{0});
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < block; ++j) send[static_cast<std::size_t>(k) * block + j] = pattern(r, k, j);
  if (nonblocking)
    comm.iall_to_all(send, recv).wait();
  else
    comm.all_to_all(send, recv);
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < block; ++j) REQUIRE(recv[static_cast<std::size_t>(k) * block + j] == pattern(k, r, j));
}

template <diloco::communicator C>
void check_all_gather(C& comm, std::size_t block, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  std::vector<std::byte> send(block), recv(block * static_cast<std::size_t>(m), std::byte{0});
  for (std::size_t j = 0; j < block; ++j) send[j] = pattern(r, 5, j);
  if (nonblocking)
    comm.iall_gather(send, recv).wait();
  else
    comm.all_gather(send, recv);
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < block; ++j) REQUIRE(recv[static_cast<std::size_t>(k) * block + j] == pattern(k, 5, j));
}

// Several non-blocking operations in flight at once, completed in an order
// other than their issue order.
template <diloco::communicator C>
void check_overlapping_requests(C& comm) {
  const int r = comm.rank(), m = comm.size();
  std::vector<float> a(33), c(7);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = value(r, i);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = value(r, i + 100);
  std::vector<std::byte> send(5), gathered(5 * static_cast<std::size_t>(m));
  for (std::size_t j = 0; j < send.size(); ++j) send[j] = pattern(r, 9, j);
  auto ra = comm.iall_reduce(a, diloco::reduce_op::sum);
  auto rg = comm.iall_gather(send, gathered);
  auto rb = comm.ibarrier();
  auto rc = comm.iall_reduce(c, diloco::reduce_op::sum);
  rc.wait();
  rb.wait();
  rg.wait();
  ra.wait();
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == static_cast<float>(sum_over_ranks(m, i)));
  for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == static_cast<float>(sum_over_ranks(m, i + 100)));
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < send.size(); ++j)
      REQUIRE(gathered[static_cast<std::size_t>(k) * send.size() + j] == pattern(k, 9, j));
  // A default-constructed request is complete, and so is one waited on:
  // waiting again returns at once.
  typename C::request empty{};
  REQUIRE(empty.test());
  empty.wait();
  ra.wait();
  // A blocking operation after pending ones must not overtake them.
  std::vector<float> d(3, static_cast<float>(r));
  auto rd = comm.iall_reduce(d, diloco::reduce_op::sum);
  comm.barrier();
  rd.wait();
  for (float v : d) REQUIRE(v == static_cast<float>(m * (m - 1) / 2));
}

// Random inputs of mixed magnitude (where summation order shows in the
// bits): repeated all-reduces of the same inputs give the same bits.
template <diloco::communicator C>
void check_deterministic(C& comm, int repetitions) {
  const int r = comm.rank();
  std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> input(10007);
  for (auto& v : input) v = u(rng) * static_cast<float>(1 << (rng() % 20));
  std::vector<std::uint32_t> first;
  for (int rep = 0; rep < repetitions; ++rep) {
    std::vector<float> x = input;
    comm.all_reduce(x, diloco::reduce_op::sum);
    std::vector<std::uint32_t> bits(x.size());
    std::memcpy(bits.data(), x.data(), x.size() * sizeof(float));
    if (rep == 0)
      first = bits;
    else
      REQUIRE(bits == first);
  }
}

template <diloco::communicator C>
void check_all_operations(C& comm) {
  for (bool nonblocking : {false, true}) {
    CAPTURE(nonblocking);
    for (std::size_t n : sizes) {
      CAPTURE(n);
      check_all_reduce(comm, n, nonblocking);
      check_broadcast(comm, n, nonblocking);
      check_all_to_all(comm, n, nonblocking);
      check_all_gather(comm, n, nonblocking);
    }
    if (nonblocking)
      comm.ibarrier().wait();
    else
      comm.barrier();
  }
  check_overlapping_requests(comm);
  const auto t = comm.traffic();
  if (comm.size() > 1) {
    CHECK(t.bytes_sent > 0);
    CHECK(t.bytes_received > 0);
  }
}

}  // namespace conformance
