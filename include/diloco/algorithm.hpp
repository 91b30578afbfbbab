// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::algorithm: DiLoCo assembled from an inner optimizer, an outer
// optimizer, a compressor and a communicator. Each worker owns one instance
// over its own replica (the user's tensors).

#include "diloco/core/require_cxx20.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <istream>
#include <ostream>
#include <sstream>
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
#include "diloco/core/agreement.hpp"
#include "diloco/core/checksum.hpp"
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
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/host_outer_state.hpp"
#include "diloco/tensor/low_precision.hpp"
#include "diloco/sync/blocking.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/delayed.hpp"
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

  /// `params`: a range of writable fp32 tensors, or one; under
  /// inner::external also bf16 or fp16 tensors (diloco::bfloat16,
  /// diloco::float16 in host memory: tensor/low_precision.hpp, the rules in
  /// docs/algorithms.md). Other element types and const tensors fail to
  /// compile, naming the rule.
  template <tensor_argument Params>
  algorithm(Params&& params, Comm& comm, options opts = {}) : opts_(opts) {
    if constexpr (detail::parameter_tensors_ok<Params>()) {
      validate(comm);
      if constexpr (detail::replica_element_tensor<Params>) {
        init(std::span<std::remove_reference_t<Params>>(&params, 1), comm);
      } else {
        init(params, comm);
      }
    }
  }

  /// A device replica (fp32, bf16 or fp16 device tensors, or one) with
  /// theta_global, the outer state and any residual in pinned host memory
  /// (tensor/host_outer_state.hpp): the engine runs on the host over a
  /// mirror of the replica that follows it at each round. inner::external
  /// only; nvcc translation units (diloco/cuda.hpp).
  template <class R>
  algorithm(outer_state_on_host<R> wrapped, Comm& comm, options opts = {}) : opts_(opts) {
    static_assert(external_inner<Inner>,
                  "diloco::algorithm: outer state in host memory (outer_state_on_host) needs inner::external: "
                  "the library's own inner optimizers step the engine's memory, and the engine is on the host");
    using Arg = std::remove_reference_t<R>;
    if constexpr (detail::parameter_tensors_ok<R>()) {
      validate(comm);
      if constexpr (detail::replica_element_tensor<Arg>) {
        init_host_outer(std::span<Arg>(&wrapped.tensors, 1), comm);
      } else {
        init_host_outer(wrapped.tensors, comm);
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
    static_assert(!external_inner<Inner>,
                  "diloco::algorithm::step(grads): with inner::external your own optimizer takes the inner step, so "
                  "call step() without gradients after it");
    if constexpr (detail::gradient_tensors_ok<Grads>()) take_inner_step(std::forward<Grads>(grads));
    return engine_->after_step();
  }

  /// inner::external (wrapper mode): your optimizer has just taken an inner
  /// step on the parameter tensors, in place; this counts it and does what
  /// the schedule asks for after it, as step(grads) does. Returns true when
  /// an outer step was applied (the tensors then hold the merged values).
  bool step() {
    static_assert(external_inner<Inner>,
                  "diloco::algorithm::step(): a step without gradients is for inner::external (your optimizer "
                  "takes the inner step), and with the library's inner optimizer pass this worker's "
                  "gradients: step(grads)");
    if (!mirror_) {
      engine_->inner_step({});
      return engine_->after_step();
    }
    return with_mirror([&] {
      engine_->inner_step({});
      return engine_->after_step();
    });
  }

  /// One inner step only; no outer round, whatever the step count
  /// (sync::blocking: other schedules keep their clock in step()).
  template <tensor_argument Grads>
    requires std::same_as<Sync, sync::blocking>
  void inner_step(Grads&& grads) {
    static_assert(!external_inner<Inner>,
                  "diloco::algorithm::inner_step(grads): with inner::external your own optimizer takes the inner "
                  "step, so call step() without gradients after it");
    if constexpr (detail::gradient_tensors_ok<Grads>()) take_inner_step(std::forward<Grads>(grads));
  }

  /// An outer round now, whatever the step count (collective;
  /// sync::blocking). Throws numeric_error, leaving theta_global unchanged,
  /// if any worker's pseudo-gradient is not finite.
  void outer_round()
    requires std::same_as<Sync, sync::blocking>
  {
    with_mirror([&] { engine_->outer_round(); });
  }

  /// Completes and applies every reduction in flight (collective), so that
  /// theta_global includes the last one: before evaluating
  /// global_parameters(), saving, leaving, and at the end of training. A
  /// no-op under sync::blocking. Training may go on afterwards.
  void finish() {
    with_mirror([&] { engine_->finish(); });
  }

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
  void leave() {
    with_mirror([&] { engine_->leave(); });
  }
  /// How many passes have written the replica so far (merges, resets,
  /// restores): a wrapper that keeps copies of the replica
  /// (diloco::replicated) refreshes them when this moves.
  std::uint64_t replica_writes() const { return engine_->replica_writes(); }
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
  /// buffers), the replica (the parameters), and each reduction in flight,
  /// completed but not applied (its verdict and the result its application
  /// reads), under a header naming the policies, the options (by field),
  /// rank, world size, memory space and sizes. Format and guarantees:
  /// docs/internals.md, "Checkpoints".
  ///
  /// save is collective (every rank calls it at the same step) and changes
  /// nothing in the run: it waits for the reductions in flight to complete
  /// but leaves them to be applied at the schedule's own step, so a run that
  /// saves, and one resumed from the file, end with the bits of a run that
  /// never saved. The file is written to a temporary in the same directory,
  /// fsynced and renamed over `path` (checkpoint/file.hpp): a crash leaves
  /// the previous checkpoint.
  void save(const std::string& path) { checkpoint::write_file(path, save_bytes()); }
  /// save() with your own state in the same file (under inner::external:
  /// your optimizer's; any bytes of yours). `write_user(std::ostream&)`
  /// writes it, e.g. `torch::save(optimizer, out)`; the file is then
  /// written as save() writes it (a temporary, fsync, rename), so the
  /// library's state and yours land together or not at all. load(path,
  /// reader) gives it back.
  template <class WriteUser>
    requires std::invocable<WriteUser&, std::ostream&>
  void save(const std::string& path, WriteUser&& write_user) {
    std::ostringstream out(std::ios::binary);
    write_user(out);
    if (!out) detail::raise<error>("save: the writer of the user's state left its stream failed; nothing was written");
    const std::string text = std::move(out).str();
    std::vector<std::byte> user(text.size());
    if (!text.empty()) std::memcpy(user.data(), text.data(), text.size());
    checkpoint::write_file(path, serialized(checkpoint::scope::worker, &user));
  }
  /// save() to a stream.
  void save(std::ostream& out) { write_stream(out, save_bytes(), "save"); }
  /// The checkpoint as bytes (collective, as save).
  std::vector<std::byte> save_bytes(checkpoint::scope s = checkpoint::scope::worker) { return serialized(s, nullptr); }
  /// The part equal on every rank (theta_global, outer slots and step
  /// counts, rounds, the schedule's clock), once for the run: collective (it
  /// waits for what is in flight as save does; what is in flight is not in
  /// it: call finish() first for a theta_global that includes it); rank 0
  /// writes the file.
  void save_global(const std::string& path) {
    auto bytes = save_bytes(checkpoint::scope::global);
    if (engine_->rank() == 0) checkpoint::write_file(path, bytes);
  }
  /// save_global() to a stream (every rank waits for what is in flight; only rank 0 writes).
  void save_global(std::ostream& out) { write_stream(out, save_bytes(checkpoint::scope::global), "save_global"); }

  /// Restores a worker checkpoint written by save() on the same rank of a
  /// run with the same policies, agreeing options, world size and parameter
  /// sizes (the inner optimizer's options and host_threads may differ).
  /// The whole file is read and verified before the live state is touched:
  /// a corrupt, truncated or mismatched file is a format_error naming the
  /// field or section and what was expected, with the state unchanged.
  ///
  /// load is collective: every rank calls it, each with its own file. Once
  /// each rank has restored its file, the ranks compare what they restored:
  /// the round, the schedule position and a checksum of the state every
  /// rank holds identically (theta_global, the outer state and counters).
  /// When they differ (files of different rounds: a crash while saving can
  /// leave them) every rank raises state_error naming each rank's round, and
  /// when one rank's file fails, that rank raises its error and the others a
  /// state_error naming it; either way every rank's live state is left as
  /// it was before load (it keeps a host copy of its state until the ranks
  /// agree). Raises state_error while a reduction is in flight (load into a
  /// fresh instance, or call finish() first).
  void load(const std::string& path) {
    load_collective([&] { return checkpoint::read_file(path); }, path);
  }
  /// load() of a file written by save(path, writer): once every rank has
  /// restored its file and the ranks agree, `read_user(std::istream&)` reads
  /// your state back (e.g. `torch::load(optimizer, in)`). A file without
  /// your state is a format_error, on every rank, with nothing changed.
  /// load(path) restores such a file's library state alone.
  template <class ReadUser>
    requires std::invocable<ReadUser&, std::istream&>
  void load(const std::string& path, ReadUser&& read_user) {
    std::vector<std::byte> user;
    load_collective([&] { return checkpoint::read_file(path); }, path, &user);
    std::istringstream in(std::string(reinterpret_cast<const char*>(user.data()), user.size()), std::ios::binary);
    read_user(in);
  }
  /// load() from a stream, read to its end (collective, as load(path)).
  void load(std::istream& in) {
    load_collective(
        [&] {
          std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          if (in.bad()) detail::raise<error>("checkpoint: reading the input stream failed");
          std::vector<std::byte> bytes(chars.size());
          if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
          return bytes;
        },
        "input stream");
  }
  /// load() from bytes in memory, as save_bytes() returns them (collective).
  void load(std::span<const std::byte> bytes) {
    load_collective([&] { return bytes; }, "memory");
  }

  /// Saves this rank's checkpoint (save(): collective, durable) as
  /// `<dir>/rank-<r>/round-<n>.ckpt`, where r is the rank and n the rounds
  /// applied when it saves (stats().rounds), creating the folders; then deletes this rank's older `round-<m>.ckpt`
  /// files beyond the newest `keep` (at least 1). Deleting happens only
  /// after the new file is renamed in place and its folder synced, so a
  /// crash at any point leaves at least the previous `keep` files. Returns
  /// the path written. load_latest_common() resumes from such a folder.
  std::string save_round(const std::string& dir, std::size_t keep = 2) {
    if (keep == 0)
      detail::raise<config_error>("save_round: keep must be at least 1 (the checkpoint just written), got 0");
    const std::vector<std::byte> bytes = save_bytes();
    const std::filesystem::path folder = std::filesystem::path(dir) / detail::concat("rank-", engine_->rank());
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) detail::raise<error>("save_round: cannot create the folder ", folder.string(), ": ", ec.message());
    const std::uint64_t round = engine_->statistics().rounds;
    const std::string path = (folder / detail::concat("round-", round, ".ckpt")).string();
    checkpoint::write_file(path, bytes);
    std::vector<std::uint64_t> rounds = checkpoint::saved_rounds(folder);
    std::sort(rounds.begin(), rounds.end(), std::greater<>());
    for (std::size_t i = keep; i < rounds.size(); ++i)
      if (rounds[i] != round)
        // A file that cannot be removed stays; it is older than the ones kept.
        std::filesystem::remove(folder / detail::concat("round-", rounds[i], ".ckpt"), ec);
    return path;
  }

  /// Resumes from the newest round that every rank saved with save_round():
  /// collective. Each rank lists its `<dir>/rank-<r>/round-<n>.ckpt` files,
  /// the ranks exchange the lists, and every rank loads its file of the
  /// largest n that all of them have (load(): verified across ranks).
  /// Returns that round. When no round is common to all ranks, every rank
  /// raises state_error naming each rank's rounds, with its state unchanged.
  /// (A group killed while saving can leave one rank a round ahead: its
  /// newest file is skipped, and save_round's `keep` >= 2 keeps the round
  /// before.)
  std::uint64_t load_latest_common(const std::string& dir) {
    const std::filesystem::path folder = std::filesystem::path(dir) / detail::concat("rank-", engine_->rank());
    const std::vector<std::string> all =
        engine_->exchange_text(checkpoint::detail::rounds_text(checkpoint::saved_rounds(folder)));
    const std::vector<std::uint64_t> common = checkpoint::detail::common_rounds(all);
    if (common.empty()) {
      std::string each;
      for (std::size_t r = 0; r < all.size(); ++r)
        each += detail::concat(r ? "; " : "", "rank ", r, ": ", all[r].empty() ? "none" : all[r]);
      detail::raise<state_error>("load_latest_common: no round has a checkpoint on every rank under ", dir,
                                 " (rounds saved by save_round, per rank: ", each, "); every rank raises this");
    }
    const std::uint64_t round = common.back();
    load((folder / detail::concat("round-", round, ".ckpt")).string());
    return round;
  }

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

  /// Copies theta_global into `targets`: a range of writable fp32 tensors
  /// with the parameters' count and sizes, in their memory space (or one
  /// tensor). What to evaluate or export at the end of training: the replica
  /// (the parameters) is not theta_global between rounds, and under
  /// sync::one_step_delay and sync::eager not even after finish() (it keeps
  /// the progress made since the last reduction began, re-based on the new
  /// theta_global), nor under sync::streaming with alpha > 0. Call finish()
  /// first (state_error while a reduction is in flight, which theta_global
  /// does not include yet); a count or size mismatch is a config_error, with
  /// nothing written. Local, not collective. Targets other than the
  /// parameters leave the run as it is; copying into the parameters
  /// themselves puts theta_global in the model for good (training may go on,
  /// but no longer on the trajectory of a run that did not copy).
  template <tensor_argument Targets>
  void copy_global_to(Targets&& targets) {
    using T = detail::argument_tensor_t<Targets>;
    static_assert(mutable_float_tensor<T>, "diloco::algorithm::copy_global_to: the targets must be writable fp32 "
                                           "tensors, one per parameter tensor");
    if constexpr (mutable_float_tensor<T>) {
      using Space = tensor_space_t<T>;
      check_space<Space>();
      if (engine_->in_flight())
        detail::raise<state_error>("copy_global_to: a reduction is in flight and theta_global does not include it "
                                   "yet; call finish() (collective) first");
      std::vector<tensor_view<float, Space>> views;
      if constexpr (float_tensor<Targets>)
        views.emplace_back(tensor_data(targets), tensor_size(targets));
      else
        for (auto&& t : targets) views.emplace_back(tensor_data(t), tensor_size(t));
      if (views.size() != tensor_elements_.size())
        detail::raise<config_error>("copy_global_to: got ", views.size(), " tensors, expected ",
                                    tensor_elements_.size(), " (one per parameter tensor)");
      for (std::size_t k = 0; k < views.size(); ++k)
        if (views[k].size() != tensor_elements_[k])
          detail::raise<config_error>("copy_global_to: tensor ", k, " has ", views[k].size(),
                                      " elements, parameter tensor ", k, " has ", tensor_elements_[k]);
      // Host memory copies directly; device memory goes through the
      // engine's host copies (the engine_base interface has no device copy),
      // which is fine for a once-per-evaluation call.
      std::vector<float> staged;
      for (std::size_t k = 0; k < views.size(); ++k) {
        const float* src = engine_->global_data() + engine_->offset(k);
        if constexpr (std::is_same_v<Space, host_space>) {
          engine_->to_host(views[k].data(), src, views[k].size());
        } else {
          staged.resize(views[k].size());
          engine_->to_host(staged.data(), src, staged.size());
          engine_->from_host(views[k].data(), staged.data(), staged.size());
        }
      }
    }
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
    // Only a low-precision replica names its element type, so that fp32
    // checkpoints keep their bytes; a file of the other kind is refused.
    if (!replica_element_.empty()) add("replica_element", text(replica_element_.c_str()));
    if (s == checkpoint::scope::worker) {
      add("rank", option_value::of_unsigned(static_cast<std::uint64_t>(engine_->rank())));
      add("world", option_value::of_unsigned(static_cast<std::uint64_t>(engine_->world())));
    }
    add("tensor_count", option_value::of_unsigned(engine_->tensor_count()));
    for (std::size_t k = 0; k < engine_->tensor_count(); ++k)
      add(detail::concat("tensor.", k, ".elements"), option_value::of_unsigned(tensor_elements_[k]));
    add("flat_elements", option_value::of_unsigned(engine_->flat_size()));
    // An option at its default may be absent from the file: one written
    // before the option existed ran as its default does.
    const auto defaults = option_fields(std::remove_cvref_t<decltype(opts_)>{});
    for (option_field& f : option_fields(opts_)) {
      const bool agree = f.agree == agreement::across_ranks;
      if (!agree && s != checkpoint::scope::worker) continue;
      bool at_default = false;
      for (const option_field& d : defaults) at_default = at_default || (d.name == f.name && d.value == f.value);
      out.push_back({{"options." + f.name, std::move(f.value)}, agree, at_default});
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
    if (!replica_element_.empty()) out.push_back({'A', "replica_element", replica_element_});
    out.push_back({'A', "tensor_count", std::to_string(tensor_elements_.size())});
    for (std::size_t k = 0; k < tensor_elements_.size(); ++k)
      out.push_back({'A', detail::concat("tensor.", k, ".elements"), std::to_string(tensor_elements_[k])});
    for (const option_field& f : option_fields(opts_))
      out.push_back({f.agree == agreement::across_ranks ? 'A' : 'R', "options." + f.name, f.value.to_string()});
    return out;
  }

  /// The compressor as the header names it (compress/fingerprint.hpp).
  static std::string compressor_fingerprint() { return compress::fingerprint<Compressor>(); }

  // The checkpoint's bytes once what is in flight has settled; `user`: the
  // user's section (save(path, writer)), or none.
  std::vector<std::byte> serialized(checkpoint::scope s, const std::vector<std::byte>* user) {
    return with_mirror([&] {
      engine_->settle();
      return checkpoint::detail::serialize(*engine_, expected_fields(s), s, user);
    });
  }

  void load_bytes(std::span<const std::byte> bytes, const std::string& source, std::vector<std::byte>* user = nullptr) {
    if (engine_->in_flight())
      detail::raise<state_error>("load: a reduction is in flight; load into a fresh instance, or call finish() "
                                 "(collective) first");
    try {
      checkpoint::detail::restore(*engine_, bytes, expected_fields(checkpoint::scope::worker),
                                  checkpoint::scope::worker, user);
    } catch (const format_error& e) {
      throw format_error(detail::concat(e.what(), " [", source, "]"));
    }
  }

  // load(): each rank reads and restores its bytes (`read`), keeping a copy
  // of its live state first when there are peers to disagree with; then the
  // ranks exchange what they restored (core/agreement.hpp) and all keep it,
  // or all roll back and raise.
  template <class Read>
  void load_collective(Read&& read, const std::string& source, std::vector<std::byte>* user = nullptr) {
    // A low-precision replica follows what was restored (or kept).
    if (mirror_) mirror_->pull();
    struct push_after {
      detail::replica_mirror* m;
      ~push_after() noexcept(false) {
        if (m && std::uncaught_exceptions() == 0) m->push();
      }
    } push{mirror_.get()};
    const bool peers = engine_->world() > 1;
    detail::restore_record mine;
    std::exception_ptr failure;
    std::vector<std::vector<float>> backup;
    std::vector<std::uint64_t> backup_scalars;
    bool restored = false;
    try {
      if (peers && !engine_->in_flight()) copy_state(backup, backup_scalars, false);
      load_bytes(read(), source, user);
      restored = true;
      mine = {true, engine_->statistics().rounds, state_scalar("schedule.position"), shared_checksum(), {}};
    } catch (const std::exception& e) {
      failure = std::current_exception();
      mine.problem = detail::unprefixed(e.what());
    }
    if (!peers) {
      if (failure) std::rethrow_exception(failure);
      return;
    }
    std::vector<detail::restore_record> all;
    try {
      const std::vector<std::string> texts = engine_->exchange_text(detail::restore_text(mine));
      for (std::size_t r = 0; r < texts.size(); ++r)
        all.push_back(detail::parse_restore_text(texts[r], static_cast<int>(r)));
    } catch (...) {
      if (restored) copy_state(backup, backup_scalars, true);
      throw;
    }
    std::string refused;
    for (std::size_t r = 0; r < all.size(); ++r)
      if (!all[r].ok) refused += detail::concat(refused.empty() ? "" : "; ", "rank ", r, ": ", all[r].problem);
    if (refused.empty()) refused = detail::compare_restores(all);
    else
      refused = detail::concat("load: not every rank could restore its checkpoint (", refused,
                               "); every rank keeps the state it had before load()");
    if (refused.empty()) return;
    if (restored) copy_state(backup, backup_scalars, true);
    if (failure) std::rethrow_exception(failure);
    detail::raise<state_error>(refused);
  }

  // Copies every state entry and the replica to host memory (`back`:
  // false), or back into the live state (true), then takes back any
  // reduction the restore put in flight (nothing was before load).
  void copy_state(std::vector<std::vector<float>>& buffers, std::vector<std::uint64_t>& scalars, bool back) {
    if (back) engine_->drop_ready();
    struct copier final : state_visitor {
      detail::engine_base* e;
      std::vector<std::vector<float>>* buffers;
      std::vector<std::uint64_t>* scalars;
      bool back;
      std::size_t b = 0, s = 0;
      void buffer(std::string_view, float* data, std::size_t size, bool device) override {
        if (!back) buffers->emplace_back(size);
        std::vector<float>& keep = (*buffers)[b++];
        if (back)
          device ? e->from_host(data, keep.data(), size) : (void)std::memcpy(data, keep.data(), size * sizeof(float));
        else
          device ? e->to_host(keep.data(), data, size) : (void)std::memcpy(keep.data(), data, size * sizeof(float));
      }
      void scalar(std::string_view, std::uint64_t& value) override {
        if (back)
          value = (*scalars)[s++];
        else
          scalars->push_back(value);
      }
    } c;
    c.e = engine_.get();
    c.buffers = &buffers;
    c.scalars = &scalars;
    c.back = back;
    engine_->visit_state(c);
    engine_->visit_replica(c);
    // The reductions the file held in flight go too: nothing was in flight
    // before load (it refuses otherwise).
    if (back) engine_->drop_ready();
  }

  std::uint64_t state_scalar(std::string_view name) const {
    for (const state_entry& x : state())
      if (x.is_scalar && x.name == name) return x.value;
    return 0;
  }

  // The checksum (core/checksum.hpp) of the entries every rank holds
  // identically (checkpoint::is_global_entry: theta_global, the outer
  // slots, rounds, the schedule's clock, outer step counts), in visit order.
  std::uint64_t shared_checksum() const {
    std::uint64_t sum = 0, bytes = 0;
    std::vector<float> host;
    for (const state_entry& x : state()) {
      if (!checkpoint::is_global_entry(x.name)) continue;
      const std::byte* data = reinterpret_cast<const std::byte*>(&x.value);
      std::size_t n = sizeof x.value;
      if (!x.is_scalar) {
        const float* src = x.data;
        if (x.device) {
          host.resize(x.size);
          engine_->to_host(host.data(), x.data, x.size);
          src = host.data();
        }
        data = reinterpret_cast<const std::byte*>(src);
        n = x.size * sizeof(float);
      }
      // Every entry starts at a fresh word, so its position counts too.
      sum += checksum_words(data, n, (bytes + 7) / 8);
      bytes = (bytes + 7) / 8 * 8 + n;
    }
    return checksum_finish(sum, bytes);
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
    using E = std::remove_const_t<tensor_value_t<std::ranges::range_reference_t<R>>>;
    static_assert(requires { typename detail::executor_for<Space>::type; },
                  "diloco::algorithm: these tensors live in device memory; include <diloco/cuda.hpp> and compile "
                  "with nvcc to use the CUDA backend");
    if constexpr (is_low_precision_v<E>) {
      static_assert(external_inner<Inner>,
                    "diloco::algorithm: bf16 / fp16 parameters (a low-precision replica) need inner::external: "
                    "the library's own inner optimizers update fp32 tensors. Take the inner step with your own "
                    "optimizer (inner::external), or pass fp32 tensors (your optimizer's fp32 master weights)");
      std::vector<tensor_view<E, Space>> views;
      for (auto&& t : params) views.emplace_back(tensor_data(t), tensor_size(t));
      auto mirror = std::make_unique<detail::low_precision_mirror_on<E, Space>>(std::move(views), opts_.host_threads,
                                                                               opts_.device_stream);
      replica_element_ = low_precision_name_v<E>;
      init_engine(mirror->views(), comm);
      attach_mirror(std::move(mirror));
    } else {
      init_engine(params, comm);
    }
  }

  template <class R>
  void init_host_outer(R&& params, Comm& comm) {
    using Space = tensor_space_t<std::ranges::range_reference_t<R>>;
    using E = std::remove_const_t<tensor_value_t<std::ranges::range_reference_t<R>>>;
    static_assert(std::same_as<Space, device_space>,
                  "diloco::algorithm: outer_state_on_host is for device tensors (the outer state of host tensors "
                  "is in host memory already)");
    std::vector<tensor_view<E, device_space>> views;
    for (auto&& t : params) views.emplace_back(tensor_data(t), tensor_size(t));
    auto mirror = std::make_unique<detail::host_outer_mirror<E>>(std::move(views), opts_.device_stream);
    if constexpr (is_low_precision_v<E>) replica_element_ = low_precision_name_v<E>;
    init_engine(mirror->views(), comm);
    attach_mirror(std::move(mirror));
  }

  // The engine runs over a mirror of the user's tensors: it reads them
  // before a call's first replica pass, and they follow each write.
  void attach_mirror(std::unique_ptr<detail::replica_mirror> mirror) {
    mirror_ = std::move(mirror);
    engine_->set_replica_access([m = mirror_.get()] { m->pull(); });
    written_ = engine_->replica_writes();
    mirror_->push();  // an elastic joiner's replica came from theta_global
  }

  template <class R>
  void init_engine(R&& params, Comm& comm) {
    using Space = tensor_space_t<std::ranges::range_reference_t<R>>;
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

  // Runs `f` (an engine call that may read and write the replica) with a
  // low-precision replica's mirror pulled before and pushed after when the
  // engine wrote it, also when `f` throws (a refused round resets the
  // replica, then raises).
  template <class F>
  decltype(auto) with_mirror(F&& f) {
    if (!mirror_) return f();
    engine_->replica_call_begins();  // the mirror reads the user's tensors before the call's first replica pass
    struct push_if_written {
      algorithm* a;
      ~push_if_written() noexcept(false) {
        const std::uint64_t now = a->engine_->replica_writes();
        if (now == a->written_) return;
        a->written_ = now;
        if (std::uncaught_exceptions() == 0)
          a->mirror_->push();
        else
          try {
            a->mirror_->push();
          } catch (...) {  // the error in flight is the one to report
          }
      }
    } push{this};
    return f();
  }

  options opts_;
  std::vector<std::size_t> tensor_elements_;  ///< the parameters' sizes, for checkpoint headers
  std::unique_ptr<detail::replica_mirror> mirror_;  ///< the engine's mirror of the user's tensors (bf16/fp16, host outer state), else null
  std::string replica_element_;                             ///< "bf16" or "fp16" for such a replica, else empty
  std::uint64_t written_ = 0;                               ///< engine_->replica_writes() at the last push
  std::unique_ptr<detail::engine_base> engine_;
  std::vector<detail::raw_tensor> raw_grads_;
};

}  // namespace diloco
