#pragma once

// In-process communicator: M workers as M threads of one process, exchanging
// through shared memory. It is the embedded default and what the tests and
// the demo use to simulate a group of machines on one.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
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
#include "diloco/core/timeout.hpp"
#include "diloco/comm/detail/async.hpp"

namespace diloco::comm {

namespace detail_threads {

// What one rank announced for the collective it entered.
struct slot {
  const char* op = nullptr;  // operation name, for messages and agreement checks
  const void* send = nullptr;
  void* data = nullptr;   // the buffer written (in place for all_reduce/broadcast)
  std::size_t count = 0;  // elements (bytes for byte operations)
  int arg = 0;            // reduce_op or root
  const char* problem = nullptr;  // what is wrong with this rank's arguments, if anything
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
      // Quoted in the other ranks' messages, after their own prefix.
      broken_reason = std::string(diloco::detail::unprefixed(message));
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
    const auto deadline = diloco::detail::deadline_after(timeout);
    const bool bounded = deadline != std::chrono::steady_clock::time_point::max();
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
      if (!bounded) {
        cv.wait(lock);
      } else if (cv.wait_until(lock, deadline) == std::cv_status::timeout && generation == gen) {
        throw break_with(diloco::detail::concat("diloco: threads ", what, " on rank ", rank, " timed out after ",
                                                timeout.count(), " ms waiting for rank(s) ", missing_ranks()));
      }
    }
  }
};

}  // namespace detail_threads

class threads {
 public:
  using request = async_request;

  // A group of `size` workers living in this process.
  class world {
   public:
    // `timeout` bounds every wait for the other ranks: 1 ms to one year, or
    // diloco::no_timeout (milliseconds::max()) for none.
    explicit world(int size, std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
      if (size <= 0)
        diloco::detail::raise<config_error>("comm::threads::world needs at least 1 worker, got ", size);
      diloco::detail::check_timeout(timeout, "comm::threads::world timeout");
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
          std::unique_ptr<threads> comm(new threads(group_, r));
          try {
            fn(*comm);
          } catch (...) {
            std::lock_guard lock(group_->mutex);
            if (!group_->broken) {
              group_->broken = true;
              group_->root_cause = std::current_exception();
              try {
                throw;
              } catch (const std::exception& e) {
                group_->broken_reason =
                    diloco::detail::concat("rank ", r, " failed: ", diloco::detail::unprefixed(e.what()));
              } catch (...) {
                group_->broken_reason = diloco::detail::concat("rank ", r, " failed with a non-standard exception");
              }
            }
            group_->cv.notify_all();
          }
          // Finishes (or, on a broken group, aborts) operations still queued
          // on this rank's progress thread before the rank counts as gone.
          comm.reset();
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

  threads(const threads&) = delete;
  threads& operator=(const threads&) = delete;

  int rank() const { return rank_; }
  int size() const { return group_->size; }
  // How many workers share this host's cores: all of them.
  int workers_on_host() const { return group_->size; }
  traffic_counters traffic() const { return traffic_; }

  // ------------------------------------------------------------ blocking
  // In-place all-reduce of fp32 buffers. Deterministic: rank r sums its
  // 1/M slice of every buffer in rank order and writes the result back into
  // all of them, so the bits never depend on thread timing.
  void all_reduce(std::span<float> buf, reduce_op op) {
    account_all_reduce(buf.size());
    blocking([&] { do_all_reduce(buf, op); });
  }
  // Copies root's buffer into every rank's buffer.
  void broadcast(std::span<float> buf, int root) {
    const std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size_bytes(), root);
    blocking([&] { do_broadcast(buf.data(), buf.size_bytes(), root, problem); });
  }
  void broadcast(std::span<std::byte> buf, int root) {
    const std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size(), root);
    blocking([&] { do_broadcast(buf.data(), buf.size(), root, problem); });
  }
  // send holds M equal blocks, block k for rank k; recv receives block
  // `rank` of every rank's send, in rank order.
  void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    const std::string problem = exchange_problem("all_to_all", send, recv, send.size());
    if (problem.empty()) account_exchange(send.size() / static_cast<std::size_t>(size()));
    blocking([&] { do_all_to_all(send, recv, problem); });
  }
  // recv receives every rank's send, in rank order (M blocks).
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    const std::string problem = exchange_problem("all_gather", send, recv, send.size() * static_cast<std::size_t>(size()));
    if (problem.empty()) account_exchange(send.size());
    blocking([&] { do_all_gather(send, recv, problem); });
  }
  void barrier() {
    blocking([&] { group_->arrive_and_wait(rank_, "barrier"); });
  }

  // -------------------------------------------------------- non-blocking
  // Each returns at once; the operation runs on this rank's progress thread
  // in issue order. Buffers must stay untouched until wait() returns.
  request iall_reduce(std::span<float> buf, reduce_op op) {
    account_all_reduce(buf.size());
    return queue_.submit([this, buf, op] { do_all_reduce(buf, op); });
  }
  request ibroadcast(std::span<float> buf, int root) {
    std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size_bytes(), root);
    return queue_.submit([this, buf, root, problem = std::move(problem)] {
      do_broadcast(buf.data(), buf.size_bytes(), root, problem);
    });
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size(), root);
    return queue_.submit([this, buf, root, problem = std::move(problem)] {
      do_broadcast(buf.data(), buf.size(), root, problem);
    });
  }
  request iall_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    std::string problem = exchange_problem("all_to_all", send, recv, send.size());
    if (problem.empty()) account_exchange(send.size() / static_cast<std::size_t>(size()));
    return queue_.submit([this, send, recv, problem = std::move(problem)] { do_all_to_all(send, recv, problem); });
  }
  request iall_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    std::string problem = exchange_problem("all_gather", send, recv, send.size() * static_cast<std::size_t>(size()));
    if (problem.empty()) account_exchange(send.size());
    return queue_.submit([this, send, recv, problem = std::move(problem)] { do_all_gather(send, recv, problem); });
  }
  request ibarrier() {
    return queue_.submit([this] { group_->arrive_and_wait(rank_, "barrier"); });
  }

 private:
  threads(std::shared_ptr<detail_threads::group> g, int rank) : group_(std::move(g)), rank_(rank) {}

  // A blocking operation never overtakes pending non-blocking ones.
  template <class F>
  void blocking(F&& f) {
    queue_.run_in_order(std::forward<F>(f));
  }

  // Local argument checks. They do not throw here: the rank still enters the
  // collective with its problem, so every rank learns of it at once (this
  // rank gets a config_error, the others a comm_error naming it) instead of
  // waiting for a rank that left.
  std::string root_problem(int root) const {
    if (root >= 0 && root < size()) return {};
    return diloco::detail::concat("diloco: threads broadcast: root ", root, " is not a rank of a world of ", size());
  }

  std::string exchange_problem(const char* op, std::span<const std::byte> send, std::span<std::byte> recv,
                               std::size_t want_recv) const {
    const auto m = static_cast<std::size_t>(size());
    if (std::strcmp(op, "all_to_all") == 0 && send.size() % m != 0)
      return diloco::detail::concat("diloco: threads all_to_all: send has ", send.size(),
                                    " bytes, not a multiple of the world size ", m);
    if (recv.size() != want_recv)
      return diloco::detail::concat("diloco: threads ", op, ": recv has ", recv.size(), " bytes, expected ", want_recv,
                                    " for ", send.size(), " bytes sent by each of ", m, " ranks");
    const auto* s0 = send.data();
    const auto* r0 = recv.data();
    if (!send.empty() && !recv.empty() && s0 < r0 + recv.size() && r0 < s0 + send.size())
      return diloco::detail::concat("diloco: threads ", op, ": send and recv buffers overlap");
    return {};
  }

  // The traffic models shared by every communicator (core/comm_types.hpp).
  void account_all_reduce(std::size_t n) { traffic_.add_all_reduce(n * sizeof(float), size()); }
  void account_broadcast(std::size_t bytes, int root) { traffic_.add_broadcast(bytes, rank(), root, size()); }
  void account_exchange(std::size_t block) { traffic_.add_exchange(block, size()); }

  void do_all_reduce(std::span<float> buf, reduce_op op) {
    enter("all_reduce", nullptr, buf.data(), buf.size(), static_cast<int>(op));
    const int m = size();
    const std::size_t n = buf.size();
    const std::size_t lo = n * static_cast<std::size_t>(rank_) / static_cast<std::size_t>(m);
    const std::size_t hi = n * static_cast<std::size_t>(rank_ + 1) / static_cast<std::size_t>(m);
    std::vector<float*> ptrs(static_cast<std::size_t>(m));
    for (int k = 0; k < m; ++k)
      ptrs[static_cast<std::size_t>(k)] = static_cast<float*>(group_->slots[static_cast<std::size_t>(k)].data);
    const auto fm = static_cast<float>(m);
    // Element i is ((p0[i] + p1[i]) + ...) + p(m-1)[i], then / m for the
    // mean: rank order, whatever the thread timing. The sums are formed in
    // a local tile, which cannot alias the workers' buffers, so each line
    // below vectorizes; the result is copied into every buffer.
    constexpr std::size_t tile = 1024;
    float acc[tile];
    for (std::size_t t0 = lo; t0 < hi; t0 += tile) {
      const std::size_t len = std::min(tile, hi - t0);
      std::memcpy(acc, ptrs[0] + t0, len * sizeof(float));
      for (int k = 1; k < m; ++k) {
        const float* src = ptrs[static_cast<std::size_t>(k)] + t0;
        for (std::size_t j = 0; j < len; ++j) acc[j] += src[j];
      }
      if (op == reduce_op::mean)
        for (std::size_t j = 0; j < len; ++j) acc[j] = acc[j] / fm;
      for (int k = 0; k < m; ++k) std::memcpy(ptrs[static_cast<std::size_t>(k)] + t0, acc, len * sizeof(float));
    }
    group_->arrive_and_wait(rank_, "all_reduce");
  }

  void do_broadcast(void* data, std::size_t bytes, int root, const std::string& problem) {
    enter("broadcast", nullptr, data, bytes, root, problem);
    if (rank_ != root && bytes != 0)
      std::memcpy(data, group_->slots[static_cast<std::size_t>(root)].data, bytes);
    group_->arrive_and_wait(rank_, "broadcast");
  }

  void do_all_to_all(std::span<const std::byte> send, std::span<std::byte> recv, const std::string& problem) {
    enter("all_to_all", send.data(), recv.data(), send.size(), 0, problem);
    const std::size_t block = send.size() / static_cast<std::size_t>(size());
    for (int k = 0; k < size(); ++k) {
      const auto* src = static_cast<const std::byte*>(group_->slots[static_cast<std::size_t>(k)].send);
      if (block) std::memcpy(recv.data() + static_cast<std::size_t>(k) * block, src + static_cast<std::size_t>(rank_) * block, block);
    }
    group_->arrive_and_wait(rank_, "all_to_all");
  }

  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv, const std::string& problem) {
    enter("all_gather", send.data(), recv.data(), send.size(), 0, problem);
    const std::size_t block = send.size();
    for (int k = 0; k < size(); ++k) {
      const auto* src = static_cast<const std::byte*>(group_->slots[static_cast<std::size_t>(k)].send);
      if (block) std::memcpy(recv.data() + static_cast<std::size_t>(k) * block, src, block);
    }
    group_->arrive_and_wait(rank_, "all_gather");
  }

  // Publishes this rank's arguments, waits for the others, and checks that
  // all ranks entered the same operation with the same sizes and valid
  // arguments. Every rank judges the same published slots, so all reach the
  // same verdict; on a bad one they meet once more (so no slot is reused
  // while another rank still reads it) and all throw.
  void enter(const char* op, const void* send, void* data, std::size_t count, int arg,
             const std::string& problem = {}) {
    auto& g = *group_;
    {
      std::lock_guard lock(g.mutex);
      g.slots[static_cast<std::size_t>(rank_)] =
          detail_threads::slot{op, send, data, count, arg, problem.empty() ? nullptr : problem.c_str()};
    }
    g.arrive_and_wait(rank_, op);
    const std::string verdict = judge(op);
    if (verdict.empty()) return;
    g.arrive_and_wait(rank_, op);
    if (!problem.empty()) throw config_error(problem);
    throw comm_error(verdict);
  }

  std::string judge(const char* op) const {
    const auto& g = *group_;
    const auto& mine = g.slots[static_cast<std::size_t>(rank_)];
    for (int k = 0; k < g.size; ++k)
      if (const char* p = g.slots[static_cast<std::size_t>(k)].problem)
        return diloco::detail::concat("diloco: threads ", op, " on rank ", rank_, ": rank ", k,
                                      " passed invalid arguments (", p, ")");
    for (int k = 0; k < g.size; ++k) {
      const auto& s = g.slots[static_cast<std::size_t>(k)];
      if (std::strcmp(s.op, op) != 0)
        return diloco::detail::concat("diloco: threads ", op, " on rank ", rank_, ": rank ", k, " entered ", s.op,
                                      " instead; every rank must call the same collective in the same order");
      if (s.count != mine.count)
        return diloco::detail::concat("diloco: threads ", op, " on rank ", rank_,
                                      ": buffer sizes differ across ranks (rank ", k, " has ", s.count, ", rank ",
                                      rank_, " has ", mine.count, ")");
      if (s.arg != mine.arg)
        return diloco::detail::concat("diloco: threads ", op, " on rank ", rank_, ": ranks disagree on the ",
                                      std::strcmp(op, "broadcast") == 0 ? "root" : "reduction", " (rank ", k,
                                      " passed ", s.arg, ", rank ", rank_, " passed ", mine.arg, ")");
    }
    return {};
  }

  std::shared_ptr<detail_threads::group> group_;
  int rank_ = 0;
  traffic_counters traffic_{};
  // Last member: destroyed first, so its thread is joined while the rest of
  // the communicator is still alive.
  detail::progress_queue queue_;
};

}  // namespace diloco::comm
