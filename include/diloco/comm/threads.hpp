#pragma once

// In-process communicator: M workers as M threads of one process, exchanging
// through shared memory. It is the embedded default and what the tests and
// the demo use to simulate a group of machines on one.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm {

namespace detail_threads {

// What one rank announced for the collective it entered.
struct slot {
  const char* op = nullptr;  // operation name, for messages and agreement checks
  void* data = nullptr;
  std::size_t count = 0;  // elements
  int arg = 0;            // reduce_op or root
};

// State shared by the ranks of one world.
struct group {
  explicit group(int n, std::chrono::milliseconds t) : size(n), timeout(t), slots(n), arrived(n), departed(n) {}

  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  int arrived_count = 0;
  std::vector<slot> slots;
  std::vector<char> arrived;   // who reached the current barrier
  std::vector<char> departed;  // whose worker function has returned
  bool broken = false;
  std::string broken_reason;
  std::exception_ptr root_cause;

  void reset() {
    std::lock_guard lock(mutex);
    generation = 0;
    arrived_count = 0;
    std::fill(slots.begin(), slots.end(), slot{});
    std::fill(arrived.begin(), arrived.end(), 0);
    std::fill(departed.begin(), departed.end(), 0);
    broken = false;
    broken_reason.clear();
    root_cause = nullptr;
  }

  std::string missing_ranks() const {
    std::string out;
    for (int r = 0; r < size; ++r)
      if (!arrived[static_cast<std::size_t>(r)]) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  }

  // Marks the group broken with `message` as the cause (if nothing broke it
  // before) and returns the error to throw. Called with the mutex held.
  comm_error break_with(std::string message) {
    comm_error e(message);
    if (!broken) {
      broken = true;
      broken_reason = std::move(message);
      root_cause = std::make_exception_ptr(e);
    }
    cv.notify_all();
    return e;
  }

  // Blocks until every rank has arrived, one has failed or left, or the
  // timeout passes. `what` names the operation for messages.
  void arrive_and_wait(int rank, const char* what) {
    std::unique_lock lock(mutex);
    if (broken) throw comm_error(diloco::detail::concat("diloco: threads ", what, " on rank ", rank,
                                                        ": the group is broken: ", broken_reason));
    const std::uint64_t gen = generation;
    arrived[static_cast<std::size_t>(rank)] = 1;
    if (++arrived_count == size) {
      arrived_count = 0;
      std::fill(arrived.begin(), arrived.end(), 0);
      ++generation;
      cv.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto gone = [&] { return std::find(departed.begin(), departed.end(), char{1}) != departed.end(); };
    while (generation == gen) {
      if (broken)
        throw comm_error(diloco::detail::concat("diloco: threads ", what, " on rank ", rank,
                                                " aborted: ", broken_reason));
      if (gone()) {
        const auto r = static_cast<int>(std::find(departed.begin(), departed.end(), char{1}) - departed.begin());
        throw break_with(diloco::detail::concat("diloco: threads ", what, " on rank ", rank, ": rank ", r,
                                                " has left the group (its worker function returned); the "
                                                "operation needs all ",
                                                size, " ranks"));
      }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && generation == gen) {
        throw break_with(diloco::detail::concat("diloco: threads ", what, " on rank ", rank, " timed out after ",
                                                timeout.count(), " ms waiting for rank(s) ", missing_ranks()));
      }
    }
  }
};

}  // namespace detail_threads

class threads {
 public:
  // A group of `size` workers living in this process.
  class world {
   public:
    explicit world(int size, std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
      if (size <= 0)
        diloco::detail::raise<config_error>("comm::threads::world needs at least 1 worker, got ", size);
      if (timeout.count() <= 0)
        diloco::detail::raise<config_error>("comm::threads::world timeout must be positive, got ", timeout.count(),
                                            " ms");
      group_ = std::make_shared<detail_threads::group>(size, timeout);
    }

    int size() const { return group_->size; }

    // Runs fn(comm) on `size` threads, one per rank, and waits for all of
    // them. If a worker throws, the others are released from any collective
    // with a comm_error and the first failure (the cause, not its echoes) is
    // rethrown here once every thread has finished.
    template <class F>
    void run(F&& fn) {
      group_->reset();
      std::vector<std::thread> workers;
      workers.reserve(static_cast<std::size_t>(size()));
      for (int r = 0; r < size(); ++r) {
        workers.emplace_back([this, r, &fn] {
          threads comm(group_, r);
          try {
            fn(comm);
          } catch (...) {
            std::lock_guard lock(group_->mutex);
            if (!group_->broken) {
              group_->broken = true;
              group_->root_cause = std::current_exception();
              try {
                throw;
              } catch (const std::exception& e) {
                group_->broken_reason = diloco::detail::concat("rank ", r, " failed: ", e.what());
              } catch (...) {
                group_->broken_reason = diloco::detail::concat("rank ", r, " failed with a non-standard exception");
              }
            }
            group_->cv.notify_all();
          }
          std::lock_guard lock(group_->mutex);
          group_->departed[static_cast<std::size_t>(r)] = 1;
          group_->cv.notify_all();
        });
      }
      for (auto& t : workers) t.join();
      if (group_->root_cause) std::rethrow_exception(group_->root_cause);
    }

   private:
    std::shared_ptr<detail_threads::group> group_;
  };

  int rank() const { return rank_; }
  int size() const { return group_->size; }
  // How many workers share this process (and its cores).
  int workers_in_process() const { return group_->size; }
  traffic_counters traffic() const { return traffic_; }

  // In-place all-reduce of fp32 buffers. Deterministic: rank r sums its
  // 1/M slice of every buffer in rank order and writes the result back into
  // all of them, so the bits never depend on thread timing.
  void all_reduce(std::span<float> buf, reduce_op op) {
    enter("all_reduce", buf.data(), buf.size(), static_cast<int>(op));
    const int m = size();
    const std::size_t n = buf.size();
    const std::size_t lo = n * static_cast<std::size_t>(rank_) / static_cast<std::size_t>(m);
    const std::size_t hi = n * static_cast<std::size_t>(rank_ + 1) / static_cast<std::size_t>(m);
    std::vector<float*> ptrs(static_cast<std::size_t>(m));
    for (int k = 0; k < m; ++k) ptrs[static_cast<std::size_t>(k)] = static_cast<float*>(group_->slots[static_cast<std::size_t>(k)].data);
    const auto fm = static_cast<float>(m);
    for (std::size_t i = lo; i < hi; ++i) {
      float s = ptrs[0][i];
      for (int k = 1; k < m; ++k) s += ptrs[static_cast<std::size_t>(k)][i];
      if (op == reduce_op::mean) s = s / fm;
      for (int k = 0; k < m; ++k) ptrs[static_cast<std::size_t>(k)][i] = s;
    }
    group_->arrive_and_wait(rank_, "all_reduce");
    const std::uint64_t bytes = ring_all_reduce_bytes(n * sizeof(float), m);
    traffic_.bytes_sent += bytes;
    traffic_.bytes_received += bytes;
  }

  // Copies root's buffer into every rank's buffer.
  void broadcast(std::span<float> buf, int root) {
    if (root < 0 || root >= size())
      diloco::detail::raise<config_error>("threads broadcast: root ", root, " is not a rank of a world of ", size());
    enter("broadcast", buf.data(), buf.size(), root);
    if (rank_ != root && !buf.empty())
      std::memcpy(buf.data(), group_->slots[static_cast<std::size_t>(root)].data, buf.size() * sizeof(float));
    group_->arrive_and_wait(rank_, "broadcast");
    // A pipelined chain root -> root+1 -> ...: every rank but the last
    // forwards the buffer once, every rank but the root receives it once.
    const std::uint64_t bytes = buf.size() * sizeof(float);
    if (size() > 1) {
      if (rank_ != root) traffic_.bytes_received += bytes;
      if (rank_ != (root + size() - 1) % size()) traffic_.bytes_sent += bytes;
    }
  }

  void barrier() { group_->arrive_and_wait(rank_, "barrier"); }

 private:
  threads(std::shared_ptr<detail_threads::group> g, int rank) : group_(std::move(g)), rank_(rank) {}

  // Publishes this rank's arguments, waits for the others, and checks that
  // all ranks entered the same operation with the same sizes.
  void enter(const char* op, void* data, std::size_t count, int arg) {
    auto& g = *group_;
    {
      std::lock_guard lock(g.mutex);
      g.slots[static_cast<std::size_t>(rank_)] = detail_threads::slot{op, data, count, arg};
    }
    g.arrive_and_wait(rank_, op);
    // Every rank runs the same check on the same published slots, so all of
    // them reach the same verdict and none is left waiting.
    for (int k = 0; k < g.size; ++k) {
      const auto& s = g.slots[static_cast<std::size_t>(k)];
      const auto& mine = g.slots[static_cast<std::size_t>(rank_)];
      if (std::strcmp(s.op, op) != 0)
        diloco::detail::raise<comm_error>("threads ", op, " on rank ", rank_, ": rank ", k, " entered ", s.op,
                                          " instead; every rank must call the same collective in the same order");
      if (s.count != mine.count)
        diloco::detail::raise<comm_error>("threads ", op, " on rank ", rank_, ": buffer sizes differ across ranks (rank ",
                                          k, " has ", s.count, " elements, rank ", rank_, " has ", mine.count, ")");
      if (s.arg != mine.arg)
        diloco::detail::raise<comm_error>("threads ", op, " on rank ", rank_, ": ranks disagree on the ",
                                          std::strcmp(op, "broadcast") == 0 ? "root" : "reduction", " (rank ", k,
                                          " passed ", s.arg, ", rank ", rank_, " passed ", mine.arg, ")");
    }
  }

  std::shared_ptr<detail_threads::group> group_;
  int rank_ = 0;
  traffic_counters traffic_{};
};

}  // namespace diloco::comm
