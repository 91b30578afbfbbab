// SPDX-License-Identifier: Apache-2.0
// Communicators over comm::threads that forward every operation (comm_link),
// for tests that count, record or damage what passes through: derive, and
// redefine every overload of the names you change. threads_host_link takes
// host spans (a communicator); threads_device_link takes device views only
// (a device_communicator, as NCCL is) for the programs that replay device
// code on the host, where device memory is host memory.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <diloco/comm/detail/async.hpp>
#include <diloco/diloco.hpp>
#include <span>
#include <string>
#include <thread>
#include <type_traits>

#include "comm_link.hpp"

template <bool Device>
class threads_link : public comm_link<Device, diloco::comm::threads> {
 public:
  using comm_link<Device, diloco::comm::threads>::comm_link;

 protected:
  diloco::comm::threads& threads() { return this->inner(); }
};

using threads_host_link = threads_link<false>;
using threads_device_link = threads_link<true>;

static_assert(diloco::communicator<threads_host_link>);
static_assert(diloco::device_communicator<threads_device_link> && !diloco::communicator<threads_device_link>);

// Every fp32 all-reduce, all-to-all and all-gather takes `delay` longer,
// inside the transfer: the blocking ones on the caller's thread, the
// non-blocking ones on a progress thread of this link's own, so they overlap
// whatever the caller does meanwhile (a slow link). Device: over device
// views, as a device communicator.
template <bool Device>
class slow_link : public threads_link<Device> {
  using base = threads_link<Device>;
  template <class T>
  using view = typename base::template view<T>;

 public:
  slow_link(diloco::comm::threads& c, std::chrono::milliseconds d) : base(c), delay_(d) {}
  using request = diloco::comm::async_request;
  void all_reduce(view<float> b, diloco::reduce_op op) { slowly([&] { this->threads().all_reduce(base::span(b), op); }); }
  void all_to_all(view<const std::byte> s, view<std::byte> r) {
    slowly([&] { this->threads().all_to_all(base::span(s), base::span(r)); });
  }
  void all_gather(view<const std::byte> s, view<std::byte> r) {
    slowly([&] { this->threads().all_gather(base::span(s), base::span(r)); });
  }
  request iall_reduce(view<float> b, diloco::reduce_op op) {
    return queue_.submit([this, b, op] { slowly([&] { this->threads().all_reduce(base::span(b), op); }); });
  }
  request iall_to_all(view<const std::byte> s, view<std::byte> r) {
    return queue_.submit([this, s, r] { slowly([&] { this->threads().all_to_all(base::span(s), base::span(r)); }); });
  }
  request iall_gather(view<const std::byte> s, view<std::byte> r) {
    return queue_.submit([this, s, r] { slowly([&] { this->threads().all_gather(base::span(s), base::span(r)); }); });
  }

 private:
  template <class F>
  void slowly(F&& f) {
    std::this_thread::sleep_for(delay_);
    f();
  }
  std::chrono::milliseconds delay_;
  diloco::comm::detail::progress_queue queue_;
};

// The engine's position record (core/agreement.hpp: one blocking all-gather
// of sizeof(position_record) bytes before each reduction begins and at
// finish()) is control traffic, not a round's segment: the links that log
// or damage segments pass it by. No segment is that small (its header alone
// is wire::header_bytes).
inline bool position_record(std::size_t bytes) { return bytes == sizeof(diloco::detail::position_record); }
static_assert(sizeof(diloco::detail::position_record) < diloco::wire::header_bytes);

// A threads communicator that, once armed, flips one byte of what the
// `which`-th segment all-gather after arming delivers to `victim`: byte
// `offset` of rank 1's slot (inside its segment's payload, past the 64-byte
// header).
class flaky_gather : public threads_host_link {
 public:
  flaky_gather(diloco::comm::threads& c, int victim, int which = 1, std::size_t offset = 80)
      : threads_host_link(c), victim_(victim), which_(which), offset_(offset) {}
  void arm() { armed_ = 1; }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) {
    threads().all_gather(s, r);
    if (position_record(s.size())) return;
    if (armed_ > 0 && armed_++ == which_ && rank() == victim_) r[s.size() + offset_] ^= std::byte{0x10};
  }

 private:
  int victim_, which_, armed_ = 0;
  std::size_t offset_;
};

// Runs `step`, a round in which `victim` received corrupt bytes: every rank
// must raise format_error; the victim's names the checksum (counted in
// `precise`), the others name the victim's report.
template <class Step>
void expect_corrupt_round(int rank, int victim, Step&& step, std::atomic<int>& precise) {
  try {
    step();
    FAIL("the corrupt round was applied");
  } catch (const diloco::format_error& e) {
    const std::string what = e.what();
    if (rank == victim) {
      if (what.find("checksum mismatch") != std::string::npos) precise.fetch_add(1);
    } else {
      CHECK(what.find("rank(s) " + std::to_string(victim) + " received corrupt compressed data") != std::string::npos);
    }
  }
}
