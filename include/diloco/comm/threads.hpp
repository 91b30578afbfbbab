// SPDX-License-Identifier: Apache-2.0
#pragma once

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
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/timeout.hpp"
#include "diloco/comm/detail/agreement.hpp"
#include "diloco/comm/detail/async.hpp"

namespace diloco::comm {

namespace detail_threads {

// Where one rank's buffers for the collective it entered are (its call
// itself is its record in group::calls).
struct slot {
  const void* send = nullptr;
  void* data = nullptr;           // the buffer written (in place for all_reduce/broadcast)
  const char* problem = nullptr;  // what is wrong with this rank's arguments, if anything
};

// State shared by the ranks of one world.
struct group {
  explicit group(int n, std::chrono::milliseconds t)
      : size(n), timeout(t), slots(n), calls(n), arrived(n), departed(n) {}

  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  int arrived_count = 0;
  std::vector<slot> slots;
  std::vector<comm::detail::call_record> calls;  // what each rank entered, for the agreement check
  std::vector<char> arrived;   // who reached the current barrier
  std::vector<char> departed;  // whose worker function has returned
  bool broken = false;
  std::string broken_reason;
  std::exception_ptr root_cause;

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

  // split(): each rank's (color, key), and what the last to arrive decided
  // for each rank: its new group and its rank there.
  std::vector<std::pair<int, int>> split_args;
  std::vector<std::pair<std::shared_ptr<group>, int>> split_result;
  // The groups split from this one, each with its member ranks here (index:
  // rank in the child): a rank that fails or returns here does so there too.
  struct child_link {
    std::weak_ptr<group> g;
    std::vector<int> members;
  };
  std::vector<child_link> children;

  // Marks rank `r`'s failure (`reason`) and departure in every group split
  // from this one, transitively, so that their ranks stop waiting for it.
  // Called without this group's mutex held.
  void propagate_to_children(int r, const std::string* reason) {
    std::vector<child_link> links;
    {
      std::lock_guard lock(mutex);
      links = children;
    }
    for (const auto& link : links) {
      const auto c = link.g.lock();
      if (!c) continue;
      const auto it = std::find(link.members.begin(), link.members.end(), r);
      if (it == link.members.end()) continue;
      const int cr = static_cast<int>(it - link.members.begin());
      {
        std::lock_guard lock(c->mutex);
        if (reason && !c->broken) {
          c->broken = true;
          c->broken_reason = *reason;
        }
        if (!reason) c->departed[static_cast<std::size_t>(cr)] = 1;
        c->cv.notify_all();
      }
      c->propagate_to_children(cr, reason);
    }
  }

  // What the last member to arrive at a membership check decided (elastic
  // worlds): the next group, and each old rank's rank in it (-1: left).
  std::shared_ptr<group> next;
  std::vector<int> next_rank;
  std::string check_problem;  // the members did not all enter the check

  // Blocks until every rank has arrived, one has failed or left, or the
  // timeout passes. `what` names the operation for messages. The last rank
  // to arrive runs `on_last` (with the mutex held) before releasing them.
  template <class OnLast>
  void arrive_and_wait(int rank, const char* what, OnLast&& on_last) {
    std::unique_lock lock(mutex);
    if (broken) throw comm_error(diloco::detail::concat("diloco: threads ", what, " on rank ", rank,
                                                        ": the group is broken: ", broken_reason));
    const std::uint64_t gen = generation;
    arrived[static_cast<std::size_t>(rank)] = 1;
    if (++arrived_count == size) {
      on_last();
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
  void arrive_and_wait(int rank, const char* what) {
    arrive_and_wait(rank, what, [] {});
  }
};

class member;

// The membership of an elastic world: the group its members use now, and
// the workers waiting to join it (world::spawn).
struct roster {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  std::vector<member*> waiting;  // joiners, in the order they asked
  int running = 0;               // members whose worker function has not returned
  std::string refused;           // why waiting joiners cannot be admitted any more
};

// A joiner's admission, filled in by the membership check that admits it.
struct admission {
  std::shared_ptr<group> g;
  int rank = -1;
};

class member {
 public:
  admission granted;
  bool admitted = false;
};

}  // namespace detail_threads

/// In-process communicator: M workers as M threads of one process, exchanging
/// through shared memory. It is the embedded default and what the tests and
/// the demo use to simulate a group of machines on one.
class threads {
 public:
  using request = async_request;  ///< what the non-blocking operations return
  /// Whether a world's group may change while it trains.
  enum class membership { fixed, elastic };

  /// A group of `size` workers living in this process.
  class world {
   public:
    /// `timeout` bounds every wait for the other ranks: 1 ms to one year, or
    /// diloco::no_timeout (milliseconds::max()) for none.
    /// `membership`: membership::elastic lets the group change while run()
    /// trains: a worker may leave (algorithm::leave()) and spawn() adds one,
    /// admitted at the next round end. Each change re-forms the group (the
    /// communicators' ranks and size change; the algorithm re-plans).
    explicit world(int size, std::chrono::milliseconds timeout = std::chrono::minutes(5),
                   membership kind = membership::fixed)
        : size_(size), timeout_(timeout), elastic_(kind == membership::elastic) {
      if (size <= 0)
        diloco::detail::raise<config_error>("comm::threads::world needs at least 1 worker, got ", size);
      diloco::detail::check_timeout(timeout, "comm::threads::world timeout");
      group_ = std::make_shared<detail_threads::group>(size, timeout);
    }

    /// The workers run() starts.
    int size() const { return size_; }
    /// True for a world made with membership::elastic.
    bool elastic() const { return elastic_; }
    /// Elastic worlds: spawned workers waiting for a round end to admit them.
    int waiting_joiners() const {
      const auto r = roster_;
      if (!r) return 0;
      std::lock_guard lock(r->mutex);
      return static_cast<int>(r->waiting.size());
    }

    /// Runs fn(comm) on `size` threads, one per rank, and waits for all of
    /// them. If a worker throws, the others are released from any collective
    /// with a comm_error and the first failure (the cause, not its echoes) is
    /// rethrown here once every thread has finished.
    template <class F>
    void run(F&& fn) {
      group_ = std::make_shared<detail_threads::group>(size_, timeout_);
      first_error_ = nullptr;
      if (elastic_) {
        roster_ = std::make_shared<detail_threads::roster>();
        roster_->running = size_;
      }
      std::vector<std::thread> workers;
      workers.reserve(static_cast<std::size_t>(size()));
      for (int r = 0; r < size(); ++r)
        workers.emplace_back([this, r, f = std::function<void(threads&)>(std::ref(fn))] {
          work(std::unique_ptr<threads>(new threads(group_, r, roster_, timeout_)), f);
        });
      for (auto& t : workers) t.join();
      // Workers spawned meanwhile (they may spawn more).
      for (;;) {
        std::thread t;
        {
          std::lock_guard lock(spawn_mutex_);
          if (spawned_.empty()) break;
          t = std::move(spawned_.back());
          spawned_.pop_back();
        }
        t.join();
      }
      roster_.reset();
      if (first_error_) std::rethrow_exception(first_error_);
      // A group broken by a timeout whose workers caught the echoes.
      if (group_->root_cause) std::rethrow_exception(group_->root_cause);
    }

    /// Elastic worlds, while run() is training: starts fn(comm) on a new
    /// thread whose communicator is joining; an algorithm constructed over
    /// it waits until the members reach a round end, which admits it (it
    /// takes the group's state from a live member). run() waits for it too.
    template <class F>
    void spawn(F&& fn) {
      if (!elastic_)
        diloco::detail::raise<config_error>("comm::threads::world::spawn needs an elastic world "
                                            "(world(size, timeout, membership::elastic))");
      if (!roster_) diloco::detail::raise<state_error>("comm::threads::world::spawn: the world is not running");
      {
        std::lock_guard lock(roster_->mutex);
        if (!roster_->refused.empty()) diloco::detail::raise<state_error>("comm::threads::world::spawn: ", roster_->refused);
        ++roster_->running;
      }
      std::lock_guard lock(spawn_mutex_);
      spawned_.emplace_back([this, f = std::function<void(threads&)>(std::forward<F>(fn)), r = roster_] {
        work(std::unique_ptr<threads>(new threads(nullptr, -1, r, timeout_)), f);
      });
    }

   private:
    /// One worker's life: fn, then the bookkeeping of its departure.
    void work(std::unique_ptr<threads> comm, const std::function<void(threads&)>& fn) {
      try {
        fn(*comm);
      } catch (...) {
        const auto g = comm->group_;
        const int r = comm->rank_;
        std::string reason;
        try {
          throw;
        } catch (const std::exception& e) {
          reason = r >= 0 ? diloco::detail::concat("rank ", r, " failed: ", diloco::detail::unprefixed(e.what()))
                          : diloco::detail::concat("a joining worker failed: ", diloco::detail::unprefixed(e.what()));
        } catch (...) {
          reason = diloco::detail::concat("rank ", r, " failed with a non-standard exception");
        }
        // The cause, not its echoes: a group keeps what broke it first.
        std::exception_ptr cause = std::current_exception();
        if (g) {
          std::lock_guard lock(g->mutex);
          if (!g->broken) {
            g->broken = true;
            g->root_cause = cause;
            g->broken_reason = reason;
          }
          if (g->root_cause) cause = g->root_cause;
          g->cv.notify_all();
        }
        if (g) g->propagate_to_children(r, &reason);
        std::lock_guard lock(error_mutex_);
        if (!first_error_) first_error_ = cause;
      }
      // Finishes (or, on a broken group, aborts) operations still queued
      // on this rank's progress thread before the rank counts as gone.
      const auto g = comm->group_;
      const int r = comm->rank_;
      const auto roster = comm->roster_;
      const bool counted = !comm->left_running_;
      comm.reset();
      if (g) {
        {
          std::lock_guard lock(g->mutex);
          g->departed[static_cast<std::size_t>(r)] = 1;
          g->cv.notify_all();
        }
        g->propagate_to_children(r, nullptr);
      }
      if (roster && counted) {
        std::lock_guard lock(roster->mutex);
        if (--roster->running == static_cast<int>(roster->waiting.size()) && !roster->waiting.empty()) {
          roster->refused = "every member's worker function returned before a round end could admit it";
          roster->cv.notify_all();
        }
      }
    }

    int size_;
    std::chrono::milliseconds timeout_;
    bool elastic_;
    std::shared_ptr<detail_threads::group> group_;
    std::shared_ptr<detail_threads::roster> roster_;
    std::mutex spawn_mutex_, error_mutex_;
    std::vector<std::thread> spawned_;
    std::exception_ptr first_error_;
  };

  threads(const threads&) = delete;
  threads& operator=(const threads&) = delete;

  ///@{
  /// This worker's rank and the group's size (0 while a spawned worker waits to join).
  int rank() const { return rank_; }
  int size() const { return group_ ? group_->size : 0; }
  ///@}
  /// How many workers share this host's cores: all of them.
  int workers_on_host() const { return std::max(1, size()); }

  // ------------------------------------------------ elastic membership
  ///@{
  /// elastic_communicator: whether this worker's world is elastic (membership::elastic), and
  /// its group's generation (0 at the start, one more at each re-forming).
  bool elastic() const { return roster_ != nullptr; }
  std::uint64_t generation() const { return generation_; }
  ///@}
  /// A spawned worker not admitted yet.
  bool joining() const { return roster_ && !group_; }
  /// Waits (within the world's timeout) until a round end admits this worker.
  void join() {
    if (!joining()) diloco::detail::raise<state_error>("comm::threads::join: this worker is already a member");
    detail_threads::member me;
    std::unique_lock lock(roster_->mutex);
    if (!roster_->refused.empty())
      diloco::detail::raise<comm_error>("comm::threads join: ", roster_->refused);
    roster_->waiting.push_back(&me);
    const auto deadline = diloco::detail::deadline_after(timeout_);
    auto done = [&] { return me.admitted || !roster_->refused.empty(); };
    if (deadline == std::chrono::steady_clock::time_point::max())
      roster_->cv.wait(lock, done);
    else
      roster_->cv.wait_until(lock, deadline, done);
    if (!me.admitted) {
      std::erase(roster_->waiting, &me);
      if (!roster_->refused.empty()) diloco::detail::raise<comm_error>("comm::threads join: ", roster_->refused);
      diloco::detail::raise<comm_error>("comm::threads join: no round end admitted this worker within ",
                                        diloco::detail::describe_timeout(timeout_));
    }
    group_ = me.granted.g;
    rank_ = me.granted.rank;
    generation_ = roster_->generation;
  }

  /// Collective over the members: `leave` announces that this worker
  /// leaves; at a round end the workers waiting to join are admitted. The
  /// last member to arrive forms the next group (members in rank order,
  /// then joiners); true when it differs from this one.
  bool at_boundary(bool leave, boundary_kind kind) {
    if (!roster_) diloco::detail::raise<config_error>("comm::threads: membership checks need an elastic world");
    bool changed = false;
    blocking([&] { changed = do_boundary(leave, kind); });
    return changed;
  }

  /// Collective: splits the group by `color`, as MPI_Comm_split does. The
  /// ranks that pass the same color form one new group, ranked by `key`
  /// (ties by rank here); each gets its own communicator over it, with this
  /// one's timeout. A rank that fails or whose worker function returns in
  /// this group fails or leaves the split groups too. Fixed worlds only (an
  /// elastic group re-forms, a split one would not follow: config_error).
  /// The mesh (comm/mesh.hpp) builds its intra- and inter-group
  /// communicators with it.
  std::unique_ptr<threads> split(int color, int key) {
    require_member("split");
    if (roster_)
      diloco::detail::raise<config_error>("comm::threads::split: the world is elastic (membership::elastic); "
                                          "split groups need a fixed world");
    std::unique_ptr<threads> out;
    blocking([&] {
      auto g = group_;
      {
        std::lock_guard lock(g->mutex);
        if (g->split_args.size() != static_cast<std::size_t>(g->size)) {
          g->split_args.assign(static_cast<std::size_t>(g->size), {0, 0});
          g->split_result.assign(static_cast<std::size_t>(g->size), {nullptr, -1});
        }
        g->split_args[static_cast<std::size_t>(rank_)] = {color, key};
        g->calls[static_cast<std::size_t>(rank_)] =
            detail::record_of(detail::collective::barrier, 0, 0);
      }
      g->arrive_and_wait(rank_, "split", [&] {
        // The last to arrive forms the groups, under the group's lock.
        std::vector<int> order(static_cast<std::size_t>(g->size));
        for (int k = 0; k < g->size; ++k) order[static_cast<std::size_t>(k)] = k;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
          const auto& x = g->split_args[static_cast<std::size_t>(a)];
          const auto& y = g->split_args[static_cast<std::size_t>(b)];
          return x.first != y.first ? x.first < y.first : x.second < y.second;
        });
        for (std::size_t i = 0; i < order.size();) {
          std::size_t j = i;
          const int c = g->split_args[static_cast<std::size_t>(order[i])].first;
          while (j < order.size() && g->split_args[static_cast<std::size_t>(order[j])].first == c) ++j;
          auto child = std::make_shared<detail_threads::group>(static_cast<int>(j - i), g->timeout);
          detail_threads::group::child_link link{child, {}};
          for (std::size_t k = i; k < j; ++k) {
            g->split_result[static_cast<std::size_t>(order[k])] = {child, static_cast<int>(k - i)};
            link.members.push_back(order[k]);
          }
          g->children.push_back(std::move(link));
          i = j;
        }
      });
      std::lock_guard lock(g->mutex);
      auto& mine = g->split_result[static_cast<std::size_t>(rank_)];
      out.reset(new threads(std::move(mine.first), mine.second, nullptr, timeout_));
      mine.second = -1;
    });
    return out;
  }

  /// Threads have no recovery from a failed worker: its error ends run().
  void recover() {
    std::string why = "the group is broken";
    if (group_) {
      std::lock_guard lock(group_->mutex);
      if (!group_->broken_reason.empty()) why = group_->broken_reason;
    }
    diloco::detail::raise<comm_error>("comm::threads cannot re-form a group after a failure (", why,
                                      "); a worker that throws ends world::run");
  }
  /// The bytes this rank has sent and received, as core/comm_types.hpp models them.
  traffic_counters traffic() const { return traffic_.get(); }

  // ------------------------------------------------------------ blocking
  /// In-place all-reduce of fp32 buffers. Deterministic: rank r sums its
  /// 1/M slice of every buffer in rank order and writes the result back into
  /// all of them, so the bits never depend on thread timing.
  void all_reduce(std::span<float> buf, reduce_op op) {
    require_member("all_reduce");
    const std::string problem = detail::reduce_problem(site(), op);
    if (problem.empty()) account_all_reduce(buf.size());
    blocking([&] { do_all_reduce(buf, op, problem); });
  }
  ///@{
  /// Copies root's buffer into every rank's buffer.
  void broadcast(std::span<float> buf, int root) {
    require_member("broadcast");
    const std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size_bytes(), root);
    blocking([&] { do_broadcast(buf.data(), buf.size_bytes(), root, problem); });
  }
  void broadcast(std::span<std::byte> buf, int root) {
    require_member("broadcast");
    const std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size(), root);
    blocking([&] { do_broadcast(buf.data(), buf.size(), root, problem); });
  }
  ///@}
  /// send holds M equal blocks, block k for rank k; recv receives block
  /// `rank` of every rank's send, in rank order.
  void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    require_member("all_to_all");
    const std::string problem = exchange_problem(detail::collective::all_to_all, send, recv);
    if (problem.empty()) account_exchange(send.size() / static_cast<std::size_t>(size()));
    blocking([&] { do_all_to_all(send, recv, problem); });
  }
  /// recv receives every rank's send, in rank order (M blocks).
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    require_member("all_gather");
    const std::string problem = exchange_problem(detail::collective::all_gather, send, recv);
    if (problem.empty()) account_exchange(send.size());
    blocking([&] { do_all_gather(send, recv, problem); });
  }
  /// Returns once every member has entered it.
  void barrier() {
    require_member("barrier");
    blocking([&] { group_->arrive_and_wait(rank_, "barrier"); });
  }

  // -------------------------------------------------------- non-blocking
  ///@{
  /// Each returns at once; the operation runs on this rank's progress thread
  /// in issue order. Buffers must stay untouched until wait() returns.
  request iall_reduce(std::span<float> buf, reduce_op op) {
    require_member("iall_reduce");
    std::string problem = detail::reduce_problem(site(), op);
    if (problem.empty()) account_all_reduce(buf.size());
    return queue_.submit([this, buf, op, problem = std::move(problem)] { do_all_reduce(buf, op, problem); });
  }
  request ibroadcast(std::span<float> buf, int root) {
    require_member("ibroadcast");
    std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size_bytes(), root);
    return queue_.submit([this, buf, root, problem = std::move(problem)] {
      do_broadcast(buf.data(), buf.size_bytes(), root, problem);
    });
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    require_member("ibroadcast");
    std::string problem = root_problem(root);
    if (problem.empty()) account_broadcast(buf.size(), root);
    return queue_.submit([this, buf, root, problem = std::move(problem)] {
      do_broadcast(buf.data(), buf.size(), root, problem);
    });
  }
  request iall_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    require_member("iall_to_all");
    std::string problem = exchange_problem(detail::collective::all_to_all, send, recv);
    if (problem.empty()) account_exchange(send.size() / static_cast<std::size_t>(size()));
    return queue_.submit([this, send, recv, problem = std::move(problem)] { do_all_to_all(send, recv, problem); });
  }
  request iall_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    require_member("iall_gather");
    std::string problem = exchange_problem(detail::collective::all_gather, send, recv);
    if (problem.empty()) account_exchange(send.size());
    return queue_.submit([this, send, recv, problem = std::move(problem)] { do_all_gather(send, recv, problem); });
  }
  request ibarrier() {
    require_member("ibarrier");
    return queue_.submit([this] { group_->arrive_and_wait(rank_, "barrier"); });
  }
  ///@}

  /// Runs `task` on this rank's progress thread, after every non-blocking
  /// operation issued before it; its exception becomes the request's error.
  /// Inside the task this communicator's blocking operations run at once, on
  /// that thread (reduce::staged chains a compressed exchange's collectives
  /// and the work between them this way, so the exchange advances while the
  /// caller trains).
  request submit(std::function<void()> task) {
    require_member("submit");
    return queue_.submit(std::move(task));
  }

 private:
  threads(std::shared_ptr<detail_threads::group> g, int rank, std::shared_ptr<detail_threads::roster> r,
          std::chrono::milliseconds timeout)
      : group_(std::move(g)), rank_(rank), roster_(std::move(r)), timeout_(timeout) {}

  /// Collectives need a member: not a joiner before join(), not a leaver.
  void require_member(const char* op) const {
    if (!group_)
      diloco::detail::raise<state_error>("comm::threads ", op, ": this worker is not a member of the group (",
                                         roster_ && rank_ < 0 && !left_running_ ? "it has not joined yet"
                                                                                : "it left the group",
                                         ")");
  }

  bool do_boundary(bool leave, boundary_kind kind) {
    if (!group_) diloco::detail::raise<state_error>("comm::threads: this worker is not a member of the group");
    auto g = group_;
    {
      std::lock_guard lock(g->mutex);
      g->calls[static_cast<std::size_t>(rank_)] =
          detail::record_of(detail::collective::membership_check, 0, leave ? 1 : 0);
    }
    g->arrive_and_wait(rank_, "membership_check", [&] {
      // The last to arrive decides for all, under the group's lock.
      g->next.reset();
      g->next_rank.assign(static_cast<std::size_t>(g->size), -1);
      g->check_problem.clear();
      for (int k = 0; k < g->size; ++k)
        if (const auto op = static_cast<detail::collective>(g->calls[static_cast<std::size_t>(k)].op);
            op != detail::collective::membership_check)
          g->check_problem = diloco::detail::concat("rank ", k, " entered ", detail::name(op),
                                                    " instead of the membership check");
      if (!g->check_problem.empty()) return;
      int next_size = 0;
      for (int k = 0; k < g->size; ++k)
        if (!g->calls[static_cast<std::size_t>(k)].arg) g->next_rank[static_cast<std::size_t>(k)] = next_size++;
      std::vector<detail_threads::member*> admitted;
      {
        std::lock_guard roster_lock(roster_->mutex);
        if (kind == boundary_kind::round_end && next_size > 0) admitted.swap(roster_->waiting);
        if (next_size == g->size && admitted.empty()) return;
        auto next = std::make_shared<detail_threads::group>(next_size + static_cast<int>(admitted.size()), g->timeout);
        for (std::size_t j = 0; j < admitted.size(); ++j) {
          admitted[j]->granted = {next, next_size + static_cast<int>(j)};
          admitted[j]->admitted = true;
        }
        ++roster_->generation;
        roster_->running -= g->size - next_size;  // leavers no longer count as running members
        g->next = std::move(next);
        roster_->cv.notify_all();
      }
    });
    if (!g->check_problem.empty())
      throw comm_error(diloco::detail::concat("diloco: threads membership check on rank ", rank_, ": ",
                                              g->check_problem));
    if (!g->next) return false;
    const int mine = g->next_rank[static_cast<std::size_t>(rank_)];
    {
      std::lock_guard lock(roster_->mutex);
      generation_ = roster_->generation;
    }
    if (mine < 0) {
      group_.reset();
      rank_ = -1;
      left_running_ = true;
    } else {
      group_ = g->next;
      rank_ = mine;
    }
    return true;
  }

  /// A blocking operation never overtakes pending non-blocking ones.
  template <class F>
  void blocking(F&& f) {
    queue_.run_in_order(std::forward<F>(f));
  }

  /// Local argument checks (comm/detail/arguments.hpp). They do not throw
  /// here: the rank still enters the collective with its problem, so every
  /// rank learns of it at once (this rank gets a config_error, the others a
  /// comm_error naming it) instead of waiting for a rank that left.
  detail::call_site site() const { return {"threads", "world", rank_}; }

  std::string root_problem(int root) const {
    return detail::root_problem(site(), detail::collective::broadcast, root, size());
  }

  std::string exchange_problem(detail::collective c, std::span<const std::byte> send,
                               std::span<std::byte> recv) const {
    return detail::exchange_problem(site(), c, send.data(), send.size(), recv.data(), recv.size(), size());
  }

  /// The traffic models shared by every communicator (core/comm_types.hpp).
  void account_all_reduce(std::size_t n) { traffic_.add_all_reduce(n * sizeof(float), size()); }
  void account_broadcast(std::size_t bytes, int root) { traffic_.add_broadcast(bytes, rank(), root, size()); }
  void account_exchange(std::size_t block) { traffic_.add_exchange(block, size()); }

  void do_all_reduce(std::span<float> buf, reduce_op op, const std::string& problem) {
    enter(detail::collective::all_reduce, nullptr, buf.data(), buf.size(), static_cast<int>(op), problem);
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
    enter(detail::collective::broadcast, nullptr, data, bytes, root, problem);
    if (rank_ != root && bytes != 0)
      std::memcpy(data, group_->slots[static_cast<std::size_t>(root)].data, bytes);
    group_->arrive_and_wait(rank_, "broadcast");
  }

  void do_all_to_all(std::span<const std::byte> send, std::span<std::byte> recv, const std::string& problem) {
    enter(detail::collective::all_to_all, send.data(), recv.data(), send.size(), 0, problem);
    const std::size_t block = send.size() / static_cast<std::size_t>(size());
    for (int k = 0; k < size(); ++k) {
      const auto* src = static_cast<const std::byte*>(group_->slots[static_cast<std::size_t>(k)].send);
      if (block) std::memcpy(recv.data() + static_cast<std::size_t>(k) * block, src + static_cast<std::size_t>(rank_) * block, block);
    }
    group_->arrive_and_wait(rank_, "all_to_all");
  }

  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv, const std::string& problem) {
    enter(detail::collective::all_gather, send.data(), recv.data(), send.size(), 0, problem);
    const std::size_t block = send.size();
    for (int k = 0; k < size(); ++k) {
      const auto* src = static_cast<const std::byte*>(group_->slots[static_cast<std::size_t>(k)].send);
      if (block) std::memcpy(recv.data() + static_cast<std::size_t>(k) * block, src, block);
    }
    group_->arrive_and_wait(rank_, "all_gather");
  }

  /// Publishes this rank's call and buffers, waits for the others, and runs
  /// the shared agreement check (comm/detail/agreement.hpp) on the published
  /// records. On a bad verdict the ranks meet once more (so no record is
  /// overwritten while another rank still reads it) and all throw.
  void enter(detail::collective op, const void* send, void* data, std::size_t count, int arg,
             const std::string& problem) {
    auto& g = *group_;
    const char* what = detail::name(op);
    detail::agree(
        site(), detail::record_of(op, count, arg), problem,
        [&](const detail::call_record& mine) {
          {
            std::lock_guard lock(g.mutex);
            g.slots[static_cast<std::size_t>(rank_)] =
                detail_threads::slot{send, data, problem.empty() ? nullptr : problem.c_str()};
            g.calls[static_cast<std::size_t>(rank_)] = mine;
          }
          g.arrive_and_wait(rank_, what);
          return std::span<const detail::call_record>(g.calls);
        },
        [&] { g.arrive_and_wait(rank_, what); },
        [&](int k) {
          const char* p = g.slots[static_cast<std::size_t>(k)].problem;
          return std::string_view(p ? p : "");
        });
  }

  std::shared_ptr<detail_threads::group> group_;
  int rank_ = 0;
  std::shared_ptr<detail_threads::roster> roster_;  ///< elastic worlds only
  std::chrono::milliseconds timeout_ = std::chrono::minutes(5);
  std::uint64_t generation_ = 0;
  bool left_running_ = false;  ///< left the group: no longer counted as a running member
  detail::shared_traffic traffic_;
  /// Last member: destroyed first, so its thread is joined while the rest of
  /// the communicator is still alive.
  detail::progress_queue queue_;
};

}  // namespace diloco::comm
