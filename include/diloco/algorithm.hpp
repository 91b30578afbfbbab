// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::algorithm: DiLoCo assembled from an inner optimizer, an outer
// optimizer, a compressor and a communicator. Each worker owns one instance
// over its own replica (the user's tensors).

#include "diloco/core/require_cxx20.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <iterator>
#include <limits>
#include <memory>
#include <ostream>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "diloco/checkpoint/file.hpp"
#include "diloco/checkpoint/format.hpp"
#include "diloco/checkpoint/state_io.hpp"
#include "diloco/compress/fingerprint.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/options.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/core/state.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/engine.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/optimizer.hpp"
#include "diloco/tensor/argument_checks.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/sync/blocking.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/eager.hpp"
#include "diloco/sync/merge.hpp"
#include "diloco/sync/one_step_delay.hpp"
#include "diloco/sync/streaming.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco {

/// DiLoCo. Every worker constructs one instance over its replica (a list of
/// its parameter tensors, or a single tensor) and calls step() with its
/// gradients after each backward pass; the schedule (Sync, sync/) decides
/// when pseudo-gradients are reduced and the outer step applied: every
/// `inner_steps` steps for the whole model by default (sync::blocking),
/// fragment by fragment (sync::streaming), or one round late with the
/// exchange hidden behind a whole inner phase (sync::one_step_delay,
/// sync::eager).
///
/// Construction, step() and finish() are collective: every rank of the
/// communicator must take part. The instance keeps pointers into the user's
/// tensors; they must outlive it and must not move.
template <inner_optimizer Inner, outer_optimizer Outer, compressor Compressor, any_communicator Comm,
          sync::sync_policy Sync = sync::blocking>
class algorithm {
  static_assert(optimizer_role_of<Inner>() != optimizer_role::outer,
                "diloco::algorithm<Inner, Outer, ...>: the first argument is the inner optimizer, and this one is an "
                "outer optimizer (role optimizer_role::outer, as outer::nesterov and outer::sgd): are the two "
                "swapped? The order is algorithm<inner::adamw, outer::nesterov, Compressor, Comm>; "
                "diloco::as_inner<O> runs an outer policy as the inner optimizer on purpose");
  static_assert(optimizer_role_of<Outer>() != optimizer_role::inner,
                "diloco::algorithm<Inner, Outer, ...>: the second argument is the outer optimizer, and this one is "
                "an inner optimizer (role optimizer_role::inner, as inner::adamw and inner::sgd, whose defaults are "
                "inner learning rates): are the two swapped? Outer optimizers are outer::nesterov and outer::sgd "
                "(lr 1 by default: model averaging); diloco::as_outer<O> runs an inner policy as the outer "
                "optimizer on purpose");
  static_assert(!Sync::overlaps || async_communicator<Comm>,
                "diloco::algorithm: this schedule keeps reductions in flight while inner steps run, so the "
                "communicator must model async_communicator (non-blocking iall_reduce, iall_to_all and "
                "iall_gather returning requests); a communicator with blocking operations only runs "
                "sync::blocking");

 public:
  ///@{
  /// The policies the algorithm was instantiated with.
  using inner_type = Inner;
  using outer_type = Outer;
  using compressor_type = Compressor;
  using comm_type = Comm;
  using sync_type = Sync;
  ///@}
  /// The options type: algorithm_options of these policies.
  using options = algorithm_options<Inner, Outer, Compressor, Sync>;

  /// `params`: a range of writable fp32 tensors, or one (other element
  /// types and const tensors fail to compile, naming the rule).
  template <tensor_argument Params>
  algorithm(Params&& params, Comm& comm, options opts = {}) : opts_(opts) {
    if constexpr (detail::parameter_tensors_ok<Params>()) {
      validate(comm);
      if constexpr (float_tensor<Params>) {
        init(std::span<std::remove_reference_t<Params>>(&params, 1), comm);
      } else {
        init(params, comm);
      }
    }
  }

  algorithm(const algorithm&) = delete;
  algorithm& operator=(const algorithm&) = delete;
  ///@{
  /// Movable (the state lives behind a pointer, so the user's tensors stay referenced); not
  /// copyable.
  algorithm(algorithm&&) noexcept = default;
  algorithm& operator=(algorithm&&) noexcept = default;
  ///@}

  /// One inner step with this worker's gradients (same count and sizes as
  /// the parameters), then what the schedule asks for after it: beginning
  /// reductions, letting those in flight progress, applying those due.
  /// Returns true when an outer step was applied.
  template <tensor_argument Grads>
  bool step(Grads&& grads) {
    if constexpr (detail::gradient_tensors_ok<Grads>()) take_inner_step(std::forward<Grads>(grads));
    return engine_->after_step();
  }

  /// One inner step only; no outer round, whatever the step count
  /// (sync::blocking: other schedules keep their clock in step()).
  template <tensor_argument Grads>
    requires std::same_as<Sync, sync::blocking>
  void inner_step(Grads&& grads) {
    if constexpr (detail::gradient_tensors_ok<Grads>()) take_inner_step(std::forward<Grads>(grads));
  }

  /// An outer round now, whatever the step count (collective;
  /// sync::blocking). Throws numeric_error, leaving theta_global unchanged,
  /// if any worker's pseudo-gradient is not finite.
  void outer_round()
    requires std::same_as<Sync, sync::blocking>
  {
    engine_->outer_round();
  }

  /// Completes and applies every reduction in flight (collective), so that
  /// theta_global includes the last one: before evaluating
  /// global_parameters(), saving, leaving, and at the end of training. A
  /// no-op under sync::blocking. Training may go on afterwards.
  void finish() { engine_->finish(); }

  /// Elastic membership (a communicator modelling elastic_communicator with
  /// elastic() true: comm::threads over an elastic world, comm::gloo with
  /// options.elastic). This worker leaves the group: call it right after a
  /// step() that ended a round (its inner step count a multiple of
  /// inner_steps). It drains any reduction in flight (as finish()), then
  /// takes part in the members' next membership check, which re-forms the
  /// group without it; the others go on with M - 1. Afterwards left() is
  /// true, global_parameters() keep the last theta_global this worker saw,
  /// and step()/finish() raise state_error. Deaths need no call: the
  /// survivors find them at their next collective and re-form.
  void leave() { engine_->leave(); }
  /// True once leave() has taken this worker out of the group.
  bool left() const { return engine_->left(); }
  ///@{
  /// This worker's rank and the group's size now: fixed for a fixed group,
  /// renumbered when an elastic group re-forms (members keep their order,
  /// joiners come last).
  int rank() const { return engine_->rank(); }
  int world_size() const { return engine_->world(); }
  ///@}

  /// Forgets the inner optimizer's state (moments) and step count.
  void reset_inner_state() { engine_->reset_inner_state(); }

  /// Learning-rate schedules for the inner optimizer: the next inner step
  /// uses `lr` (validated like the option).
  void set_inner_lr(float lr) { engine_->set_inner_lr(lr); }
  /// The learning rate the next inner step uses.
  float inner_lr() const { return engine_->inner_lr(); }

  /// What this instance has done so far (core/stats.hpp): steps, rounds, bytes, times.
  const diloco::stats& stats() const { return engine_->statistics(); }
  /// The per-rank options (the inner optimizer's, host_threads) whose values
  /// differ between ranks, each with its value on every rank: heterogeneous
  /// workers are allowed, and reported here (found at construction).
  const std::vector<per_rank_option>& per_rank_options() const { return engine_->per_rank_options(); }
  /// The options it was constructed with.
  const options& settings() const { return opts_; }
  /// The number of parameters (elements) of the replica.
  std::size_t parameter_count() const { return engine_->parameter_count(); }
  /// Inner steps since an outer step was last applied.
  std::size_t steps_in_round() const { return engine_->steps_in_round(); }
  ///@{
  /// The schedule's fragments (1 but for sync::streaming) and tensor k's.
  std::size_t fragment_count() const { return engine_->fragment_count(); }
  std::size_t fragment_of(std::size_t k) const {
    check_tensor(k, "fragment_of");
    return engine_->fragment_of(k);
  }
  ///@}

  /// The algorithm's state, every buffer and counter by name (theta_global,
  /// outer and inner optimizer slots and steps, error-feedback residuals,
  /// rounds, the schedule's position and buffers), read-only. Buffers stay
  /// in their memory space and point into the live state.
  std::vector<state_entry> state() const {
    struct collector final : state_visitor {
      std::vector<state_entry> out;
      void buffer(std::string_view name, float* data, std::size_t size, bool device) override {
        out.push_back({std::string(name), false, device, data, size, 0});
      }
      void scalar(std::string_view name, std::uint64_t& value) override {
        out.push_back({std::string(name), true, false, nullptr, 0, value});
      }
    } c;
    engine_->visit_state(c);
    return std::move(c.out);
  }
  /// The same walk with write access, for checkpoints and joins.
  void visit_state(state_visitor& v) { engine_->visit_state(v); }

  // ---------------------------------------------------------- checkpoints
  /// A worker checkpoint holds everything this rank needs to resume bit for
  /// bit: every visited state entry (theta_global, outer and inner slots and
  /// step counts, error-feedback residuals, rounds, the schedule's clock and
  /// buffers) and the replica (the parameters), under a header naming the
  /// policies, the options (by field), rank, world size, memory space and
  /// sizes. Format and guarantees: docs/architecture.md, "Checkpoints".
  ///
  /// save is collective (every rank calls it): it first calls finish(), so
  /// no reduction is in flight, then writes this rank's state. The file is
  /// written to a temporary in the same directory, fsynced and renamed over
  /// `path` (checkpoint/file.hpp): a crash leaves the previous checkpoint.
  void save(const std::string& path) { checkpoint::write_file(path, save_bytes()); }
  /// save() to a stream.
  void save(std::ostream& out) { write_stream(out, save_bytes(), "save"); }
  /// The checkpoint as bytes (collective, as save).
  std::vector<std::byte> save_bytes(checkpoint::scope s = checkpoint::scope::worker) {
    finish();
    return checkpoint::detail::serialize(*engine_, expected_fields(s), s);
  }
  /// The part equal on every rank (theta_global, outer slots and step
  /// counts, rounds, the schedule's clock), once for the run: collective (it
  /// drains as save does); rank 0 writes the file, the others only drain.
  void save_global(const std::string& path) {
    auto bytes = save_bytes(checkpoint::scope::global);
    if (engine_->rank() == 0) checkpoint::write_file(path, bytes);
  }
  /// save_global() to a stream (every rank drains; only rank 0 writes).
  void save_global(std::ostream& out) { write_stream(out, save_bytes(checkpoint::scope::global), "save_global"); }

  /// Restores a worker checkpoint written by save() on the same rank of a
  /// run with the same policies, agreeing options, world size and parameter
  /// sizes (the inner optimizer's options and host_threads may differ).
  /// The whole file is read and verified before the live state is touched:
  /// a corrupt, truncated or mismatched file is a format_error naming the
  /// field or section and what was expected, with the state unchanged. Not
  /// collective; raises state_error while a reduction is in flight (load
  /// into a fresh instance, or call finish() first).
  void load(const std::string& path) { load_bytes(checkpoint::read_file(path), path); }
  /// load() from a stream, read to its end.
  void load(std::istream& in) {
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) detail::raise<error>("checkpoint: reading the input stream failed");
    std::vector<std::byte> bytes(chars.size());
    if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
    load_bytes(bytes, "input stream");
  }
  /// load() from bytes in memory (as save_bytes() returns them).
  void load(std::span<const std::byte> bytes) { load_bytes(bytes, "memory"); }

  /// The error-feedback residual in flat layout (empty without error
  /// feedback, and with several fragments: see state()). In the parameters'
  /// memory space, with the layout of global_parameters().
  template <class Space = host_space>
  tensor_view<const float, Space> compression_residual() const {
    check_space<Space>();
    return {engine_->residual_data(), engine_->residual_size()};
  }

  /// theta_global as a flat view (tensor k at global_offset(k)), in the
  /// parameters' memory space. Host tensors are packed end to end; device
  /// tensors start at multiples of 16 floats, with zero padding between.
  /// Under sync::streaming tensors are grouped fragment by fragment.
  template <class Space = host_space>
  tensor_view<const float, Space> global_parameters() const {
    check_space<Space>();
    return {engine_->global_data(), engine_->flat_size()};
  }
  /// Where parameter tensor k starts in global_parameters().
  std::size_t global_offset(std::size_t k) const {
    check_tensor(k, "global_offset");
    return engine_->offset(k);
  }

 private:
  /// The header a checkpoint of this instance carries, and what load checks:
  /// enforced fields must match; per-rank options need only be present.
  std::vector<checkpoint::expected_field> expected_fields(checkpoint::scope s) const {
    std::vector<checkpoint::expected_field> out;
    auto add = [&out](std::string name, option_value v, bool enforce = true) {
      out.push_back({{std::move(name), std::move(v)}, enforce});
    };
    const auto text = [](const char* t) { return option_value::of_text(t); };
    add("scope", text(checkpoint::to_string(s)));
    add("policy.inner", text(Inner::name));
    add("policy.outer", text(Outer::name));
    add("policy.compressor", option_value::of_text(compressor_fingerprint()));
    add("policy.sync", text(Sync::name));
    add("memory_space", text(engine_->space() == detail::space_id::host ? "host" : "device"));
    if (s == checkpoint::scope::worker) {
      add("rank", option_value::of_unsigned(static_cast<std::uint64_t>(engine_->rank())));
      add("world", option_value::of_unsigned(static_cast<std::uint64_t>(engine_->world())));
    }
    add("tensor_count", option_value::of_unsigned(engine_->tensor_count()));
    for (std::size_t k = 0; k < engine_->tensor_count(); ++k)
      add(detail::concat("tensor.", k, ".elements"), option_value::of_unsigned(tensor_elements_[k]));
    add("flat_elements", option_value::of_unsigned(engine_->flat_size()));
    for (option_field& f : option_fields(opts_)) {
      const bool agree = f.agree == agreement::across_ranks;
      if (agree || s == checkpoint::scope::worker) add("options." + f.name, std::move(f.value), agree);
    }
    return out;
  }

  /// What the ranks compare at construction (core/agreement.hpp): the
  /// policies and parameter layout, then every option, tagged must-agree or
  /// per-rank; the memory space is per rank.
  std::vector<detail::agreement_record> agreement_records(detail::space_id space) const {
    std::vector<detail::agreement_record> out;
    out.push_back({'A', "policy.inner", Inner::name});
    out.push_back({'A', "policy.outer", Outer::name});
    out.push_back({'A', "policy.compressor", compressor_fingerprint()});
    out.push_back({'A', "policy.sync", Sync::name});
    // Host and device workers may share a group (the wire is the same).
    out.push_back({'R', "memory_space", space == detail::space_id::host ? "host" : "device"});
    out.push_back({'A', "tensor_count", std::to_string(tensor_elements_.size())});
    for (std::size_t k = 0; k < tensor_elements_.size(); ++k)
      out.push_back({'A', detail::concat("tensor.", k, ".elements"), std::to_string(tensor_elements_[k])});
    for (const option_field& f : option_fields(opts_))
      out.push_back({f.agree == agreement::across_ranks ? 'A' : 'R', "options." + f.name, f.value.to_string()});
    return out;
  }

  /// The compressor as the header names it (compress/fingerprint.hpp).
  static std::string compressor_fingerprint() { return compress::fingerprint<Compressor>(); }

  void load_bytes(std::span<const std::byte> bytes, const std::string& source) {
    if (engine_->in_flight())
      detail::raise<state_error>("load: a reduction is in flight; load into a fresh instance, or call finish() "
                                 "(collective) first");
    try {
      checkpoint::detail::restore(*engine_, bytes, expected_fields(checkpoint::scope::worker),
                                  checkpoint::scope::worker);
    } catch (const format_error& e) {
      throw format_error(detail::concat(e.what(), " [", source, "]"));
    }
  }

  static void write_stream(std::ostream& out, const std::vector<std::byte>& bytes, const char* what) {
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) detail::raise<error>(what, ": writing the checkpoint to the output stream failed");
  }

  template <class Grads>
  void take_inner_step(Grads&& grads) {
    if constexpr (float_tensor<Grads>)
      check_space<tensor_space_t<Grads>>();
    else
      check_space<tensor_space_t<std::ranges::range_reference_t<Grads>>>();
    detail::collect(std::forward<Grads>(grads), raw_grads_);
    engine_->inner_step(raw_grads_);
  }

  void check_tensor(std::size_t k, const char* what) const {
    if (k >= engine_->tensor_count())
      detail::raise<config_error>(what, "(", k, "): there are ", engine_->tensor_count(), " parameter tensors");
  }

  void validate(const Comm& comm) const {
    if (opts_.inner_steps == 0)
      detail::raise<config_error>("inner_steps (H) must be at least 1, got 0");
    bool joining = false;
    if constexpr (elastic_communicator<Comm>) joining = comm.elastic() && comm.joining();
    if (comm.size() < 1 && !joining)
      detail::raise<config_error>("the communicator has ", comm.size(), " workers; need at least 1");
    if (opts_.host_threads < 0)
      detail::raise<config_error>("host_threads must be >= 0 (0 = automatic), got ", opts_.host_threads);
    Inner::validate(opts_.inner);
    Outer::validate(opts_.outer);
  }

  template <class R>
  void init(R&& params, Comm& comm) {
    using Space = tensor_space_t<std::ranges::range_reference_t<R>>;
    static_assert(requires { typename detail::executor_for<Space>::type; },
                  "diloco::algorithm: these tensors live in device memory; include <diloco/cuda.hpp> and compile "
                  "with nvcc to use the CUDA backend");
    parameter_set<float, Space> set(params);
    for (const auto& t : set) tensor_elements_.push_back(t.size());
    if (set.elements() == 0) detail::raise<config_error>("the parameter list is empty (0 elements); nothing to train");
    engine_ = std::make_unique<detail::engine<Inner, Outer, Compressor, Comm, Space, Sync>>(
        std::move(set), comm, opts_, agreement_records(detail::space_id_v<Space>));
  }

  template <class Space>
  void check_space() const {
    if (engine_->space() != detail::space_id_v<Space>)
      detail::raise<config_error>("tensors in ", Space::name, " memory passed to an algorithm whose parameters live in ",
                                  engine_->space() == detail::space_id::host ? "host" : "device", " memory");
  }

  options opts_;
  std::vector<std::size_t> tensor_elements_;  ///< the parameters' sizes, for checkpoint headers
  std::unique_ptr<detail::engine_base> engine_;
  std::vector<detail::raw_tensor> raw_grads_;
};

}  // namespace diloco
