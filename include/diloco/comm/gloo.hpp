#pragma once

// Communicator over Gloo's TCP transport: one rank per process, on one
// machine or many. Ranks find each other through a rendezvous store (a
// shared directory or a Redis server), every wait is bounded by a timeout,
// and a peer that vanishes or stops answering surfaces as comm_error on
// every surviving rank. Link diloco::gloo to use it.
//
//   diloco::comm::gloo comm({.rank = r, .size = n,
//                            .rendezvous = diloco::comm::gloo::file_store{"/shared/rdv"}});
//   auto comm = diloco::comm::gloo::from_env();   // DILOCO_RANK, ... (scripts/launch_gloo.sh)

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
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>

#include "diloco/comm/detail/async.hpp"
#include "diloco/comm/gloo/agreement.hpp"
#include "diloco/comm/gloo/options.hpp"
#include "diloco/comm/gloo/rendezvous.hpp"
#include "diloco/comm/gloo/sigpipe.hpp"
#include "diloco/comm/gloo/store.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm {

class gloo {
 public:
  using request = async_request;
  using options = detail_gloo::options;
  using file_store = detail_gloo::file_store;
  using redis_store = detail_gloo::redis_store;

  // Joins the world: collective over all `size` processes, which must be
  // started with the same store, run id and size. Throws config_error for
  // bad options and comm_error, within options.timeout of the call, when
  // a rank does not come or does not connect (naming it).
  explicit gloo(options opts) : opts_(std::move(opts)) {
    detail_gloo::validate(opts_);
    detail_gloo::sigpipe_guard guard;
    conn_ = detail_gloo::rendezvous(opts_);
  }

  // Options from DILOCO_RANK, DILOCO_WORLD_SIZE, DILOCO_STORE and the
  // optional DILOCO_RUN_ID, DILOCO_HOSTNAME, DILOCO_IFACE, DILOCO_TIMEOUT_MS.
  static options options_from_env() { return detail_gloo::options_from_env(); }
  static gloo from_env() { return gloo(options_from_env()); }

  gloo(const gloo&) = delete;
  gloo& operator=(const gloo&) = delete;

  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  // How many ranks share this host's cores (options.local_world_size).
  int workers_on_host() const { return opts_.local_world_size > 0 ? opts_.local_world_size : 1; }
  traffic_counters traffic() const { return traffic_; }
  const options& settings() const { return opts_; }

  // ------------------------------------------------------------ blocking
  // In-place fp32 all-reduce with Gloo's ring algorithm. Every rank ends
  // with the same bits, and the same world size and inputs give the same
  // bits on every run; the summation order is the ring's, not rank order.
  void all_reduce(std::span<float> buf, reduce_op op) {
    account_all_reduce(buf.size());
    blocking([&] { do_all_reduce(buf, op); });
  }
  void broadcast(std::span<float> buf, int root) {
    std::span<std::byte> bytes(reinterpret_cast<std::byte*>(buf.data()), buf.size_bytes());
    validated(detail_gloo::op_code::broadcast, bytes.size(), root, check_root(root));
    account_broadcast(bytes.size(), root);
    blocking([&] { do_broadcast(bytes, root); });
  }
  void broadcast(std::span<std::byte> buf, int root) {
    validated(detail_gloo::op_code::broadcast, buf.size(), root, check_root(root));
    account_broadcast(buf.size(), root);
    blocking([&] { do_broadcast(buf, root); });
  }
  // send holds M equal blocks, block k for rank k; recv receives block
  // `rank` of every rank's send, in rank order.
  void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(detail_gloo::op_code::all_to_all, send.size(), 0,
              check_exchange("all_to_all", send, recv, send.size()));
    account_exchange(send.size() / static_cast<std::size_t>(size()));
    blocking([&] { do_all_to_all(send, recv); });
  }
  // recv receives every rank's send, in rank order (M blocks).
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(detail_gloo::op_code::all_gather, send.size(), 0,
              check_exchange("all_gather", send, recv, send.size() * static_cast<std::size_t>(size())));
    account_exchange(send.size());
    blocking([&] { do_all_gather(send, recv); });
  }
  void barrier() {
    blocking([&] { do_barrier(); });
  }

  // -------------------------------------------------------- non-blocking
  // Each returns at once; the operation runs on this communicator's
  // progress thread, in issue order. Buffers must stay untouched until
  // wait() returns. Arguments this rank rejects throw config_error at the
  // call, after the other ranks have been told (so it may wait for them).
  request iall_reduce(std::span<float> buf, reduce_op op) {
    account_all_reduce(buf.size());
    return queue_.submit([this, buf, op] { do_all_reduce(buf, op); });
  }
  request ibroadcast(std::span<float> buf, int root) {
    std::span<std::byte> bytes(reinterpret_cast<std::byte*>(buf.data()), buf.size_bytes());
    validated(detail_gloo::op_code::broadcast, bytes.size(), root, check_root(root));
    account_broadcast(bytes.size(), root);
    return queue_.submit([this, bytes, root] { do_broadcast(bytes, root); });
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    validated(detail_gloo::op_code::broadcast, buf.size(), root, check_root(root));
    account_broadcast(buf.size(), root);
    return queue_.submit([this, buf, root] { do_broadcast(buf, root); });
  }
  request iall_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(detail_gloo::op_code::all_to_all, send.size(), 0,
              check_exchange("all_to_all", send, recv, send.size()));
    account_exchange(send.size() / static_cast<std::size_t>(size()));
    return queue_.submit([this, send, recv] { do_all_to_all(send, recv); });
  }
  request iall_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    validated(detail_gloo::op_code::all_gather, send.size(), 0,
              check_exchange("all_gather", send, recv, send.size() * static_cast<std::size_t>(size())));
    account_exchange(send.size());
    return queue_.submit([this, send, recv] { do_all_gather(send, recv); });
  }
  request ibarrier() {
    return queue_.submit([this] { do_barrier(); });
  }

 private:
  using op_code = detail_gloo::op_code;
  // Gloo matches messages by slot: argument headers and payloads use
  // different tags so the two can never be confused.
  static constexpr std::uint32_t header_tag = 0;
  static constexpr std::uint32_t payload_tag = 1;

  // A blocking operation never overtakes pending non-blocking ones.
  template <class F>
  void blocking(F&& f) {
    queue_.run_in_order(std::forward<F>(f));
  }

  // ------------------------------------------------ argument validation
  std::string check_root(int root) const {
    if (root < 0 || root >= size())
      return diloco::detail::concat("diloco: comm::gloo broadcast on rank ", rank(), ": root ", root,
                                    " is not a rank of a world of ", size());
    return {};
  }

  std::string check_exchange(const char* op, std::span<const std::byte> send, std::span<std::byte> recv,
                             std::size_t want_recv) const {
    const auto m = static_cast<std::size_t>(size());
    auto prefix = [&] { return diloco::detail::concat("diloco: comm::gloo ", op, " on rank ", rank(), ": "); };
    if (std::strcmp(op, "all_to_all") == 0 && send.size() % m != 0)
      return prefix() + diloco::detail::concat("send has ", send.size(), " bytes, not a multiple of the world size ", m);
    if (recv.size() != want_recv)
      return prefix() + diloco::detail::concat("recv has ", recv.size(), " bytes, expected ", want_recv, " for ",
                                               send.size(), " bytes sent by each of ", m, " ranks");
    const auto* s0 = send.data();
    const auto* r0 = recv.data();
    if (!send.empty() && !recv.empty() && s0 < r0 + recv.size() && r0 < s0 + send.size())
      return prefix() + "send and recv buffers overlap";
    return {};
  }

  // Throws config_error if this rank rejected its arguments (`problem` is
  // not empty), after telling the other ranks in the argument check so
  // that they fail at once instead of at the timeout.
  void validated(op_code op, std::size_t count, int arg, const std::string& problem) {
    if (problem.empty()) return;
    if (opts_.check_arguments && size() > 1) {
      try {
        blocking([&] {
          detail_gloo::sigpipe_guard guard;
          if (closed_reason().empty()) agree(op, count, arg, true);
        });
      } catch (const comm_error&) {
        // The caller's own mistake is the error to report.
      }
    }
    throw config_error(problem);
  }

  // ------------------------------------------------------------ traffic
  // The models shared by every communicator (core/comm_types.hpp); Gloo's
  // broadcast really runs a binomial tree.
  void account_all_reduce(std::size_t n) { traffic_.add_all_reduce(n * sizeof(float), size()); }
  void account_broadcast(std::size_t bytes, int root) { traffic_.add_broadcast(bytes, rank(), root, size()); }
  void account_exchange(std::size_t block) { traffic_.add_exchange(block, size()); }

  // ---------------------------------------------------------- execution
  // Runs one collective: fails at once if the communicator is closed,
  // checks the ranks' arguments agree, then lets Gloo move the data.
  template <class Transfer>
  void collective(op_code op, std::uint64_t count, int arg, Transfer&& transfer) {
    detail_gloo::sigpipe_guard guard;
    const char* name = detail_gloo::op_name(op);
    if (std::string reason = closed_reason(); !reason.empty())
      diloco::detail::raise<comm_error>("comm::gloo ", name, " on rank ", rank(),
                                        ": the communicator is closed since an earlier operation failed (",
                                        reason, ")");
    if (opts_.check_arguments && size() > 1) agree(op, count, arg, false);
    if (count == 0 && op != op_code::barrier) return;
    guarded(name, transfer);
  }

  void agree(op_code op, std::uint64_t count, int arg, bool rejected) {
    detail_gloo::call_header mine{static_cast<std::uint32_t>(op), rejected ? 1u : 0u, count, arg, ++sequence_};
    std::vector<detail_gloo::call_header> all(static_cast<std::size_t>(size()));
    guarded(detail_gloo::op_name(op), [&] {
      ::gloo::AllgatherOptions o(conn_.context);
      o.setInput(reinterpret_cast<std::uint8_t*>(&mine), sizeof mine);
      o.setOutput(reinterpret_cast<std::uint8_t*>(all.data()), all.size() * sizeof mine);
      o.setTag(header_tag);
      o.setTimeout(detail_gloo::gloo_wait(opts_.timeout));
      closing_on_failure([&] { ::gloo::allgather(o); });
    });
    if (rejected) return;  // the caller raises its own config_error
    if (std::string why = detail_gloo::disagreement(all, rank()); !why.empty()) throw comm_error(why);
  }

  // Any failure inside Gloo closes this communicator's connections, so that
  // ranks blocked on this one fail now rather than at their timeout, and is
  // reported as comm_error naming the operation, the rank and, when Gloo's
  // message shows it, the peer.
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

  // Runs a Gloo call whose buffers (owned by its options) are still alive
  // here; on failure the connections are closed before those buffers are
  // destroyed. Closing a pair waits until Gloo's event loop has left it, and
  // the loop may still be completing a transfer into a buffer of the failed
  // call (seen under TSan in the kill test).
  // First it leaves this rank's failure note in the store, so that a rank
  // that sees these connections close can tell whom this one blamed.
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

  // How long a failed rank waits for the others' notes when the trail ends
  // in a timeout (a stalled rank): the live ranks fail within milliseconds
  // of each other, since each closes its connections when it fails.
  std::chrono::milliseconds blame_grace() const {
    return std::min(opts_.timeout, std::chrono::milliseconds(500));
  }

  void close_connections() noexcept {
    try {
      conn_.context->closeConnections();
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

  // c = a + b over n floats; c may be a.
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

  options opts_;
  detail_gloo::connection conn_;
  traffic_counters traffic_{};
  std::uint64_t sequence_ = 0;  // touched only by the thread running collectives
  std::mutex mutex_;
  std::string closed_;  // the failure that closed the communicator; empty while usable
  // Last member: destroyed first, so its thread finishes (or times out)
  // the queued operations while the connection is still alive.
  detail::progress_queue queue_;
};

}  // namespace diloco::comm
