#pragma once

// diloco::algorithm: DiLoCo assembled from an inner optimizer, an outer
// optimizer, a compressor and a communicator. Each worker owns one instance
// over its own replica (the user's tensors).

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/core/state.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/engine.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/optimizer.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/sync/blocking.hpp"
#include "diloco/sync/concepts.hpp"
#include "diloco/sync/eager.hpp"
#include "diloco/sync/merge.hpp"
#include "diloco/sync/one_step_delay.hpp"
#include "diloco/sync/streaming.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco {

// DiLoCo. Every worker constructs one instance over its replica (a list of
// its parameter tensors, or a single tensor) and calls step() with its
// gradients after each backward pass; the schedule (Sync, sync/) decides
// when pseudo-gradients are reduced and the outer step applied: every
// `inner_steps` steps for the whole model by default (sync::blocking),
// fragment by fragment (sync::streaming), or one round late with the
// exchange hidden behind a whole inner phase (sync::one_step_delay,
// sync::eager).
//
// Construction, step() and finish() are collective: every rank of the
// communicator must take part. The instance keeps pointers into the user's
// tensors; they must outlive it and must not move.
template <inner_optimizer Inner, outer_optimizer Outer, compressor Compressor, any_communicator Comm,
          sync::sync_policy Sync = sync::blocking>
class algorithm {
  static_assert(!Sync::overlaps || async_communicator<Comm>,
                "diloco::algorithm: this schedule keeps reductions in flight while inner steps run, so the "
                "communicator must model async_communicator (non-blocking iall_reduce, iall_to_all and "
                "iall_gather returning requests); a communicator with blocking operations only runs "
                "sync::blocking");

 public:
  using inner_type = Inner;
  using outer_type = Outer;
  using compressor_type = Compressor;
  using comm_type = Comm;
  using sync_type = Sync;
  using options = algorithm_options<Inner, Outer, Compressor, Sync>;

  // `params`: a range of fp32 tensors, or one fp32 tensor.
  template <class Params>
    requires(tensor_range<Params> || float_tensor<Params>)
  algorithm(Params&& params, Comm& comm, options opts = {}) : opts_(opts) {
    validate(comm);
    if constexpr (float_tensor<Params>) {
      init(std::span<std::remove_reference_t<Params>>(&params, 1), comm);
    } else {
      init(params, comm);
    }
  }

  algorithm(const algorithm&) = delete;
  algorithm& operator=(const algorithm&) = delete;
  algorithm(algorithm&&) noexcept = default;
  algorithm& operator=(algorithm&&) noexcept = default;

  // One inner step with this worker's gradients (same count and sizes as
  // the parameters), then what the schedule asks for after it: beginning
  // reductions, letting those in flight progress, applying those due.
  // Returns true when an outer step was applied.
  template <class Grads>
    requires(tensor_range<Grads> || float_tensor<Grads>)
  bool step(Grads&& grads) {
    take_inner_step(std::forward<Grads>(grads));
    return engine_->after_step();
  }

  // One inner step only; no outer round, whatever the step count
  // (sync::blocking: other schedules keep their clock in step()).
  template <class Grads>
    requires((tensor_range<Grads> || float_tensor<Grads>) && std::same_as<Sync, sync::blocking>)
  void inner_step(Grads&& grads) {
    take_inner_step(std::forward<Grads>(grads));
  }

  // An outer round now, whatever the step count (collective;
  // sync::blocking). Throws numeric_error, leaving theta_global unchanged,
  // if any worker's pseudo-gradient is not finite.
  void outer_round()
    requires std::same_as<Sync, sync::blocking>
  {
    engine_->outer_round();
  }

  // Completes and applies every reduction in flight (collective), so that
  // theta_global includes the last one: before evaluating
  // global_parameters(), saving, leaving, and at the end of training. A
  // no-op under sync::blocking. Training may go on afterwards.
  void finish() { engine_->finish(); }

  // Forgets the inner optimizer's state (moments) and step count.
  void reset_inner_state() { engine_->reset_inner_state(); }

  // Learning-rate schedules for the inner optimizer: the next inner step
  // uses `lr` (validated like the option).
  void set_inner_lr(float lr) { engine_->set_inner_lr(lr); }
  float inner_lr() const { return engine_->inner_lr(); }

  const diloco::stats& stats() const { return engine_->statistics(); }
  const options& settings() const { return opts_; }
  std::size_t parameter_count() const { return engine_->parameter_count(); }
  // Inner steps since an outer step was last applied.
  std::size_t steps_in_round() const { return engine_->steps_in_round(); }
  // The schedule's fragments (1 but for sync::streaming) and tensor k's.
  std::size_t fragment_count() const { return engine_->fragment_count(); }
  std::size_t fragment_of(std::size_t k) const {
    check_tensor(k, "fragment_of");
    return engine_->fragment_of(k);
  }

  // The algorithm's state, every buffer and counter by name (theta_global,
  // outer and inner optimizer slots and steps, error-feedback residuals,
  // rounds, the schedule's position and buffers), read-only. Buffers stay
  // in their memory space and point into the live state.
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
  // The same walk with write access, for checkpoints and joins.
  void visit_state(state_visitor& v) { engine_->visit_state(v); }

  // The error-feedback residual in flat layout (empty without error
  // feedback, and with several fragments: see state()). In the parameters'
  // memory space, with the layout of global_parameters().
  template <class Space = host_space>
  tensor_view<const float, Space> compression_residual() const {
    check_space<Space>();
    return {engine_->residual_data(), engine_->residual_size()};
  }

  // theta_global as a flat view (tensor k at global_offset(k)), in the
  // parameters' memory space. Host tensors are packed end to end; device
  // tensors start at multiples of 16 floats, with zero padding between.
  // Under sync::streaming tensors are grouped fragment by fragment.
  template <class Space = host_space>
  tensor_view<const float, Space> global_parameters() const {
    check_space<Space>();
    return {engine_->global_data(), engine_->flat_size()};
  }
  // Where parameter tensor k starts in global_parameters().
  std::size_t global_offset(std::size_t k) const {
    check_tensor(k, "global_offset");
    return engine_->offset(k);
  }

 private:
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
    if (comm.size() < 1) detail::raise<config_error>("the communicator has ", comm.size(), " workers; need at least 1");
    if (opts_.host_threads < 0)
      detail::raise<config_error>("host_threads must be >= 0 (0 = automatic), got ", opts_.host_threads);
    Inner::validate(opts_.inner);
    Outer::validate(opts_.outer);
  }

  template <class R>
  void init(R&& params, Comm& comm) {
    using Space = tensor_space_t<std::ranges::range_reference_t<R>>;
    static_assert(mutable_float_tensor<std::ranges::range_reference_t<R>>,
                  "diloco::algorithm: parameters must be writable fp32 tensors (the algorithm updates them in place)");
    static_assert(requires { typename detail::executor_for<Space>::type; },
                  "diloco::algorithm: these tensors live in device memory; include <diloco/cuda.hpp> and compile "
                  "with nvcc to use the CUDA backend");
    parameter_set<float, Space> set(params);
    if (set.elements() == 0) detail::raise<config_error>("the parameter list is empty (0 elements); nothing to train");
    engine_ = std::make_unique<detail::engine<Inner, Outer, Compressor, Comm, Space, Sync>>(std::move(set), comm, opts_);
  }

  template <class Space>
  void check_space() const {
    if (engine_->space() != detail::space_id_v<Space>)
      detail::raise<config_error>("tensors in ", Space::name, " memory passed to an algorithm whose parameters live in ",
                                  engine_->space() == detail::space_id::host ? "host" : "device", " memory");
  }

  options opts_;
  std::unique_ptr<detail::engine_base> engine_;
  std::vector<detail::raw_tensor> raw_grads_;
};

}  // namespace diloco
