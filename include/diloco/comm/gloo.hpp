// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/core/require_cxx20.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>

#include "diloco/comm/detail/agreement.hpp"
#include "diloco/comm/detail/async.hpp"
#include "diloco/comm/gloo/options.hpp"
#include "diloco/comm/gloo/rendezvous.hpp"
#include "diloco/comm/gloo/sigpipe.hpp"
#include "diloco/comm/gloo/store.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/fault.hpp"

namespace diloco::comm {

/// Communicator over Gloo's TCP transport: one rank per process, on one
/// machine or many. Ranks find each other through a rendezvous store (a
/// shared directory or a Redis server), every wait is bounded by a timeout,
/// and a peer that vanishes or stops answering surfaces as comm_error on
/// every surviving rank. Link diloco::gloo to use it.
///
/// ```
/// diloco::comm::gloo comm({.rank = r, .size = n,
///                          .rendezvous = diloco::comm::gloo::file_store{"/shared/rdv"}});
/// auto comm = diloco::comm::gloo::from_env();   // DILOCO_RANK, ... (scripts/launch_gloo.sh)
/// ```
class gloo {
 public:
  using request = async_request;  ///< what the non-blocking operations return
  /// Rank, size, rendezvous store, run id, timeouts, elastic membership (comm/gloo/options.hpp).
  using options = detail_gloo::options;
  using file_store = detail_gloo::file_store;    ///< a rendezvous store in a directory every rank can reach
  using redis_store = detail_gloo::redis_store;  ///< a rendezvous store on a Redis server

  /// Joins the world: collective over all `size` processes, which must be
  /// started with the same store, run id and size. Throws config_error for
  /// bad options and comm_error, within options.timeout of the call, when
  /// a rank does not come or does not connect (naming it).
  explicit gloo(options opts) : opts_(std::move(opts)) {
    detail_gloo::validate(opts_);
    queue_.set_batch_scheduling(opts_.batch_scheduling);
    detail_gloo::sigpipe_guard guard;
    if (!opts_.elastic) {
      conn_ = detail_gloo::rendezvous(opts_);
      return;
    }
    const std::string where = diloco::detail::concat("comm::gloo (elastic) on rank ", opts_.rank, " of ", opts_.size,
                                                     " (run id '", opts_.run_id, "')");
    meta_ = std::make_unique<detail_gloo::rendezvous_store>(opts_, "elastic", where);
    // A rank that started before in this run is a restarted worker: it
    // joins the running group instead of forming the first generation.
    const std::string stamp = std::to_string(static_cast<long long>(getpid()));
    if (!meta_->create(diloco::detail::concat("launch/", opts_.rank), {stamp.begin(), stamp.end()})) {
      joining_ = true;
      return;
    }
    id_ = diloco::detail::concat("r", opts_.rank);
    for (int k = 0; k < opts_.size; ++k) members_.push_back(diloco::detail::concat("r", k));
    meta_->create("g0/members", encode_members(members_, 0));
    diloco::detail::fault_point("startup");
    try {
      conn_ = detail_gloo::rendezvous(opts_, "elastic/g0");
    } catch (const comm_error&) {
      recover();  // a rank died or never came: the others form generation 1
    }
  }

  /// Options from DILOCO_RANK, DILOCO_WORLD_SIZE, DILOCO_STORE and the
  /// optional DILOCO_RUN_ID, DILOCO_HOSTNAME, DILOCO_IFACE, DILOCO_TIMEOUT_MS.
  static options options_from_env() { return detail_gloo::options_from_env(); }
  /// Joins the world described by options_from_env() (scripts/launch_gloo.sh sets it).
  static gloo from_env() { return gloo(options_from_env()); }

  gloo(const gloo&) = delete;
  gloo& operator=(const gloo&) = delete;

  /// An elastic member that ends normally says so in the store
  /// (`g<G>/closed/<id>`): a joiner still waiting learns that the group it
  /// would join has finished instead of waiting out join_timeout.
  ~gloo() {
    if (!meta_ || joining_ || left_ || !closed_reason().empty()) return;
    try {
      meta_->create(closed_key(generation_, id_), {'1'});
    } catch (...) {
      // Best effort: a joiner then waits for its join_timeout.
    }
  }

  ///@{
  /// This process's rank and the world's size (an elastic group's current ones).
  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  ///@}

  // ------------------------------------------------ elastic membership
  ///@{
  /// elastic_communicator: whether the group may change (options.elastic), its
  /// generation, and whether this worker still waits to join. The group's
  /// generations live in the store under `diloco/<run id>/elastic/`:
  /// `g<G>/members` (the ids of generation G in rank order, set once),
  /// `g<G>/alive/<id>` (survivors of G-1 registering), `join/<n>` (joiner
  /// slots), `launch/<rank>` (first-generation ranks that started), and each
  /// generation's own rendezvous.
  bool elastic() const { return opts_.elastic; }
  std::uint64_t generation() const { return generation_; }
  bool joining() const { return joining_; }
  ///@}
  /// This worker's id in the group ("r<first rank>" or "j<join slot>").
  const std::string& member_id() const { return id_; }

  /// A joiner takes a slot, then waits (options.join_timeout) for a
  /// generation that lists it and connects to it.
  void join() {
    if (!joining_) diloco::detail::raise<state_error>("comm::gloo::join: this worker is already a member");
    detail_gloo::sigpipe_guard guard;
    std::uint64_t slot = 0;
    for (;; ++slot) {
      const std::string id = diloco::detail::concat("j", slot);
      if (meta_->create(diloco::detail::concat("join/", slot), {id.begin(), id.end()})) {
        id_ = id;
        break;
      }
    }
    const auto deadline = diloco::detail::deadline_after(opts_.join_timeout);
    std::uint64_t g = 0;
    for (;;) {
      while (meta_->has({diloco::detail::concat("g", g + 1, "/members")})) ++g;
      if (meta_->has({diloco::detail::concat("g", g, "/members")})) {
        auto [list, next] = decode_members(meta_->store().get(diloco::detail::concat("g", g, "/members")));
        if (std::find(list.begin(), list.end(), id_) != list.end()) {
          joining_ = false;
          adopt(g, std::move(list), next);
          try {
            conn_ = detail_gloo::rendezvous(opts_, diloco::detail::concat("elastic/g", g));
          } catch (const comm_error&) {
            recover();
          }
          return;
        }
        if (next > slot)
          diloco::detail::raise<comm_error>("comm::gloo join: generation ", g,
                                            " of the group was formed after this worker's slot without it");
        bool finished = !list.empty();
        for (const auto& id : list)
          finished = finished && meta_->has({closed_key(g, id)});
        if (finished)
          diloco::detail::raise<comm_error>("comm::gloo join as ", id_, ": the group (generation ", g,
                                            ") finished before a round end admitted this worker");
      }
      if (std::chrono::steady_clock::now() >= deadline)
        diloco::detail::raise<comm_error>("comm::gloo join as ", id_, ": no round end admitted this worker within ",
                                          diloco::detail::describe_timeout(opts_.join_timeout),
                                          " (is the group running, with admit_joiners on?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  /// Collective over the members where nothing is in flight. Rank 0 counts
  /// the joiners waiting (at a round end, when they are admitted); if anyone
  /// leaves or joins, the next generation is written to the store and the
  /// members (not the leavers) connect to it.
  bool at_boundary(bool leave, boundary_kind kind) {
    if (!opts_.elastic) diloco::detail::raise<config_error>("comm::gloo: membership checks need options.elastic");
    bool changed = false;
    blocking([&] { changed = do_boundary(leave, kind); });
    return changed;
  }

  /// After a failure: the survivors of this generation form the next one.
  void recover() {
    if (!opts_.elastic)
      diloco::detail::raise<comm_error>("comm::gloo: the communicator failed and is not elastic (",
                                        closed_reason(), ")");
    if (left_) diloco::detail::raise<state_error>("comm::gloo: this worker has left the group");
    blocking([&] { do_recover(); });
  }
  /// How many ranks share this host's cores (options.local_world_size).
  int workers_on_host() const { return opts_.local_world_size > 0 ? opts_.local_world_size : 1; }
  /// The bytes this rank has sent and received, as core/comm_types.hpp models them.
  traffic_counters traffic() const { return traffic_.get(); }
  /// The options it was constructed with.
  const options& settings() const { return opts_; }

  // ------------------------------------------------------------ blocking
  /// In-place fp32 all-reduce with Gloo's ring algorithm. Every rank ends
  /// with the same bits, and the same world size and inputs give the same
  /// bits on every run; the summation order is the ring's, not rank order.
  void all_reduce(std::span<float> buf, reduce_op op) {
    validated(op_code::all_reduce, buf.size(), static_cast<int>(op), detail::reduce_problem(site(), op));
    account_all_reduce(buf.size());
    blocking([&] { do_all_reduce(buf, op); });
  }
  ///@{
  /// Copies root's buffer into every rank's buffer.
  void broadcast(std::span<float> buf, int root) {
    std::span<std::byte> bytes(reinterpret_cast<std::byte*>(buf.data()), buf.size_bytes());
    validated(op_code::broadcast, bytes.size(), root, check_root(root));
    account_broadcast(bytes.size(), root);
    blocking([&] { do_broadcast(bytes, root); });
  }
  void broadcast(std::span<std::byte> buf, int root) {
    validated(op_code::broadcast, buf.size(), root, check_root(root));
    account_broadcast(buf.size(), root);
    blocking([&] { do_broadcast(buf, root); });
  }
  ///@}
  /// send holds M equal blocks, block k for rank k; recv receives block
  /// `rank` of every rank's send, in rank order.
  void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(op_code::all_to_all, send.size(), 0,
              check_exchange(op_code::all_to_all, send, recv));
    account_exchange(send.size() / static_cast<std::size_t>(size()));
    blocking([&] { do_all_to_all(send, recv); });
  }
  /// recv receives every rank's send, in rank order (M blocks).
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(op_code::all_gather, send.size(), 0,
              check_exchange(op_code::all_gather, send, recv));
    account_exchange(send.size());
    blocking([&] { do_all_gather(send, recv); });
  }
  /// Returns once every rank has entered it.
  void barrier() {
    blocking([&] { do_barrier(); });
  }

  // -------------------------------------------------------- non-blocking
  ///@{
  /// Each returns at once; the operation runs on this communicator's
  /// progress thread, in issue order. Buffers must stay untouched until
  /// wait() returns. Arguments this rank rejects throw config_error at the
  /// call, after the other ranks have been told (so it may wait for them).
  request iall_reduce(std::span<float> buf, reduce_op op) {
    validated(op_code::all_reduce, buf.size(), static_cast<int>(op), detail::reduce_problem(site(), op));
    account_all_reduce(buf.size());
    return queue_.submit([this, buf, op] { do_all_reduce(buf, op); });
  }
  request ibroadcast(std::span<float> buf, int root) {
    std::span<std::byte> bytes(reinterpret_cast<std::byte*>(buf.data()), buf.size_bytes());
    validated(op_code::broadcast, bytes.size(), root, check_root(root));
    account_broadcast(bytes.size(), root);
    return queue_.submit([this, bytes, root] { do_broadcast(bytes, root); });
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    validated(op_code::broadcast, buf.size(), root, check_root(root));
    account_broadcast(buf.size(), root);
    return queue_.submit([this, buf, root] { do_broadcast(buf, root); });
  }
  request iall_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(op_code::all_to_all, send.size(), 0,
              check_exchange(op_code::all_to_all, send, recv));
    account_exchange(send.size() / static_cast<std::size_t>(size()));
    return queue_.submit([this, send, recv] { do_all_to_all(send, recv); });
  }
  request iall_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(op_code::all_gather, send.size(), 0,
              check_exchange(op_code::all_gather, send, recv));
    account_exchange(send.size());
    return queue_.submit([this, send, recv] { do_all_gather(send, recv); });
  }
  request ibarrier() {
    return queue_.submit([this] { do_barrier(); });
  }
  ///@}

  /// Runs `task` on this communicator's progress thread, after every
  /// non-blocking operation issued before it; its exception becomes the
  /// request's error. Inside the task this communicator's blocking
  /// operations run at once, on that thread (reduce::staged chains a
  /// compressed exchange's collectives and the work between them this way,
  /// so the exchange advances while the caller trains).
  request submit(std::function<void()> task) { return queue_.submit(std::move(task)); }

 private:
  using op_code = detail::collective;
  /// Gloo matches messages by slot: argument headers and payloads use
  /// different tags so the two can never be confused.
  static constexpr std::uint32_t header_tag = 0;
  static constexpr std::uint32_t payload_tag = 1;

  /// A blocking operation never overtakes pending non-blocking ones.
  template <class F>
  void blocking(F&& f) {
    queue_.run_in_order(std::forward<F>(f));
  }

  // ------------------------------------------------ argument validation
  /// The local checks shared by every communicator (comm/detail/arguments.hpp).
  detail::call_site site() const { return {"comm::gloo", "world", rank()}; }

  std::string check_root(int root) const {
    return detail::root_problem(site(), op_code::broadcast, root, size());
  }

  std::string check_exchange(op_code op, std::span<const std::byte> send, std::span<std::byte> recv) const {
    return detail::exchange_problem(site(), op, send.data(), send.size(), recv.data(), recv.size(), size());
  }

  /// Throws config_error if this rank rejected its arguments (`problem` is
  /// not empty), after telling the other ranks in the argument check so
  /// that they fail at once instead of at the timeout.
  void validated(op_code op, std::size_t count, int arg, const std::string& problem) {
    if (problem.empty()) return;
    if (opts_.check_arguments && size() > 1) {
      try {
        blocking([&] {
          detail_gloo::sigpipe_guard guard;
          if (closed_reason().empty()) agree(op, count, arg, problem);
        });
      } catch (const comm_error&) {
        // The caller's own mistake is the error to report.
      }
    }
    diloco::detail::raise<config_error>(problem);
  }

  // ------------------------------------------------------------ traffic
  /// The models shared by every communicator (core/comm_types.hpp); Gloo's
  /// broadcast really runs a binomial tree.
  void account_all_reduce(std::size_t n) { traffic_.add_all_reduce(n * sizeof(float), size()); }
  void account_broadcast(std::size_t bytes, int root) { traffic_.add_broadcast(bytes, rank(), root, size()); }
  void account_exchange(std::size_t block) { traffic_.add_exchange(block, size()); }

  // ---------------------------------------------------------- execution
  /// Runs one collective: fails at once if the communicator is closed,
  /// checks the ranks' arguments agree, then lets Gloo move the data.
  template <class Transfer>
  void collective(op_code op, std::uint64_t count, int arg, Transfer&& transfer) {
    detail_gloo::sigpipe_guard guard;
    const char* name = detail::name(op);
    if (std::string reason = closed_reason(); !reason.empty())
      diloco::detail::raise<comm_error>("comm::gloo ", name, " on rank ", rank(),
                                        ": the communicator is closed since an earlier operation failed (",
                                        reason, ")");
    diloco::detail::fault_point(name);
    if (opts_.check_arguments && size() > 1) agree(op, count, arg, {});
    if (count == 0 && op != op_code::barrier) return;
    guarded(name, transfer);
  }

  /// The shared agreement check (comm/detail/agreement.hpp) over one Gloo
  /// all-gather of the records, on a tag of its own; the records carry a
  /// sequence number, so ranks out of step are named as such.
  void agree(op_code op, std::uint64_t count, int arg, const std::string& problem) {
    detail::call_record record = detail::record_of(op, count, arg);
    record.sequence = ++sequence_;
    std::vector<detail::call_record> all(static_cast<std::size_t>(size()));
    detail::agree(site(), record, problem, [&](const detail::call_record& mine) {
      guarded(detail::name(op), [&] {
        ::gloo::AllgatherOptions o(conn_.context);
        o.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(&mine)), sizeof mine);
        o.setOutput(reinterpret_cast<std::uint8_t*>(all.data()), all.size() * sizeof mine);
        o.setTag(header_tag);
        o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
        closing_on_failure([&] { ::gloo::allgather(o); });
      });
      return std::span<const detail::call_record>(all);
    });
  }

  /// Any failure inside Gloo closes this communicator's connections, so that
  /// ranks blocked on this one fail now rather than at their timeout, and is
  /// reported as comm_error naming the operation, the rank and, when Gloo's
  /// message shows it, the peer.
  template <class Transfer>
  void guarded(const char* name, Transfer&& transfer) {
    std::string what, kind;
    try {
      transfer();
      return;
    } catch (const ::gloo::IoException& e) {
      what = e.what();
      kind = what.find("Timed out") != std::string::npos ? "timed out" : "connection failed";
    } catch (const ::gloo::EnforceNotMet& e) {
      what = e.what();
      kind = "a check inside Gloo failed";
    } catch (const std::exception& e) {
      what = e.what();
      kind = "Gloo raised an error";
    } catch (...) {
      what = "(not a std::exception)";
      kind = "Gloo raised an unknown exception";
    }
    std::string peer;
    try {
      // The note is normally left already, before the connections closed
      // (closing_on_failure); this covers failures outside it.
      const auto direct = detail_gloo::rank_named_in(what, conn_.peers);
      detail_gloo::publish_failure(*conn_.store, rank(), direct);
      if (size() > 1) peer = detail_gloo::name_culprit(*conn_.store, rank(), size(), direct, blame_grace());
    } catch (...) {
      // Naming the peer is a courtesy; the failure is reported regardless.
    }
    std::string failure = diloco::detail::concat("comm::gloo ", name, " on rank ", rank(), " of ", size(), " failed",
                                                 peer, ": ", kind, " (timeout ", diloco::detail::describe_timeout(opts_.timeout), "): ", what);
    {
      std::lock_guard lock(mutex_);
      closed_ = failure;
    }
    close_connections();
    diloco::detail::raise<comm_error>(failure, "; this communicator is now closed");
  }

  /// Runs a Gloo call whose buffers (owned by its options) are still alive
  /// here; on failure the connections are closed before those buffers are
  /// destroyed. Closing a pair waits until Gloo's event loop has left it, and
  /// the loop may still be completing a transfer into a buffer of the failed
  /// call (seen under TSan in the kill test).
  /// First it leaves this rank's failure note in the store, so that a rank
  /// that sees these connections close can tell whom this one blamed.
  template <class Call>
  void closing_on_failure(Call&& call) {
    try {
      call();
    } catch (const std::exception& e) {
      std::optional<int> direct;
      try {
        direct = detail_gloo::rank_named_in(e.what(), conn_.peers);
      } catch (...) {
        // Then the note says "not known".
      }
      detail_gloo::publish_failure(*conn_.store, rank(), direct);
      close_connections();
      throw;
    } catch (...) {
      detail_gloo::publish_failure(*conn_.store, rank(), std::nullopt);
      close_connections();
      throw;
    }
  }

  /// How long a failed rank waits for the others' notes when the trail ends
  /// in a timeout (a stalled rank): the live ranks fail within milliseconds
  /// of each other, since each closes its connections when it fails.
  std::chrono::milliseconds blame_grace() const {
    return std::min(opts_.timeout, std::chrono::milliseconds(500));
  }

  void close_connections() noexcept {
    try {
      if (conn_.context) conn_.context->closeConnections();
    } catch (...) {
      // Closing is best effort; the error being reported is what matters.
    }
  }

  std::string closed_reason() {
    std::lock_guard lock(mutex_);
    return closed_;
  }

  void do_all_reduce(std::span<float> buf, reduce_op op) {
    collective(op_code::all_reduce, buf.size(), static_cast<int>(op), [&] {
      ::gloo::AllreduceOptions o(conn_.context);
      o.setOutput(buf.data(), buf.size());
      o.setReduceFunction(&add_floats);
      o.setTag(payload_tag);
      o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
      closing_on_failure([&] { ::gloo::allreduce(o); });
    });
    if (op == reduce_op::mean) {
      const auto m = static_cast<float>(size());
      for (float& v : buf) v = v / m;
    }
  }

  /// c = a + b over n floats; c may be a.
  static void add_floats(void* c, const void* a, const void* b, std::size_t n) {
    auto* out = static_cast<float*>(c);
    const auto* x = static_cast<const float*>(a);
    const auto* y = static_cast<const float*>(b);
    for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  }

  void do_broadcast(std::span<std::byte> buf, int root) {
    collective(op_code::broadcast, buf.size(), root, [&] {
      ::gloo::BroadcastOptions o(conn_.context);
      o.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), buf.size());
      o.setRoot(root);
      o.setTag(payload_tag);
      o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
      closing_on_failure([&] { ::gloo::broadcast(o); });
    });
  }

  void do_all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    collective(op_code::all_to_all, send.size(), 0, [&] {
      ::gloo::AlltoallOptions o(conn_.context);
      // Gloo's buffers are not const-qualified; it only reads the input.
      o.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(send.data())), send.size());
      o.setOutput(reinterpret_cast<std::uint8_t*>(recv.data()), recv.size());
      o.setTag(payload_tag);
      o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
      closing_on_failure([&] { ::gloo::alltoall(o); });
    });
  }

  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    collective(op_code::all_gather, send.size(), 0, [&] {
      ::gloo::AllgatherOptions o(conn_.context);
      o.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(send.data())), send.size());
      o.setOutput(reinterpret_cast<std::uint8_t*>(recv.data()), recv.size());
      o.setTag(payload_tag);
      o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
      closing_on_failure([&] { ::gloo::allgather(o); });
    });
  }

  void do_barrier() {
    collective(op_code::barrier, 0, 0, [&] {
      ::gloo::BarrierOptions o(conn_.context);
      o.setTag(payload_tag);
      o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
      closing_on_failure([&] { ::gloo::barrier(o); });
    });
  }

  // ------------------------------------------------- elastic internals
  static std::vector<char> encode_members(const std::vector<std::string>& ids, std::uint64_t next_join) {
    std::string text;
    for (const auto& id : ids) text += id + ",";
    text += "\n" + std::to_string(next_join);
    return {text.begin(), text.end()};
  }
  static std::pair<std::vector<std::string>, std::uint64_t> decode_members(const std::vector<char>& bytes) {
    const std::string text(bytes.begin(), bytes.end());
    const auto nl = text.find('\n');
    if (nl == std::string::npos)
      diloco::detail::raise<format_error>("comm::gloo: a member list in the store is malformed: '", text, "'");
    std::vector<std::string> ids;
    std::string cur;
    for (char c : text.substr(0, nl)) {
      if (c == ',') {
        ids.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    return {ids, std::stoull(text.substr(nl + 1))};
  }

  /// Takes generation g's membership: rank and size from the list.
  void adopt(std::uint64_t g, std::vector<std::string> list, std::uint64_t next_join) {
    const auto it = std::find(list.begin(), list.end(), id_);
    generation_ = g;
    members_ = std::move(list);
    next_join_ = next_join;
    opts_.rank = static_cast<int>(it - members_.begin());
    opts_.size = static_cast<int>(members_.size());
    if (opts_.local_world_size > opts_.size) opts_.local_world_size = opts_.size;
    std::lock_guard lock(mutex_);
    closed_.clear();
    sequence_ = 0;
  }

  /// Reads generation g's list, written by whoever wrote first.
  std::pair<std::vector<std::string>, std::uint64_t> members_of(std::uint64_t g) {
    const std::string key = diloco::detail::concat("g", g, "/members");
    std::vector<std::vector<char>> value(1);
    const auto deadline = diloco::detail::deadline_after<detail_gloo::startup_clock>(opts_.timeout);
    if (!detail_gloo::poll_keys(*meta_, {0}, [&](int) { return key; }, deadline, value).empty())
      diloco::detail::raise<comm_error>("comm::gloo: generation ", g, "'s member list did not appear within ",
                                        diloco::detail::describe_timeout(opts_.timeout));
    return decode_members(value[0]);
  }

  /// Connects to generation g after adopting it (its failure: the caller's).
  void connect_generation() {
    close_connections();
    conn_ = {};
    conn_ = detail_gloo::rendezvous(opts_, diloco::detail::concat("elastic/g", generation_));
  }

  bool do_boundary(bool leave, boundary_kind kind) {
    struct record {
      std::uint32_t leave, joiners;
    };
    record mine{leave ? 1u : 0u, 0u};
    if (rank() == 0 && kind == boundary_kind::round_end && opts_.admit_joiners)
      while (meta_->has({diloco::detail::concat("join/", next_join_ + mine.joiners)})) ++mine.joiners;
    std::vector<record> all(static_cast<std::size_t>(size()));
    if (size() > 1) {
      do_all_gather(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&mine), sizeof mine),
                    std::span<std::byte>(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof mine));
    } else {
      all[0] = mine;
    }
    std::vector<std::string> next;
    for (int k = 0; k < size(); ++k)
      if (!all[static_cast<std::size_t>(k)].leave) next.push_back(members_[static_cast<std::size_t>(k)]);
    const std::uint32_t joiners = next.empty() ? 0u : all[0].joiners;
    if (next.size() == members_.size() && joiners == 0) return false;
    for (std::uint32_t j = 0; j < joiners; ++j)
      next.push_back(diloco::detail::concat("j", next_join_ + j));
    const std::uint64_t g = generation_ + 1;
    meta_->create(diloco::detail::concat("g", g, "/members"), encode_members(next, next_join_ + joiners));
    auto [list, next_join] = members_of(g);
    if (leave || std::find(list.begin(), list.end(), id_) == list.end()) {
      close_connections();
      left_ = true;
      generation_ = g;
      return true;
    }
    adopt(g, std::move(list), next_join);
    if (static_cast<int>(members_.size()) < opts_.min_workers)
      diloco::detail::raise<comm_error>("comm::gloo: the group would have ", members_.size(),
                                        " workers, fewer than min_workers (", opts_.min_workers, ")");
    connect_generation();
    return true;
  }

  /// Whether member k of the current generation is presumed dead: it left
  /// no failure note of its own, and another member's note blames it.
  bool presumed_dead(int k) {
    if (!conn_.store) return false;
    try {
      if (detail_gloo::failure_note(*conn_.store, k)) return false;
      for (int w = 0; w < static_cast<int>(members_.size()); ++w)
        if (w != k && detail_gloo::failure_note(*conn_.store, w) == k) return true;
    } catch (...) {
    }
    return false;
  }

  /// Set when member `id` of generation g ended normally (see ~gloo).
  static std::string closed_key(std::uint64_t g, const std::string& id) {
    return diloco::detail::concat("g", g, "/closed/", id);
  }

  /// How long survivors wait for the members of the failed generation to
  /// register. A live member reaches a collective within `timeout` of the
  /// others (or the group would time out without any death) and its
  /// collective fails within `timeout` (a peer that died without resetting
  /// its connections is only noticed by the timeout), so 2 x timeout (and a
  /// little for the store) admits every live member; only a frozen or dead
  /// one that nobody blames costs the whole wait.
  std::chrono::milliseconds recovery_wait() const {
    if (diloco::detail::unbounded(opts_.timeout)) return opts_.timeout;
    const auto bound = std::chrono::milliseconds::max() / 4;
    return opts_.timeout > bound ? opts_.timeout : 2 * opts_.timeout + std::chrono::milliseconds(250);
  }

  void do_recover() {
    for (;;) {
      const std::uint64_t g = generation_ + 1;
      auto alive_key = [g](const std::string& id) { return diloco::detail::concat("g", g, "/alive/", id); };
      const std::string members_key = diloco::detail::concat("g", g, "/members");
      if (!meta_->has({members_key})) {
        meta_->create(alive_key(id_), {'1'});
        // Wait for every member of this generation to register, or to be
        // presumed dead, or recovery_wait() to pass.
        const auto deadline = diloco::detail::deadline_after<detail_gloo::startup_clock>(recovery_wait());
        for (;;) {
          if (meta_->has({members_key})) break;
          bool decided = true;
          for (std::size_t k = 0; k < members_.size() && decided; ++k)
            decided = meta_->has({alive_key(members_[k])}) || presumed_dead(static_cast<int>(k));
          if (decided || detail_gloo::startup_clock::now() >= deadline) break;
          detail_gloo::poll_pause(deadline);
        }
        std::vector<std::string> alive;
        for (const auto& id : members_)
          if (meta_->has({alive_key(id)})) alive.push_back(id);
        meta_->create(members_key, encode_members(alive, next_join_));
      }
      auto [list, next_join] = members_of(g);
      if (std::find(list.begin(), list.end(), id_) == list.end()) {
        {
          std::lock_guard lock(mutex_);
          closed_ = diloco::detail::concat("dropped from the group: generation ", g,
                                           " was formed without this worker");
        }
        close_connections();
        diloco::detail::raise<comm_error>("comm::gloo (elastic) worker ", id_, ": generation ", g,
                                          " of the group was formed without it (it was presumed dead or came "
                                          "too late); it may join again as a new worker");
      }
      adopt(g, std::move(list), next_join);
      if (static_cast<int>(members_.size()) < opts_.min_workers)
        diloco::detail::raise<comm_error>("comm::gloo: only ", members_.size(),
                                          " workers survive, fewer than min_workers (", opts_.min_workers, ")");
      try {
        connect_generation();
        return;
      } catch (const comm_error&) {
        // Another member failed while connecting: the next generation.
      }
    }
  }

  options opts_;
  /// Elastic state: the store's elastic scope, this worker's id, the
  /// generation's member ids (rank order) and the next joiner slot.
  std::unique_ptr<detail_gloo::rendezvous_store> meta_;
  std::string id_;
  std::uint64_t generation_ = 0;
  std::vector<std::string> members_;
  std::uint64_t next_join_ = 0;
  bool joining_ = false;
  bool left_ = false;
  detail_gloo::connection conn_;
  detail::shared_traffic traffic_;
  std::uint64_t sequence_ = 0;  ///< touched only by the thread running collectives
  std::mutex mutex_;
  std::string closed_;  ///< the failure that closed the communicator; empty while usable
  /// Last member: destroyed first, so its thread finishes (or times out)
  /// the queued operations while the connection is still alive.
  detail::progress_queue queue_;
};

}  // namespace diloco::comm
