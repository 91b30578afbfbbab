// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checks of comm_conformance.hpp for communicators over device memory
// (diloco::device_communicator): each rank builds its inputs on the host from
// the same closed forms, copies them to the device, runs the operation,
// copies the result back and compares it with what it computes itself.
// Results are read right after wait() with no extra synchronization, so a
// wait() that returned early shows up as wrong values.

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <diloco/core/concepts.hpp>
#include <random>
#include <string>
#include <vector>

#include "comm_conformance.hpp"

namespace device_conformance {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << " failed: " << cudaGetErrorString(e));
}

// Owning device memory for a test, filled from and read back into vectors.
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t n) : size_(n) {
    if (n != 0) cuda_ok(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)), "cudaMalloc");
  }
  explicit device_array(const std::vector<T>& host) : device_array(host.size()) { upload(host); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }

  // A synchronous copy, finished on the device before any stream reads it
  // (a pageable cudaMemcpy may return before its DMA is done).
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == size_);
    if (size_ == 0) return;
    cuda_ok(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ != 0)
      cuda_ok(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }
  diloco::device_view<T> view() { return {data_, size_}; }
  diloco::device_view<const T> const_view() const { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// The closed-form traffic of each operation, independent of the library.
inline std::uint64_t ring_bytes(std::uint64_t bytes, int m) {
  return m <= 1 ? 0 : 2 * static_cast<std::uint64_t>(m - 1) * bytes / static_cast<std::uint64_t>(m);
}

template <diloco::device_communicator C>
void check_all_reduce(C& comm, std::size_t n, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = conformance::value(r, i);
  device_array<float> sum(x), mean(x);
  const auto before = comm.traffic();
  if (nonblocking) {
    auto a = comm.iall_reduce(sum.view(), diloco::reduce_op::sum);
    auto b = comm.iall_reduce(mean.view(), diloco::reduce_op::mean);
    b.wait();  // waiting out of order is allowed
    a.wait();
  } else {
    comm.all_reduce(sum.view(), diloco::reduce_op::sum);
    comm.all_reduce(mean.view(), diloco::reduce_op::mean);
  }
  const auto s = sum.download(), a = mean.download();
  for (std::size_t i = 0; i < n; ++i) {
    const double want = conformance::sum_over_ranks(m, i);
    REQUIRE(s[i] == static_cast<float>(want));
    REQUIRE(a[i] == doctest::Approx(want / m).epsilon(1e-6));
  }
  const auto after = comm.traffic();
  CHECK(after.bytes_sent - before.bytes_sent == 2 * ring_bytes(n * sizeof(float), m));
  CHECK(after.bytes_received - before.bytes_received == 2 * ring_bytes(n * sizeof(float), m));
}

template <diloco::device_communicator C>
void check_broadcast(C& comm, std::size_t n, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  const int root = static_cast<int>(n % static_cast<std::size_t>(m));
  std::vector<float> f(n);
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) {
    f[i] = conformance::value(r, i);
    b[i] = conformance::pattern(r, 0, i);
  }
  device_array<float> df(f);
  device_array<std::byte> db(b);
  const auto before = comm.traffic();
  if (nonblocking) {
    auto x = comm.ibroadcast(df.view(), root);
    auto y = comm.ibroadcast(db.view(), root);
    x.wait();
    y.wait();
  } else {
    comm.broadcast(df.view(), root);
    comm.broadcast(db.view(), root);
  }
  f = df.download();
  b = db.download();
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(f[i] == conformance::value(root, i));
    REQUIRE(b[i] == conformance::pattern(root, 0, i));
  }
  // A chain from the root: all but the root receive, all but the last send.
  const std::uint64_t bytes = n * (sizeof(float) + 1);
  const auto after = comm.traffic();
  const bool receives = m > 1 && r != root;
  const bool sends = m > 1 && r != (root + m - 1) % m;
  CHECK(after.bytes_received - before.bytes_received == (receives ? bytes : 0));
  CHECK(after.bytes_sent - before.bytes_sent == (sends ? bytes : 0));
}

// Block k of rank r's send is meant for rank k: pattern(r, k, j).
template <diloco::device_communicator C>
void check_all_to_all(C& comm, std::size_t block, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  const auto mm = static_cast<std::size_t>(m);
  std::vector<std::byte> send(block * mm);
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < block; ++j)
      send[static_cast<std::size_t>(k) * block + j] = conformance::pattern(r, k, j);
  device_array<std::byte> dsend(send), drecv(std::vector<std::byte>(block * mm, std::byte{0}));
  const auto before = comm.traffic();
  if (nonblocking)
    comm.iall_to_all(dsend.const_view(), drecv.view()).wait();
  else
    comm.all_to_all(dsend.const_view(), drecv.view());
  const auto recv = drecv.download();
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < block; ++j)
      REQUIRE(recv[static_cast<std::size_t>(k) * block + j] == conformance::pattern(k, r, j));
  const auto after = comm.traffic();
  CHECK(after.bytes_sent - before.bytes_sent == static_cast<std::uint64_t>(m - 1) * block);
  CHECK(after.bytes_received - before.bytes_received == static_cast<std::uint64_t>(m - 1) * block);
}

template <diloco::device_communicator C>
void check_all_gather(C& comm, std::size_t block, bool nonblocking) {
  const int r = comm.rank(), m = comm.size();
  std::vector<std::byte> send(block);
  for (std::size_t j = 0; j < block; ++j) send[j] = conformance::pattern(r, 5, j);
  device_array<std::byte> dsend(send), drecv(std::vector<std::byte>(block * static_cast<std::size_t>(m), std::byte{0}));
  if (nonblocking)
    comm.iall_gather(dsend.const_view(), drecv.view()).wait();
  else
    comm.all_gather(dsend.const_view(), drecv.view());
  const auto recv = drecv.download();
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < block; ++j)
      REQUIRE(recv[static_cast<std::size_t>(k) * block + j] == conformance::pattern(k, 5, j));
}

// Several operations in flight, completed out of issue order; then a
// blocking barrier behind a pending all-reduce.
template <diloco::device_communicator C>
void check_overlapping_requests(C& comm) {
  const int r = comm.rank(), m = comm.size();
  std::vector<float> a(33), c(7);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = conformance::value(r, i);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = conformance::value(r, i + 100);
  std::vector<std::byte> send(5);
  for (std::size_t j = 0; j < send.size(); ++j) send[j] = conformance::pattern(r, 9, j);
  device_array<float> da(a), dc(c);
  device_array<std::byte> dsend(send), dgathered(5 * static_cast<std::size_t>(m));
  auto ra = comm.iall_reduce(da.view(), diloco::reduce_op::sum);
  auto rg = comm.iall_gather(dsend.const_view(), dgathered.view());
  auto rb = comm.ibarrier();
  auto rc = comm.iall_reduce(dc.view(), diloco::reduce_op::sum);
  rc.wait();
  rb.wait();
  rg.wait();
  ra.wait();
  // Complete requests: default-constructed, and already waited on.
  typename C::request empty{};
  REQUIRE(empty.test());
  empty.wait();
  ra.wait();
  a = da.download();
  c = dc.download();
  const auto gathered = dgathered.download();
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == static_cast<float>(conformance::sum_over_ranks(m, i)));
  for (std::size_t i = 0; i < c.size(); ++i)
    REQUIRE(c[i] == static_cast<float>(conformance::sum_over_ranks(m, i + 100)));
  for (int k = 0; k < m; ++k)
    for (std::size_t j = 0; j < send.size(); ++j)
      REQUIRE(gathered[static_cast<std::size_t>(k) * send.size() + j] == conformance::pattern(k, 9, j));

  device_array<float> dd(std::vector<float>(3, static_cast<float>(r)));
  auto rd = comm.iall_reduce(dd.view(), diloco::reduce_op::sum);
  comm.barrier();
  // The barrier completes after everything issued before it on this rank.
  for (float v : dd.download()) REQUIRE(v == static_cast<float>(m * (m - 1) / 2));
  rd.wait();

  // test() polls until done; the result is then readable.
  device_array<float> de(std::vector<float>(4, 1.0f));
  auto re = comm.iall_reduce(de.view(), diloco::reduce_op::sum);
  while (!re.test()) {
  }
  for (float v : de.download()) REQUIRE(v == static_cast<float>(m));
  CHECK(re.test());  // a finished request stays finished
}

// Random inputs of mixed magnitude (where summation order shows in the
// bits): every rank ends with the same bits, and repetitions give the same
// bits again. DiLoCo's replicas stay identical only if both hold.
template <diloco::device_communicator C>
void check_deterministic(C& comm, int repetitions) {
  const int r = comm.rank(), m = comm.size();
  std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> input(10007);
  for (auto& v : input) v = u(rng) * static_cast<float>(1 << (rng() % 20));
  const std::size_t bytes = input.size() * sizeof(float);
  std::vector<std::byte> first;
  for (int rep = 0; rep < repetitions; ++rep) {
    device_array<float> x(input);
    comm.all_reduce(x.view(), diloco::reduce_op::sum);
    const auto result = x.download();
    std::vector<std::byte> mine(bytes);
    std::memcpy(mine.data(), result.data(), bytes);
    if (rep == 0)
      first = mine;
    else
      REQUIRE(mine == first);
    device_array<std::byte> dmine(mine), everyone(bytes * static_cast<std::size_t>(m));
    comm.all_gather(dmine.const_view(), everyone.view());
    const auto all = everyone.download();
    for (int k = 0; k < m; ++k)
      REQUIRE(std::memcmp(all.data() + static_cast<std::size_t>(k) * bytes, mine.data(), bytes) == 0);
  }
}

template <diloco::device_communicator C>
void check_all_operations(C& comm) {
  for (bool nonblocking : {false, true}) {
    CAPTURE(nonblocking);
    for (std::size_t n : conformance::sizes) {
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
  check_deterministic(comm, 5);
}

}  // namespace device_conformance
