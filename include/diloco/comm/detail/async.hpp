// SPDX-License-Identifier: Apache-2.0
#pragma once

// Non-blocking collectives for communicators whose transport is blocking
// (threads, Gloo): one progress thread per communicator runs the operations
// in the order they were issued, and each returns a request to wait() on.
// A caller's task may run there too (the communicators' submit()): inside
// it, the communicator's blocking operations run at once, on that thread.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "diloco/comm/detail/batch_policy.hpp"
#include "diloco/comm/detail/request.hpp"
#include "diloco/core/comm_types.hpp"

namespace diloco::comm {

namespace detail {

struct request_state {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
};

}  // namespace detail

namespace detail {

class progress_queue;

// A task on a progress thread, as a request holds it (request.hpp).
struct queued_op {
  using issuer = progress_queue;
  std::shared_ptr<request_state> state;

  bool active() const { return state != nullptr; }

  void wait() {
    auto s = std::move(state);
    std::unique_lock lock(s->mutex);
    s->cv.wait(lock, [&] { return s->done; });
    // Take the error out under the lock: the exception then belongs to the
    // waiting thread alone, whichever thread drops the state last.
    const std::exception_ptr error = std::move(s->error);
    lock.unlock();
    if (error) std::rethrow_exception(error);
  }

  bool test() {
    {
      std::lock_guard lock(state->mutex);
      if (!state->done) return false;
    }
    wait();
    return true;
  }
};

}  // namespace detail

/// The handle of a non-blocking collective of comm::threads and comm::gloo
/// (detail::basic_request): wait() blocks until the operation has completed
/// and rethrows its error; test() polls. The buffers passed to the operation
/// must stay alive and untouched until then.
using async_request = detail::basic_request<detail::queued_op>;

namespace detail {

// Runs tasks one at a time, in submission order, on its own thread, started
// on first use. Only the owning communicator's thread submits.
class progress_queue {
 public:
  progress_queue() = default;
  progress_queue(const progress_queue&) = delete;
  progress_queue& operator=(const progress_queue&) = delete;
  ~progress_queue() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  // True when no task is queued or running: a blocking operation may then
  // run on the caller's thread without reordering anything.
  bool idle() {
    std::lock_guard lock(mutex_);
    return tasks_.empty() && !running_;
  }

  // A blocking operation: runs f on the caller's thread unless
  // non-blocking ones are still pending, which it must not overtake; then
  // it waits behind them (their errors stay with their own requests). On
  // the progress thread itself (a submitted task calling a blocking
  // operation) f runs at once: it is the task in order.
  template <class F>
  void run_in_order(F&& f) {
    if (current_ == this || idle())
      f();
    else
      submit(std::function<void()>(std::forward<F>(f))).wait();
  }

  // Run the progress thread under SCHED_BATCH (comm/detail/batch_policy.hpp).
  // Takes effect when the thread starts (first submit()).
  void set_batch_scheduling(bool on) {
    std::lock_guard lock(mutex_);
    batch_ = on;
  }

  async_request submit(std::function<void()> task) {
    auto state = std::make_shared<request_state>();
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
      tasks_.push_back({std::move(task), state});
      cv_.notify_all();
    }
    return async_request(queued_op{std::move(state)});
  }

 private:
  struct item {
    std::function<void()> task;
    std::shared_ptr<request_state> state;
  };

  void loop() {
    current_ = this;
    std::unique_lock lock(mutex_);
    if (batch_) enter_batch_policy();
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop requested and nothing left
      item it = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        it.task();
      } catch (...) {
        error = std::current_exception();
      }
      it.state->finish(std::move(error));
      lock.lock();
      running_ = false;
    }
  }

  // The queue whose progress thread this is (null on every other thread).
  static inline thread_local const progress_queue* current_ = nullptr;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<item> tasks_;
  bool running_ = false;
  bool stop_ = false;
  bool batch_ = false;
  std::thread thread_;
};

// The traffic counters of a communicator with a progress thread: the
// issuing thread counts a non-blocking operation, the progress thread the
// blocking operations a submitted task runs, and traffic() reads them from
// either.
class shared_traffic {
 public:
  traffic_counters get() const {
    std::lock_guard lock(mutex_);
    return counters_;
  }
  /// The models of core/comm_types.hpp, under the lock.
  ///@{
  void add_all_reduce(std::uint64_t bytes, int world) {
    std::lock_guard lock(mutex_);
    counters_.add_all_reduce(bytes, world);
  }
  void add_broadcast(std::uint64_t bytes, int rank, int root, int world) {
    std::lock_guard lock(mutex_);
    counters_.add_broadcast(bytes, rank, root, world);
  }
  void add_exchange(std::uint64_t block, int world) {
    std::lock_guard lock(mutex_);
    counters_.add_exchange(block, world);
  }
  ///@}

 private:
  mutable std::mutex mutex_;
  traffic_counters counters_{};
};

}  // namespace detail
}  // namespace diloco::comm
