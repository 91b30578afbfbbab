// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::engine_fragments<Compressor, Comm, Space>: the engine's fragments
// and their reductions, everything of the round that depends on the
// compressor, the communicator and the memory space but not on the
// optimizers or the schedule (so one instantiation serves every inner,
// outer and schedule over the same three):
//   layout      the parameters, the fragments of the schedule's plan laid
//               out flat (fragment p at [base_p, base_p + total_p) of
//               theta_global and of every outer slot), theta_global and the
//               outer state;
//   reductions  one reducer per fragment (reduce/select.hpp), polled
//               between inner steps, waited for (settle: a save), accounted
//               (stats, events), carried over when the group is re-planned;
//   replica     the gathers and scatters between the replica's tensors and
//               the flat buffers, the non-finite checks of the start;
// and the engine_base overrides that read them (state sizes, ready results
// of a checkpoint). engine.hpp adds the optimizers, the schedule's runtime
// and the round's begin, complete and refusal on top.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/state.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/engine/group.hpp"
#include "diloco/engine/membership.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/kernels/tensor_passes.hpp"
#include "diloco/reduce/ready.hpp"
#include "diloco/reduce/select.hpp"
#include "diloco/sync/plan.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_list.hpp"

namespace diloco::detail {

template <class Compressor, class Comm, class Space>
class engine_fragments : public engine_membership<Comm, Space> {
  using group = engine_group<Comm, Space>;
  using membership = engine_membership<Comm, Space>;

 public:
  using executor = typename group::executor;
  using clock = std::chrono::steady_clock;
  using reducer_type = reduce::reducer_t<Compressor, Comm, Space, executor>;  // reduce/select.hpp
  static constexpr bool switching = compress::switching_compressor<Compressor>;
  static constexpr bool device = group::device;

 protected:
  using group::comm_;
  using group::world_;
  using group::rank_;
  using group::exec_;
  using group::transport_;
  using group::reserved_bytes_;
  using group::stats_;
  using group::round_open_;
  using group::check_member;
  using group::make_event;
  using group::seconds_between;
  using typename membership::where;
  using membership::elastic_;
  using membership::recoveries_;
  using membership::membership_check;
  using typename membership::survived;
  using membership::survive;

  engine_fragments(parameter_set<float, Space> params, Comm& comm, void* device_stream, event_hook hook)
      : membership(comm, device_stream, params.total(), std::move(hook)), params_(std::move(params)) {}

 public:
  const float* global_data() const override { return global_.data(); }
  const float* residual_data() const override {
    if constexpr (Compressor::has_error_feedback)
      return frags_.size() == 1 ? frags_[0]->reducer->residual().data() : nullptr;
    else
      return nullptr;
  }
  std::size_t residual_size() const override {
    if constexpr (Compressor::has_error_feedback)
      return frags_.size() == 1 ? frags_[0]->reducer->residual().size() : 0;
    else
      return 0;
  }
  std::size_t parameter_count() const override { return params_.elements(); }
  std::size_t flat_size() const override { return flat_; }
  std::size_t offset(std::size_t k) const override { return offsets_[k]; }
  std::size_t tensor_count() const override { return params_.count(); }
  std::size_t fragment_count() const override { return frags_.size(); }
  std::size_t fragment_of(std::size_t k) const override { return fragment_of_[k]; }

  void visit_replica(state_visitor& v) override {
    access_replica();
    for (std::size_t k = 0; k < params_.count(); ++k)
      v.buffer(concat("replica.", k), params_[k].data(), params_[k].size(), device);
  }
  bool in_flight() const override {
    return std::any_of(frags_.begin(), frags_.end(), [](const auto& f) { return f->in_flight; });
  }
  void to_host(float* host, const float* src, std::size_t n) override { exec_.to_host(host, src, n); }
  void from_host(float* dst, const float* host, std::size_t n) override { exec_.from_host(dst, host, n); }
  void to_host(std::byte* host, const std::byte* src, std::size_t n) override { exec_.to_host(host, src, n); }
  void from_host(std::byte* dst, const std::byte* host, std::size_t n) override { exec_.from_host(dst, host, n); }
  bool ready(std::size_t p) const override { return frags_[p]->ready; }
  // Fragment p's ready result under "fragment.<p>.ready.": the verdict, then
  // the reducer's buffers (whether or not it is ready: a restore checks the
  // file against this walk before it writes).
  void visit_ready(std::size_t p, reduce::ready_visitor& v) override {
    fragment& f = *frags_[p];
    const std::string name = concat("fragment.", p, ".ready.");
    reduce::visit_verdict(v, name, f.result);
    f.reducer->visit_ready(v, name);
  }
  void set_ready(std::size_t p) override {
    fragment& f = *frags_[p];
    if (f.in_flight) raise<state_error>("internal: set_ready(", p, ") while fragment ", p, "'s reduction is in flight");
    f.in_flight = f.ready = f.completed = true;
    f.failure = nullptr;
    f.traffic0 = comm_.traffic();
    f.begun = f.completed_at = clock::now();
    f.blocked = 0.0;
    round_open_ = true;
  }
  void drop_ready() override {
    for (auto& fp : frags_) {
      if (!fp->ready) continue;
      fp->in_flight = fp->ready = fp->completed = false;
      fp->result = {};
    }
    round_open_ = in_flight();
  }

  // ------------------------------------------- what a schedule drives
  // (sync/runtime.hpp), the part that is the layout's, the reductions' and
  // the membership's; engine.hpp adds the clock and the outer options.
  const sync::fragment_plan& plan() const { return plan_; }
  bool fragment_in_flight(std::size_t p) const { return frags_[p]->in_flight; }
  std::size_t fragment_base(std::size_t p) const { return frags_[p]->base; }
  std::uint64_t outer_steps(std::size_t p) const { return frags_[p]->outer_steps; }
  float* global() { return global_.data(); }
  float* outer_state() { return outer_state_.data(); }
  std::size_t outer_slots() const { return outer_slots_; }
  int workers() const { return world_; }
  executor& exec() { return exec_; }
  const tensor_list<Space>& replica() const { return model_list_; }
  void copy_replica_to(float* flat) {
    access_replica();
    exec_.for_each_chunked(model_list_.chunks(), kernels::gather_tensors{model_list_.ptrs(), flat});
  }
  void replica_from_global() {
    access_replica();
    exec_.for_each_chunked(model_list_.chunks(), kernels::scatter_tensors{global_.data(), model_list_.ptrs()});
    replica_written();
  }
  // Every pass that writes the replica says so (replica_writes()).
  void replica_written() { ++replica_writes_; }
  std::uint64_t replica_writes() const override { return replica_writes_; }
  // Every pass that reads or writes the replica calls this first.
  void access_replica() {
    if (accessed_) return;
    accessed_ = true;
    if (before_access_) before_access_();
  }
  void set_replica_access(std::function<void()> before) override { before_access_ = std::move(before); }
  void replica_call_begins() override { accessed_ = false; }
  bool elastic() const { return elastic_; }
  std::uint64_t recoveries() const { return recoveries_; }
  bool membership_before_round() { return membership_check(where::before_round); }
  void membership_after_round() { membership_check(where::after_round); }
  // A schedule's reductions under survive(): inside a round, or at a
  // delayed schedule's phase end; whether they finished (a fixed group
  // rethrows a failure; an elastic one re-forms and says false).
  template <class Body>
  bool survive_in_round(Body&& body) {
    return survive(where::in_round, body) == survived::done;
  }
  template <class Body>
  bool survive_at_phase_end(Body&& body) {
    return survive(where::phase_end, body) == survived::done;
  }

  // Lets in-flight reductions make progress (runs the stages whose
  // collectives completed); notes when one has finished.
  void poll_in_flight() {
    if (!overlap_) return;
    for (auto& fp : frags_) {
      fragment& f = *fp;
      if (!f.in_flight || f.completed) continue;
      const auto t0 = clock::now();
      bool done = false;
      try {
        if constexpr (Compressor::lossless)
          done = f.reducer->poll();
        else
          done = f.reducer->poll(exec_, comm_, transport_);
      } catch (const comm_error&) {
        // Elastic: raised where the schedule applies the reduction, a step
        // every member reaches at the same inner step, not here.
        if (!elastic_) throw;
        f.failure = std::current_exception();
        done = true;
      }
      const auto t1 = clock::now();
      f.blocked += seconds_between(t0, t1);
      if (done) {
        f.completed = true;
        f.completed_at = t1;
      }
    }
  }


 protected:
  struct fragment {
    parameter_set<float, Space> params;  // views of its tensors; offsets from `base`
    tensor_list<Space> list;             // the same, for the multi-tensor passes
    std::vector<std::size_t> tensors;    // model indices
    std::size_t base = 0;                // start in the flat buffers
    std::unique_ptr<reducer_type> reducer;
    std::uint64_t outer_steps = 0;  // applied reductions: the outer optimizer's step count
    // The reduction in flight.
    bool in_flight = false;
    bool completed = false;  // poll() found it complete
    bool ready = false;      // settle() waited for it (a save): `result` holds its verdict, not applied yet
    reduce::verdict result;  // the verdict of a ready reduction
    traffic_counters traffic0{};
    clock::time_point begun{}, completed_at{};
    double blocked = 0.0;  // seconds this worker spent on it so far
    std::exception_ptr failure;  // elastic: a collective of it failed (seen by poll)
  };


  // The fragments of `plan`, their flat layout and where each tensor
  // landed; theta_global and `outer_slots` outer slots per element.
  // `overlap`: a reduction stays in flight while inner steps run.
  void lay_out(const sync::fragment_plan& plan, std::size_t outer_slots, bool overlap,
               const typename Compressor::options& compress) {
    plan_ = plan;
    outer_slots_ = outer_slots;
    overlap_ = overlap;
    compress_ = compress;
    offsets_.assign(params_.count(), 0);
    fragment_of_.assign(params_.count(), 0);
    std::size_t base = 0;
    for (std::size_t p = 0; p < plan_.fragments(); ++p) {
      auto f = std::make_unique<fragment>();
      f->tensors = plan_.tensors[p];
      std::vector<matrix_view<float, Space>> views;  // keeps each tensor's shape (low_rank uses it)
      for (std::size_t k : f->tensors)
        views.emplace_back(params_[k].data(), params_.shape(k).rows, params_.shape(k).cols);
      f->params = parameter_set<float, Space>(views);
      f->list = tensor_list<Space>(f->params, exec_);
      f->base = base;
      for (std::size_t j = 0; j < f->tensors.size(); ++j) {
        offsets_[f->tensors[j]] = base + f->params.offset(j);
        fragment_of_[f->tensors[j]] = p;
      }
      base += f->params.total();
      frags_.push_back(std::move(f));
    }
    flat_ = base;
    model_list_ = tensor_list<Space>(params_, exec_, offsets_);
    global_ = buffer<float, Space>(flat_);
    outer_state_ = buffer<float, Space>(flat_ * outer_slots_);
    stats_.fragment_bytes_sent.assign(frags_.size(), 0);
    if constexpr (switching) stats_.compression_choices.assign(frags_.size(), {});
    stats_.workers = world_;
  }

  // Rank 0's parameters to every rank (options.broadcast_initial), counted
  // in the statistics.
  void broadcast_initial() {
    const auto traffic0 = comm_.traffic();
    const auto t0 = clock::now();
    for (std::size_t k = 0; k < params_.count(); ++k) {
      auto& p = params_[k];
      transport_.broadcast(comm_, exec_, p.data(), p.size(), 0);
    }
    stats_.comm_seconds += group::seconds_since(t0);
    const auto after = comm_.traffic();
    stats_.bytes_sent += after.bytes_sent - traffic0.bytes_sent;
    stats_.bytes_received += after.bytes_received - traffic0.bytes_received;
  }

  // One reducer per fragment for the current world and rank. Error-feedback
  // residuals (the only reducer state) carry over from the reducers they
  // replace, so a re-planned group keeps every worker's residual.
  void build_reducers() {
    std::size_t slot_bytes = 0;
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      fragment& f = *frags_[p];
      std::unique_ptr<reducer_type> fresh;
      if constexpr (Compressor::lossless) {
        fresh = std::make_unique<reducer_type>(f.params, f.list, world_, rank_, overlap_);
      } else {
        fresh = std::make_unique<reducer_type>(f.params, world_, rank_, compress_,
                                               static_cast<std::uint32_t>(p), exec_);
        slot_bytes = std::max(slot_bytes, fresh->slot_bytes());
        if (f.reducer) carry_reducer_state(*f.reducer, *fresh, concat("fragment.", p));
      }
      f.reducer = std::move(fresh);
    }
    reserved_bytes_ = 0;
    if (!Compressor::lossless && device && world_ > 1) {
      reserved_bytes_ = static_cast<std::size_t>(world_) * slot_bytes;
      transport_.reserve_bytes(reserved_bytes_);
    }
  }

  template <class Reducer>
  void carry_reducer_state(Reducer& from, Reducer& to, const std::string& prefix) {
    struct collect final : state_visitor {
      std::vector<std::pair<std::string, std::pair<float*, std::size_t>>> out;
      std::vector<std::pair<std::string, std::uint64_t*>> scalars;
      void buffer(std::string_view name, float* data, std::size_t size, bool) override {
        out.push_back({std::string(name), {data, size}});
      }
      void scalar(std::string_view name, std::uint64_t& value) override { scalars.push_back({std::string(name), &value}); }
    } a, b;
    from.visit_state(a, prefix);
    to.visit_state(b, prefix);
    for (std::size_t i = 0; i < a.out.size() && i < b.out.size(); ++i)
      if (a.out[i].first == b.out[i].first && a.out[i].second.second == b.out[i].second.second)
        exec_.for_each(a.out[i].second.second, kernels::copy{a.out[i].second.first, b.out[i].second.first});
    for (std::size_t i = 0; i < a.scalars.size() && i < b.scalars.size(); ++i)
      if (a.scalars[i].first == b.scalars[i].first) *b.scalars[i].second = *a.scalars[i].second;
  }

  void check_initial_after_broadcast() {
    // Every rank now holds rank 0's values: every rank finds the same.
    const std::string bad = non_finite_initial();
    if (!bad.empty())
      raise<numeric_error>("non-finite initial parameters after the broadcast from rank 0 (", bad,
                           "); every rank raises this, since a replica that starts non-finite would make every "
                           "round refused");
  }

  // Waits for every reduction in flight without applying it (save): each
  // becomes ready, its verdict kept, and complete() applies it at the
  // schedule's step with the inputs it would have had. The waits give the
  // same bits whenever they run (the stages read only what begin() wrote).
  // Elastic: a failure aborts what is in flight and re-forms, as in drain().
  void settle_in_flight() {
    check_member("save");
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      fragment& f = *frags_[p];
      if (!f.in_flight || f.ready) continue;
      const auto t0 = clock::now();
      if (survive(where::in_round, [&] { f.result = wait_for(f); }) != survived::done) return;
      const auto t1 = clock::now();
      f.blocked += seconds_between(t0, t1);
      f.ready = true;
      if (!f.completed) f.completed_at = t1;
      f.completed = true;
    }
  }

  // Completes fragment f's reduction (its collectives, then the verdict,
  // the same on every rank); rethrows a failure poll() kept.
  reduce::verdict wait_for(fragment& f) {
    if (f.failure) std::rethrow_exception(f.failure);
    if constexpr (Compressor::lossless)
      return f.reducer->wait(exec_);
    else
      return f.reducer->wait(exec_, comm_, transport_);
  }

  void account(std::size_t p, const reduce::verdict& v, double blocked, double hidden) {
    const fragment& f = *frags_[p];
    const auto after = comm_.traffic();
    const std::uint64_t sent = after.bytes_sent - f.traffic0.bytes_sent;
    const std::uint64_t received = after.bytes_received - f.traffic0.bytes_received;
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    stats_.last_round_bytes_sent = sent;
    stats_.last_round_bytes_received = received;
    stats_.fragment_bytes_sent[p] += sent;
    stats_.last_round_comm_seconds = blocked;
    stats_.comm_seconds += blocked;
    stats_.last_round_blocked_seconds = blocked;
    stats_.blocked_seconds += blocked;
    stats_.last_round_hidden_seconds = hidden;
    stats_.hidden_seconds += hidden;
    stats_.pseudo_gradient_norm = v.delta_norm;
    if constexpr (!Compressor::lossless) {
      stats_.compression_error_norm = v.error_norm;
      stats_.encoded_bytes_per_parameter =
          static_cast<double>(v.encoded_bytes) / static_cast<double>(f.params.elements());
    }
    stats_.wire_bytes_per_parameter = static_cast<double>(sent) / static_cast<double>(params_.elements());
  }

  // Where the first non-finite parameter is ("tensor k index i is nan"), or
  // empty. One counting pass over all tensors; when it finds any, the
  // tensors are searched one by one (copied to the host to name the index).
  std::string non_finite_initial() {
    access_replica();
    if (exec_.transform_reduce_chunked(model_list_.chunks(), kernels::non_finite_in{model_list_.ptrs()}) == 0.0)
      return {};
    for (std::size_t k = 0; k < params_.count(); ++k) {
      const auto& t = params_[k];
      if (exec_.transform_reduce(t.size(), kernels::count_non_finite{t.data()}) == 0.0) continue;
      std::vector<float> host(t.size());
      exec_.to_host(host.data(), t.data(), t.size());
      for (std::size_t i = 0; i < host.size(); ++i)
        if (!std::isfinite(host[i]))
          return concat("tensor ", k, " index ", i, " is ", std::isnan(host[i]) ? "nan" : host[i] > 0 ? "inf" : "-inf");
    }
    return {};
  }

  // Fragment p's reduction, as account() left it in stats_.
  event reduction_event(event_kind k, std::size_t p, std::uint64_t round, std::uint64_t fragment_round) const {
    event e = make_event(k);
    e.round = round;
    e.fragment = p;
    e.fragment_round = fragment_round;
    e.bytes_sent = stats_.last_round_bytes_sent;
    e.bytes_received = stats_.last_round_bytes_received;
    e.pseudo_gradient_norm = stats_.pseudo_gradient_norm;
    if constexpr (!Compressor::lossless) e.compression_error_norm = stats_.compression_error_norm;
    e.blocked_seconds = stats_.last_round_blocked_seconds;
    e.hidden_seconds = stats_.last_round_hidden_seconds;
    if constexpr (switching)
      if (k == event_kind::round) e.compression = stats_.compression_choices[p];
    return e;
  }

  parameter_set<float, Space> params_;
  sync::fragment_plan plan_;
  std::vector<std::unique_ptr<fragment>> frags_;
  std::vector<std::size_t> offsets_;      // tensor k's start in the flat buffers
  tensor_list<Space> model_list_;         // every tensor at offsets_, for the multi-tensor passes
  std::uint64_t replica_writes_ = 0;      // passes that wrote the replica
  std::function<void()> before_access_;   // set_replica_access()
  bool accessed_ = false;                 // before_access_ ran in this call
  std::vector<std::size_t> fragment_of_;  // tensor k's fragment
  std::size_t flat_ = 0;
  std::size_t outer_slots_ = 0;
  bool overlap_ = false;
  buffer<float, Space> global_;
  buffer<float, Space> outer_state_;
  typename Compressor::options compress_{};
};

}  // namespace diloco::detail
