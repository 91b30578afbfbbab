// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/reduce/verdict.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

/// One byte collective of a protocol: an all-to-all of `bytes` in total, or
/// an all-gather of `bytes` per rank.
struct collective {
  ///@{
  /// Which collective.
  enum class kind { all_to_all, all_gather } op;
  ///@}
  const std::byte* send;  ///< this rank's send buffer
  std::byte* recv;        ///< its receive buffer
  std::size_t bytes;      ///< the all-to-all's whole buffer, or the all-gather's block per rank
};

/// The state machine every engine-backed reducer runs (reduce::compressed,
/// reduce::gathered, reduce::factored): encode, then a fixed list of
/// collectives, each followed by the engine's operations on what arrived,
/// then the vote (a tiny all-reduce of each rank's verdict) and the result.
/// When the schedule overlaps, the stages run beside the inner steps:
///  - host parameters and a task_communicator (comm::threads, comm::gloo):
///    begin() encodes and submits the rest of the exchange as one task to
///    the communicator's progress thread, which runs each collective and
///    the engine's operations after it (on its own copy of the executor) as
///    soon as the data has arrived, whatever the training thread is doing;
///  - otherwise, when the transport runs the communicator's collectives
///    non-blocking (an async host communicator, for device buffers staged
///    through host memory too, or an async device communicator), each
///    collective is started non-blocking and the next stage runs when poll()
///    finds it complete, between inner steps.
/// Without overlap, or without non-blocking collectives, begin() runs every
/// stage at once through the engine's transport. All three give the same
/// bits (the executor's reductions do not depend on its threads). A world of
/// one copies instead of calling the communicator.
///
/// A reducer derives from staged<Derived, Engine, Comm, Space, Exec> and says
/// its protocol:
///   static constexpr std::size_t exchanges;     collectives before the vote
///   collective exchange(std::size_t i);         the i-th one's buffers
///   void alone(std::size_t i, Exec&);           its copy in a world of one
///   void after(std::size_t i, Exec&);           the operations once it completed
/// The engine provides encode(exec, ref, round), vote_data(), vote_count(),
/// result(exec), apply(...), slot_bytes(), residual(), visit_state(...).
template <class Derived, class Engine, class Comm, class Space, class Exec>
class staged {
 public:
  /// How the collectives reach the communicator (direct, or staged through host memory).
  using transport = detail::wire_transport<Comm, Space, Exec>;

  /// The size of one rank's slot in the engine's exchange buffers (the transport stages M of
  /// them).
  std::size_t slot_bytes() const { return engine_->slot_bytes(); }
  /// The bytes one rank's collectives carry in a round (the vote aside): an
  /// all-to-all of B bytes sends (M-1)/M of them, an all-gather of B bytes
  /// per rank brings (M-1) B. adaptive<C...> predicts link time from it.
  std::size_t link_bytes() {
    const auto m = static_cast<std::size_t>(world_);
    std::size_t total = 0;
    for (std::size_t i = 0; i < Derived::exchanges; ++i) {
      const collective c = self().exchange(i);
      total += c.op == collective::kind::all_to_all ? c.bytes / m * (m - 1) : c.bytes * (m - 1);
    }
    return total;
  }
  /// The error-feedback residual in the flat layout, in the parameters' memory space.
  auto residual() const { return engine_->residual(); }
  /// The engine's state (the error-feedback residual, ...) under `prefix`, for checkpoints.
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    engine_->visit_state(v, prefix);
  }

  /// A completed exchange's result for apply(), under `prefix` (checkpoints
  /// of a reduction in flight): what the engine's decode-apply reads.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    engine_->visit_ready(v, prefix);
  }

  /// Encodes this rank's pseudo-gradient (Δ = ref − local; `round` seeds stochastic rounding)
  /// and starts the first collective: non-blocking when `overlap` and the transport allows it,
  /// else the whole exchange runs now.
  void begin(Exec& exec, Comm& comm, transport& link, const float* ref, std::uint64_t round, bool overlap) {
    async_ = transport::async && overlap;
    engine_->encode(exec, ref, round);
    stage_ = 0;
    chained_ = false;
    if constexpr (chains) {
      if (async_ && comm.size() > 1) {
        // The task runs the stages blocking, one after another, on the
        // progress thread; nothing here touches the stage state until
        // its request has completed.
        if (!side_) side_.emplace(exec);
        async_ = false;
        chained_ = true;
        pending_ = typename transport::request(comm.submit([this, &comm, &link] { start(*side_, comm, link); }));
        return;
      }
    }
    start(exec, comm, link);
  }

  /// Drops the exchange in flight (elastic recovery): the pending collective
  /// (or chained task) is waited for and its result ignored; the residual
  /// was not committed.
  void abort() {
    pending_ = {};
    chained_ = false;
    stage_ = done;
  }

  /// Runs every stage whose collective has completed; true when the whole
  /// exchange has.
  bool poll(Exec& exec, Comm& comm, transport& link) {
    if (chained_) {
      if (!finished_chain(false)) {
        // The chain's threads (the progress thread, the transport's) may
        // share this thread's core, as a worker pinned to one core does:
        // let them run now, at a step boundary, rather than when the
        // scheduler next preempts the training thread.
        std::this_thread::yield();
        return false;
      }
    }
    while (stage_ != done) {
      if (!pending_.test()) return false;
      advance(exec, comm, link);
    }
    return true;
  }

  /// Runs the remaining stages to the end and returns the verdict, the same on every rank.
  verdict wait(Exec& exec, Comm& comm, transport& link) {
    if (chained_) finished_chain(true);
    while (stage_ != done) {
      pending_.wait();
      advance(exec, comm, link);
    }
    return out_;
  }

  /// The outer step on `global` with the decoded mean (`state`: the outer optimizer's slots,
  /// `stride` apart), merged into the replica by `merge`; commits the new residual.
  template <class Update, class Merge>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t stride, const Merge& merge) {
    engine_->apply(exec, update, global, state, stride, merge);
  }

 protected:
  /// A reducer over `engine`, in a group of `world` ranks.
  staged(std::unique_ptr<Engine> engine, int world) : engine_(std::move(engine)), world_(world) {}
  /// The engine for Space: a host engine takes no executor, a device engine
  /// uploads its tables with it.
  template <class Options>
  static std::unique_ptr<Engine> make_engine(const parameter_set<float, Space>& params, int world, int rank,
                                             const Options& opts, std::uint32_t fragment, Exec& exec) {
    if constexpr (std::is_same_v<Space, host_space>)
      return (void)exec, std::make_unique<Engine>(params, world, rank, opts, fragment);
    else
      return std::make_unique<Engine>(params, world, rank, opts, exec, fragment);
  }
  std::unique_ptr<Engine> engine_;  ///< the per-space operations of the protocol

 private:
  /// stage_ names the collective in flight (or just done): exchanges 0..n-1,
  /// then the vote, then done.
  static constexpr std::size_t vote = Derived::exchanges;
  static constexpr std::size_t done = vote + 1;

  Derived& self() { return static_cast<Derived&>(*this); }

  /// Whether an overlapped exchange runs as one task on the communicator's
  /// progress thread (host parameters, a task_communicator, an executor the
  /// task can have its own copy of).
  static constexpr bool chains = std::is_same_v<Space, host_space> && transport::async && task_communicator<Comm> &&
                                 std::copy_constructible<Exec>;

  /// The chained task's completion (`block`: wait for it, else test): true
  /// once it has run every stage. Its error (a collective's comm_error, a
  /// refused segment) is rethrown, and the exchange is then over.
  bool finished_chain(bool block) {
    try {
      if (block)
        pending_.wait();
      else if (!pending_.test())
        return false;
    } catch (...) {
      chained_ = false;
      stage_ = done;
      throw;
    }
    chained_ = false;
    return true;
  }

  /// Starts the current stage's collective: non-blocking when overlapping
  /// (poll/wait finish it), else blocking through the transport.
  void start(Exec& exec, Comm& comm, transport& link) {
    if (stage_ == done) return;
    const bool alone = comm.size() == 1;
    if constexpr (transport::async) {
      if (async_ && !alone) {
        if (stage_ == vote) {
          pending_ = link.iall_reduce(comm, exec, engine_->vote_data(), engine_->vote_count(), reduce_op::sum);
        } else {
          const collective c = self().exchange(stage_);
          pending_ = c.op == collective::kind::all_gather ? link.iall_gather(comm, exec, c.send, c.bytes, c.recv)
                                                          : link.iall_to_all(comm, exec, c.send, c.recv, c.bytes);
        }
        return;
      }
    }
    if (stage_ == vote) {
      if (!alone) link.all_reduce(comm, exec, engine_->vote_data(), engine_->vote_count(), reduce_op::sum);
    } else if (alone) {
      self().alone(stage_, exec);
    } else {
      const collective c = self().exchange(stage_);
      if (c.op == collective::kind::all_gather)
        link.all_gather(comm, exec, c.send, c.bytes, c.recv);
      else
        link.all_to_all(comm, exec, c.send, c.recv, c.bytes);
    }
    // Blocking: the collective is complete, go on at once.
    advance(exec, comm, link);
  }

  /// The current stage's collective has completed: run the operations after
  /// it and start the next collective.
  void advance(Exec& exec, Comm& comm, transport& link) {
    if (stage_ == done) return;
    if (stage_ == vote) {
      out_ = engine_->result(exec);
      stage_ = done;
      return;
    }
    self().after(stage_, exec);
    ++stage_;
    start(exec, comm, link);
  }

  int world_ = 1;
  std::size_t stage_ = done;
  bool async_ = false;
  bool chained_ = false;  // the exchange in flight runs as a task on the progress thread
  verdict out_;
  std::optional<Exec> side_;  // the chained task's executor (made from the caller's on first use)
  // Declared last, so destroyed first: an unfinished task is waited for
  // while everything it uses is still alive.
  typename transport::request pending_;
};

}  // namespace diloco::reduce
