// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::engine: one worker's DiLoCo, assembled from its parts.
//   replica state  theta_global, outer slots, inner slots and step count,
//                  per-fragment outer step counts, error-feedback residuals,
//                  the schedule's position and buffers: all visitable
//                  (visit_state), nothing reachable only privately;
//   reducers       one per fragment (reduce/fp32_mean.hpp for lossless
//                  pseudo-gradients, reduce/compressed.hpp for lossy codecs),
//                  each begin -> poll/wait -> verdict -> apply(update, merge);
//   schedule       the Sync policy's runtime (sync/runtime.hpp), which owns
//                  the schedule's state and decides, after each inner step,
//                  which fragment begins and which is applied, and with which
//                  merge (kernels/merge.hpp, fused into the apply pass); it
//                  drives the engine through "What a schedule drives" below
//                  and in engine/fragments.hpp;
//   layers below   one each, none of them knowing the optimizers or the
//                  schedule: engine/group.hpp (the communicator and the
//                  memory space: gathers, agreement, positions, events),
//                  engine/membership.hpp (elastic re-forming, through the
//                  hooks replan, reset_replica and abort_in_flight) and
//                  engine/fragments.hpp (the flat layout of the fragments,
//                  their reducers polled, settled and accounted; one
//                  instantiation per compressor, communicator and space).
// This class adds the inner optimizer, the outer step, the schedule's
// runtime and the round: begin, complete (with the schedule's merge) and
// refusal.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/core/agreement.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/fault.hpp"
#include "diloco/core/options.hpp"
#include "diloco/core/state.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/engine/base.hpp"
#include "diloco/engine/fragments.hpp"
#include "diloco/engine/group.hpp"
#include "diloco/engine/membership.hpp"
#include "diloco/engine/options.hpp"
#include "diloco/exec/executor_for.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/kernels/tensor_passes.hpp"
#include "diloco/optimizer.hpp"
#include "diloco/reduce/ready.hpp"
#include "diloco/reduce/select.hpp"
#include "diloco/sync/blocking.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/periodic.hpp"
#include "diloco/sync/runtime.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_list.hpp"

namespace diloco {

namespace detail {

template <class Inner, class Outer, class Compressor, class Comm, class Space, class Sync>
class engine final : public engine_fragments<Compressor, Comm, Space> {
  using group = engine_group<Comm, Space>;
  using membership = engine_membership<Comm, Space>;
  using fragments = engine_fragments<Compressor, Comm, Space>;

 public:
  using options = algorithm_options<Inner, Outer, Compressor, Sync>;
  using executor = typename group::executor;
  using clock = std::chrono::steady_clock;
  using transport_type = typename group::transport_type;

 private:
  // What the engine uses of the layers below it (engine/group.hpp,
  // engine/membership.hpp, engine/fragments.hpp): named here, since they
  // are members of a dependent base.
  using group::comm_;
  using group::world_;
  using group::rank_;
  using group::exec_;
  using group::transport_;
  using group::reserved_bytes_;
  using group::stats_;
  using group::per_rank_;
  using group::steps_in_round_;
  using group::position_;
  using group::left_;
  using group::round_open_;
  using group::agree;
  using group::check_member;
  using group::deliver_hook_error;
  using group::guarded;
  using group::make_event;
  using group::notify;
  using group::seconds_between;
  using group::seconds_since;
  using typename membership::where;
  using membership::elastic_;
  using membership::joiner_;
  using membership::fresh_;
  using membership::recoveries_;
  using membership::agreed_;
  using membership::previous_rank_;
  using membership::previous_world_;
  using membership::membership_check;
  using typename membership::survived;
  using membership::survive;
  using membership::recover_comm;
  using membership::resync_loop;
  using typename fragments::fragment;
  using fragments::params_;
  using fragments::plan_;
  using fragments::frags_;
  using fragments::model_list_;
  using fragments::flat_;
  using fragments::outer_slots_;
  using fragments::overlap_;
  using fragments::global_;
  using fragments::outer_state_;
  using fragments::account;
  using fragments::broadcast_initial;
  using fragments::build_reducers;
  using fragments::check_initial_after_broadcast;
  using fragments::lay_out;
  using fragments::non_finite_initial;
  using fragments::reduction_event;
  using fragments::settle_in_flight;
  using fragments::wait_for;

 public:
  using schedule_type = sync::runtime_t<Sync, Space, Outer>;  // sync/runtime.hpp, sync/periodic.hpp
  // A delayed schedule applies round r at the end of round r+1: its
  // reduction is in flight at every round end (leaves and joins wait for
  // it; a joiner begins with the group).
  static constexpr bool delayed = Sync::kind == sync::schedule_kind::delayed;
  static constexpr bool device = group::device;
  static constexpr bool switching = fragments::switching;
  using fragments::in_flight;
  using fragments::copy_replica_to;      // for the schedule's runtime too
  using fragments::poll_in_flight;       // ...
  using fragments::replica_from_global;  // ...
  using fragments::replica_written;      // ...
  using fragments::access_replica;       // ...

  // `agreed`: what the ranks must agree on (policies, layout, options; the
  // front end writes it), compared across ranks before anything else
  // travels.
  engine(parameter_set<float, Space> params, Comm& comm, const options& opts,
         std::vector<agreement_record> agreed = {})
      : fragments(std::move(params), comm, opts.device_stream, opts.on_event), opts_(opts), sched_(opts_.sync) {
    if (!device && opts_.device_stream != nullptr)
      raise<config_error>("device_stream is set but the parameters are host tensors; it is the CUDA stream of an "
                          "algorithm over device tensors (leave it nullptr)");
    std::vector<std::size_t> sizes;
    for (const auto& t : params_) sizes.push_back(t.size());
    Sync::validate(opts_.sync, opts_.inner_steps, sizes.size());
    const sync::fragment_plan plan = Sync::plan(opts_.sync, opts_.inner_steps, sizes);
    sched_.on_group(*this);
    if constexpr (!Compressor::lossless) Compressor::validate(opts_.compress);
    // A reduction overlaps inner steps only when the schedule lets one stay
    // in flight; otherwise the blocking collectives run (same bits).
    lay_out(plan, Outer::state_slots(opts_.outer), Sync::overlaps && (delayed || plan.delay > 0), opts_.compress);
    inner_ = optimizer_core<Inner, Space>(params_.total(), opts_.inner);

    if constexpr (elastic_communicator<Comm>) {
      if (comm_.elastic()) {
        elastic_ = true;
        agreed_ = std::move(agreed);
        joiner_ = comm_.joining();
        previous_rank_ = joiner_ ? -1 : rank_;
        previous_world_ = joiner_ ? 0 : world_;
        if (joiner_) comm_.join();  // waits for a round end of the running group
        replan();
        elastic_startup();
        deliver_hook_error();
        return;
      }
    }
    build_reducers();
    set_host_threads();
    // Before anything else travels: the ranks agree on the policies, the
    // layout and the options (a mismatch would pair rounds wrongly or drift
    // silently), and, when each rank keeps its own initial parameters, on
    // whether they are finite.
    if (world_ > 1) {
      if (!opts_.broadcast_initial) agreed.push_back({'V', "initial_parameters", non_finite_initial()});
      agree(std::move(agreed));
    } else if (const std::string bad = non_finite_initial(); !bad.empty()) {
      raise<numeric_error>("non-finite initial parameters (", bad,
                           "): a replica that starts non-finite would make every round refused");
    }
    if (opts_.broadcast_initial && world_ > 1) {
      broadcast_initial();
      check_initial_after_broadcast();
    }
    init_global_and_schedule();
    deliver_hook_error();  // a hook that threw on a warning event
  }

  std::size_t steps_in_round() const override { return steps_in_round_; }
  void reset_inner_state() override { inner_.reset(); }
  void set_inner_lr(float lr) override { inner_.set_lr(lr); }
  float inner_lr() const override { return inner_.lr(); }

  void inner_step(std::span<const raw_tensor> grads) override {
    check_member("step");
    set_fault_round(stats_.rounds + 1);
    if (position_ % opts_.inner_steps == opts_.inner_steps / 2) fault_point("inner");
    inner_.step(exec_, params_, grads);
    ++steps_in_round_;
    ++position_;
    ++stats_.inner_steps;
  }

  bool after_step() override {
    return guarded([&] { return run_schedule(); });
  }
  void outer_round() override {
    guarded([&] { run_outer_round(); });
  }
  void finish() override {
    guarded([&] { drain(); });
  }
  void settle() override {
    guarded([&] { settle_in_flight(); });
  }
  void leave() override {
    guarded([&] { leave_group(); });
  }

 private:
  // The schedule's decisions after an inner step.
  bool run_schedule() { return sched_.after_step(*this); }

 public:
  // ------------------------------------------- what a schedule drives
  // (sync/runtime.hpp): the clock, the layout, the reductions and the
  // group's membership, for the schedule's runtime.
  std::size_t position() const { return position_; }
  std::size_t inner_steps() const { return opts_.inner_steps; }
  std::uint64_t rounds() const { return stats_.rounds; }
  typename Outer::options& outer_options() { return opts_.outer; }
  // A warning event; `problem` makes its text (only when a hook listens).
  template <class Problem>
  void warn(Problem&& problem) {
    notify([&] {
      event e = make_event(event_kind::warning);
      e.problem = problem();
      return e;
    });
  }

  // The whole model's round now (sync::blocking). Elastic: a check before
  // (leaves; a peer that died during the inner steps is found here, and the
  // survivors run the round without it) and after (leaves and joins); a
  // failure inside the round aborts it, and the survivors run it again
  // when none of them got past it.
  void run_outer_round() {
    check_member("outer_round");
    bool run = membership_check(where::before_round);
    while (run)
      run = survive(where::in_round, [&] {
              begin(0);
              complete(0);
            }) == survived::run_again;
    membership_check(where::after_round);
  }

 private:
  void drain() {
    check_member("finish");
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      if (!frags_[p]->in_flight) continue;
      if (survive(where::in_round, [&] { complete(p, /*draining=*/true); }) != survived::done) return;
    }
    // A fixed group checks that every rank reached finish() at the same
    // inner step (a rank that took a step more would else leave its peers
    // waiting in a round it never joins). Elastic groups realign their
    // members' clocks when they re-form instead.
    if (!elastic_) check_positions(position_kind::finish, 0);
  }

  void leave_group() {
    check_member("leave");
    if (!elastic_)
      raise<config_error>("leave() needs an elastic communicator (comm::threads over an elastic world, comm::gloo "
                          "with options.elastic); this group cannot change");
    if (position_ % opts_.inner_steps != 0)
      raise<state_error>("leave() is taken at a round end: call it right after a step() whose inner step count is a "
                         "multiple of inner_steps (", opts_.inner_steps, "); this worker is at inner step ",
                         position_);
    drain();
    this->leave_at(delayed ? boundary_kind::round_end : boundary_kind::round_start);
  }

 public:
  void visit_state(state_visitor& v) override {
    v.buffer("theta_global", global_.data(), global_.size(), device);
    if (outer_slots_) v.buffer("outer.slots", outer_state_.data(), outer_state_.size(), device);
    inner_.visit_state(v, "inner");
    v.scalar("rounds", stats_.rounds);
    v.scalar("schedule.position", position_);
    v.scalar("schedule.steps_in_round", steps_in_round_);
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      const std::string name = concat("fragment.", p);
      v.scalar(name + ".outer_steps", frags_[p]->outer_steps);
      if constexpr (!Compressor::lossless) frags_[p]->reducer->visit_state(v, name);
    }
    sched_.visit_state(*this, v);
  }

 private:
  // ------------------------------------------------------- construction
  void set_host_threads() { group::set_host_threads(opts_.host_threads); }

  // theta_global from the replica, and the schedule's buffers from it.
  void init_global_and_schedule() {
    copy_replica_to(global_.data());
    sched_.init(*this);
  }

  // ------------------------------------------------- elastic membership
  // (engine/membership.hpp; these are its hooks.)
  // The group changed (a leave, a join, a recovery): everything that
  // depends on M is planned again.
  void replan() override {
    world_ = comm_.size();
    sched_.on_group(*this);  // eager's default lr follows M
    rank_ = comm_.rank();
    transport_ = transport_type(world_ > 1 ? flat_ + static_cast<std::size_t>(world_) : 0);
    build_reducers();
    set_host_threads();
    stats_.workers = world_;
  }

  // Start-up of an elastic worker: theta_global is the replica, then the
  // members agree and take the state of the member furthest along (rank 0's
  // at a first start, a live member's for a joiner); every rank that was
  // fresh sets its replica to it.
  void elastic_startup() {
    init_global_and_schedule();
    if (world_ == 1)
      if (const std::string bad = non_finite_initial(); !bad.empty())
        raise<numeric_error>("non-finite initial parameters (", bad,
                             "): a replica that starts non-finite would make every round refused");
    fresh_ = true;
    resync_loop(joiner_ ? where::after_round : where::before_round);
    if (world_ > 1 && !joiner_) check_initial_after_broadcast();
    if (joiner_) {
      // Admitted at a round end: under a delayed schedule the members now
      // begin the next reduction, and so does the joiner (its
      // pseudo-gradient is zero).
      if constexpr (delayed) begin_elastic();
    }
  }

  // The replica (and the schedule's state) restart from theta_global.
 public:
  void reset_replica() override {
    replica_from_global();
    sched_.reset(*this);
  }

 private:

  // Drops every reduction in flight: nothing was applied, theta_global and
  // the outer state are as they were, the residuals were not committed,
  // and the local progress stays in the replica (its pseudo-gradient from
  // theta_global includes it next time); the schedule's runtime may restart
  // it (sync::eager: its replica was stepped with the worker's own outer
  // state).
  void abort_in_flight() override {
    bool any = round_open_;
    for (auto& fp : frags_) {
      if (!fp->in_flight) continue;
      any = true;
      fp->reducer->abort();
      fp->in_flight = false;
      fp->completed = false;
      fp->ready = false;
      fp->failure = nullptr;
    }
    if (any) {
      ++stats_.aborted_rounds;
      notify([&] {
        event e = make_event(event_kind::aborted);
        e.round = stats_.rounds + 1;
        // Called while the failure is being handled: name it.
        try {
          if (const auto failure = std::current_exception()) std::rethrow_exception(failure);
        } catch (const std::exception& x) {
          e.problem = x.what();
        } catch (...) {
          e.problem = "unknown failure";
        }
        return e;
      });
    }
    sched_.after_abort(*this);
  }

 public:
  // A delayed schedule's begin at a phase end, retried after a recovery.
  void begin_elastic() {
    while (survive(where::phase_end, [&] { begin(0); }) != survived::done) sched_.after_phase_recovery(*this);
  }

  // Begins fragment p's reduction, its pseudo-gradient taken from where the
  // schedule says (theta_global, or its anchor).
  void begin(std::size_t p) {
    access_replica();
    fragment& f = *frags_[p];
    round_open_ = true;
    f.failure = nullptr;
    set_fault_round(stats_.rounds + 1);
    fault_point("pseudo_gradient");
    check_positions(position_kind::begin, p);
    f.traffic0 = comm_.traffic();
    const auto t0 = clock::now();
    const float* reference = sched_.reference(*this) + f.base;
    if constexpr (Compressor::lossless)
      f.reducer->begin(exec_, comm_, transport_, reference, overlap_);
    else
      f.reducer->begin(exec_, comm_, transport_, reference, f.outer_steps + 1, overlap_);
    f.in_flight = true;
    f.completed = false;
    f.begun = clock::now();
    f.blocked = seconds_between(t0, f.begun);
    sched_.after_begin(*this, p);
  }

  // Waits for fragment p's reduction, accounts for it, and applies it with
  // the schedule's merge (or refuses it, raising on every rank).
  // `draining`: called by finish(), not at the schedule's application step.
  void complete(std::size_t p, bool draining = false) {
    access_replica();
    fragment& f = *frags_[p];
    const auto t0 = clock::now();
    // A ready reduction (a save waited for it) is not waited for again.
    const reduce::verdict v = f.ready ? std::exchange(f.result, {}) : wait_for(f);
    f.ready = false;
    const auto t1 = clock::now();
    f.in_flight = false;
    f.blocked += seconds_between(t0, t1);
    const double hidden = overlap_ ? seconds_between(f.begun, f.completed ? f.completed_at : t0) : 0.0;
    account(p, v, f.blocked, hidden);
    if (!v.accepted) reject(p, v);
    if constexpr (switching) stats_.compression_choices[p] = f.reducer->choice();

    fault_point("apply");
    const auto update = Outer::make_update(opts_.outer, f.outer_steps + 1);
    float* state = outer_slots_ ? outer_state_.data() + f.base : nullptr;
    float* global = global_.data() + f.base;
    sched_.apply(*this, p, draining,
                 [&](const auto& merge) { f.reducer->apply(exec_, update, global, state, flat_, merge); });
    replica_written();
    ++f.outer_steps;
    round_open_ = false;
    sched_.after_apply(*this, draining);
    ++stats_.rounds;
    steps_in_round_ = 0;
    stats_.outer_seconds += seconds_since(t1) + f.blocked;
    notify([&] { return reduction_event(event_kind::round, p, stats_.rounds, f.outer_steps); });
  }

 private:
  // Refuses fragment p's reduction: theta_global, the outer state and any
  // error-feedback residual stay as they were; the fragment's tensors (the
  // whole replica and the schedule's anchor under a delayed schedule)
  // restart from theta_global, nothing stays in flight, and every rank
  // raises (numeric_error for non-finite values, format_error for corrupt
  // bytes).
  [[noreturn]] void reject(std::size_t p, const reduce::verdict& v) {
    const fragment& f = *frags_[p];
    exec_.for_each_chunked(f.list.chunks(), kernels::scatter_tensors{global_.data() + f.base, f.list.ptrs()});
    replica_written();
    sched_.reset(*this);
    steps_in_round_ = 0;
    round_open_ = false;
    ++stats_.rejected_rounds;
    const std::string what = frags_.size() == 1 ? std::string("the replica was")
                                                : concat("fragment ", p, "'s tensors were");
    const auto msg = concat(frags_.size() == 1 ? "" : concat("fragment ", p, " of ", frags_.size(), ": "),
                            "outer round ", f.outer_steps + 1, " rejected: ", v.problem,
                            "; theta_global is unchanged and ", what, " reset to it");
    notify([&] {
      event e = reduction_event(event_kind::rejected, p, stats_.rounds + 1, f.outer_steps + 1);
      e.problem = msg;
      e.corrupt = v.corrupt;
      return e;
    });
    if (v.corrupt) raise<format_error>(msg);
    raise<numeric_error>(msg);
  }

  // Before a reduction begins (position_kind::begin) and at finish(): the
  // ranks compare where they stand (core/agreement.hpp, one all-gather of a
  // 40-byte record, counted in setup_bytes) and all raise state_error when
  // they differ. Under a delayed schedule the round's begin is also where
  // its finiteness is checked, since its reduction completes only a phase
  // later: a replica holding NaN/Inf refuses the round now, on every rank,
  // as reject() refuses it at completion (a norm that overflows only in the
  // pseudo-gradient is still found there).
  void check_positions(position_kind kind, std::size_t p) {
    // The check is a blocking collective, and a communicator need not order
    // it after non-blocking ones still running: those complete first (only
    // sync::streaming with a delay has one then, applied after this same
    // step anyway).
    if (world_ > 1 && overlap_)
      while (std::any_of(frags_.begin(), frags_.end(), [](const auto& f) { return f->in_flight && !f->completed; })) {
        poll_in_flight();
        std::this_thread::yield();
      }
    position_record mine{static_cast<std::uint64_t>(kind), position_, stats_.rounds, p, 0};
    if constexpr (delayed)
      if (kind == position_kind::begin)
        mine.non_finite = static_cast<std::uint64_t>(
            exec_.transform_reduce_chunked(model_list_.chunks(), kernels::non_finite_in{model_list_.ptrs()}));
    const std::vector<position_record> all = this->exchange_positions(mine);
    if (const std::string bad = non_finite_positions(all); !bad.empty()) {
      reduce::verdict v;
      v.accepted = false;
      v.problem = bad;
      reject(p, v);
    }
  }

  options opts_;
  schedule_type sched_;  // the schedule's state and decisions
  optimizer_core<Inner, Space> inner_;
};

}  // namespace detail
}  // namespace diloco
