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
#include <condition_variable>
#include <cstdint>
#include <diloco/comm/detail/async.hpp>
#include <diloco/diloco.hpp>
#include <memory>
#include <mutex>
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

// Whether a link's collectives ran beside the caller's inner steps or were
// waited for: an event, counted, where a time would only stand for it.
// gated_link holds each non-blocking collective on its progress thread
// until the caller has started an inner step (step()) after issuing it, or
// until the caller waits for it first; the collective then counts as
// overlapped (a step released it) or waited (the caller waited with no
// inner step in between). A blocking collective counts as waited. step()
// lasts until every collective it released has completed (an inner step
// that is longer than one collective, as a step that hides the exchange
// is): a stage then completes within the step after it was issued, and the
// engine's poll after that step finds it, whatever the scheduler does. One
// gate per rank; only that rank's training thread calls step(). `limit`
// only guards against a hang (counted in hung()).
class overlap_gate {
 public:
  struct ticket {
    std::uint64_t at;     // steps started when it was issued
    bool waited = false;  // the caller waits for it (or dropped it)
  };

  explicit overlap_gate(std::chrono::seconds limit = std::chrono::seconds(60)) : limit_(limit) {}

  // The caller starts an inner step.
  void step() {
    std::unique_lock lock(mutex_);
    ++steps_;
    cv_.notify_all();
    if (!cv_.wait_for(lock, limit_, [&] { return finished_ == issued_; })) ++hung_;
  }

  // Counts from here on (after the algorithm's construction: its start-up
  // agreement is blocking control traffic, not a round's).
  void restart_counts() {
    std::lock_guard lock(mutex_);
    overlapped_ = waited_ = 0;
  }
  int overlapped() const { return get(overlapped_); }
  int waited() const { return get(waited_); }
  int hung() const { return get(hung_); }

  // The link's side.
  std::shared_ptr<ticket> issue() {
    std::lock_guard lock(mutex_);
    ++issued_;
    return std::make_shared<ticket>(ticket{steps_});
  }
  // On the progress thread, before the collective runs.
  void hold(const ticket& t) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, limit_, [&] { return steps_ > t.at || t.waited; })) ++hung_;
    ++(steps_ > t.at ? overlapped_ : waited_);
  }
  // On the progress thread, once the collective's request has completed.
  void finished() {
    std::lock_guard lock(mutex_);
    ++finished_;
    cv_.notify_all();
  }
  void caller_waits(ticket& t) {
    std::lock_guard lock(mutex_);
    t.waited = true;
    cv_.notify_all();
  }
  void blocking() {
    std::lock_guard lock(mutex_);
    ++waited_;
  }

 private:
  int get(const int& n) const {
    std::lock_guard lock(mutex_);
    return n;
  }
  std::chrono::seconds limit_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t steps_ = 0;
  int issued_ = 0, finished_ = 0, overlapped_ = 0, waited_ = 0, hung_ = 0;
};

// A gated_link's request: wait() (or dropping it) tells the gate that the
// caller waits for the collective, then waits for it.
class gated_request {
 public:
  gated_request() = default;
  gated_request(overlap_gate& g, std::shared_ptr<overlap_gate::ticket> t, diloco::comm::async_request op,
                diloco::comm::async_request marker)
      : gate_(&g), ticket_(std::move(t)), op_(std::move(op)), marker_(std::move(marker)) {}
  gated_request(gated_request&&) noexcept = default;
  gated_request& operator=(gated_request&& o) noexcept {
    if (this != &o) {
      release();
      gate_ = o.gate_;
      ticket_ = std::move(o.ticket_);
      op_ = std::move(o.op_);
      marker_ = std::move(o.marker_);
    }
    return *this;
  }
  ~gated_request() { release(); }

  void wait() {
    release();
    op_.wait();
  }
  bool test() { return op_.test(); }

 private:
  void release() {
    if (ticket_) gate_->caller_waits(*ticket_);
    ticket_.reset();
  }
  overlap_gate* gate_ = nullptr;
  std::shared_ptr<overlap_gate::ticket> ticket_;
  diloco::comm::async_request op_, marker_;
};

// A link whose fp32 all-reduce, all-to-all and all-gather go through an
// overlap_gate: the non-blocking ones on a progress thread of the link's
// own, held there as the gate says; the blocking ones (the position record
// aside: control traffic) counted as waited. Device: over device views, as
// a device communicator.
template <bool Device>
class gated_link : public threads_link<Device> {
  using base = threads_link<Device>;
  template <class T>
  using view = typename base::template view<T>;

 public:
  gated_link(diloco::comm::threads& c, overlap_gate& g) : base(c), gate_(&g) {}
  using request = gated_request;
  void all_reduce(view<float> b, diloco::reduce_op op) {
    gate_->blocking();
    this->threads().all_reduce(base::span(b), op);
  }
  void all_to_all(view<const std::byte> s, view<std::byte> r) {
    gate_->blocking();
    this->threads().all_to_all(base::span(s), base::span(r));
  }
  void all_gather(view<const std::byte> s, view<std::byte> r) {
    if (!position_record(s.size())) gate_->blocking();
    this->threads().all_gather(base::span(s), base::span(r));
  }
  request iall_reduce(view<float> b, diloco::reduce_op op) {
    return gated([this, b, op] { this->threads().all_reduce(base::span(b), op); });
  }
  request iall_to_all(view<const std::byte> s, view<std::byte> r) {
    return gated([this, s, r] { this->threads().all_to_all(base::span(s), base::span(r)); });
  }
  request iall_gather(view<const std::byte> s, view<std::byte> r) {
    return gated([this, s, r] { this->threads().all_gather(base::span(s), base::span(r)); });
  }

 private:
  template <class F>
  request gated(F f) {
    auto t = gate_->issue();
    auto op = queue_.submit([this, t, f] {
      gate_->hold(*t);
      f();
    });
    // Runs once the collective's request is complete (tasks run in order):
    // a step that waits for finished() finds the request done.
    auto marker = queue_.submit([this] { gate_->finished(); });
    return request(*gate_, std::move(t), std::move(op), std::move(marker));
  }
  overlap_gate* gate_;
  diloco::comm::detail::progress_queue queue_;
};

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
