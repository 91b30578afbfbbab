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

#include "diloco/compress/compressed_mean.hpp"
#include "diloco/comm/detail/transport.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/outer_apply.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/optimizer.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco {

// Hyper-parameters of one algorithm instance. Algorithmic choices are the
// template's types; numbers live here, with designated-initializer defaults.
template <class Inner, class Outer, class Compressor>
struct algorithm_options {
  std::size_t inner_steps = 500;  // H: inner steps between outer rounds
  typename Inner::options inner{};
  typename Outer::options outer{};
  typename Compressor::options compress{};
  // At construction, rank 0's parameters are broadcast so every replica
  // starts from the same theta_global. Turn off only if the replicas are
  // already identical.
  bool broadcast_initial = true;
  // Host threads per worker for the fused passes; 0 = the cores divided
  // among the workers that share this process.
  int host_threads = 0;
};

namespace detail {

enum class space_id { host, device };
template <class Space>
inline constexpr space_id space_id_v = std::is_same_v<Space, host_space> ? space_id::host : space_id::device;

// The executor that runs passes over memory of a space. The CUDA backend
// adds the device_space specialization (exec/cuda.hpp).
template <class Space>
struct executor_for;
template <>
struct executor_for<host_space> {
  using type = exec::host;
};

template <class Comm>
int workers_on_host(const Comm& c) {
  if constexpr (requires { c.workers_on_host(); })
    return c.workers_on_host();
  else
    return 1;
}

// What the algorithm front end calls; one implementation per memory space,
// instantiated only for the space the user's tensors live in.
struct engine_base {
  virtual ~engine_base() = default;
  virtual space_id space() const = 0;
  virtual void inner_step(std::span<const raw_tensor> grads) = 0;
  virtual void outer_round() = 0;
  virtual void reset_inner_state() = 0;
  virtual void set_inner_lr(float lr) = 0;
  virtual float inner_lr() const = 0;
  virtual const float* global_data() const = 0;
  // The error-feedback residual (flat layout, the parameters' space).
  virtual const float* residual_data() const = 0;
  virtual std::size_t residual_size() const = 0;
  virtual std::size_t parameter_count() const = 0;
  virtual std::size_t flat_size() const = 0;
  virtual std::size_t offset(std::size_t k) const = 0;
  virtual std::size_t tensor_count() const = 0;
  virtual std::size_t steps_in_round() const = 0;
  virtual const diloco::stats& statistics() const = 0;
};

template <class Inner, class Outer, class Compressor, class Comm, class Space>
class engine final : public engine_base {
 public:
  using options = algorithm_options<Inner, Outer, Compressor>;
  using executor = typename executor_for<Space>::type;
  using clock = std::chrono::steady_clock;

  engine(parameter_set<float, Space> params, Comm& comm, const options& opts)
      : comm_(comm),
        opts_(opts),
        params_(std::move(params)),
        world_(comm.size()),
        rank_(comm.rank()),
        transport_(world_ > 1 ? params_.total() + static_cast<std::size_t>(world_) : 0) {
    const std::size_t n = params_.total();
    outer_slots_ = Outer::state_slots(opts_.outer);
    global_ = buffer<float, Space>(n);
    inner_ = optimizer_core<Inner, Space>(n, opts_.inner);
    outer_state_ = buffer<float, Space>(n * outer_slots_);
    // The wire: the pseudo-gradient, then one norm slot per rank. Each rank
    // writes its own norm into its slot and zeros elsewhere, so after the
    // sum every rank knows every rank's norm and all reject a bad round
    // together.
    if constexpr (Compressor::lossless) {
      if (world_ > 1) wire_ = buffer<float, Space>(n + static_cast<std::size_t>(world_));
    } else {
      Compressor::validate(opts_.compress);
      if constexpr (std::is_same_v<Space, host_space>) {
        reducer_ = std::make_unique<reducer_type>(params_, world_, rank_, opts_.compress);
      } else {
        // Device buffers need the executor to upload the layout's tables,
        // and segments travel through the transport (staged or not).
        reducer_ = std::make_unique<reducer_type>(params_, world_, rank_, opts_.compress, exec_);
        if (world_ > 1) transport_.reserve_bytes(static_cast<std::size_t>(world_) * reducer_->slot_bytes());
      }
    }
    if constexpr (requires { exec_.set_threads(1); }) {
      const int cores = executor{}.threads();
      exec_.set_threads(opts_.host_threads > 0 ? opts_.host_threads
                                               : std::max(1, cores / std::max(1, workers_on_host(comm_))));
    }
    if (opts_.broadcast_initial && world_ > 1) {
      const auto traffic0 = comm_.traffic();
      const auto t0 = clock::now();
      for (std::size_t k = 0; k < params_.count(); ++k) {
        auto& p = params_[k];
        transport_.broadcast(comm_, exec_, p.data(), p.size(), 0);
      }
      stats_.comm_seconds += seconds_since(t0);
      add_traffic(traffic0, false);
    }
    copy_local_to_global();
  }

  space_id space() const override { return space_id_v<Space>; }
  const float* global_data() const override { return global_.data(); }
  const float* residual_data() const override {
    if constexpr (Compressor::has_error_feedback)
      return reducer_->residual().data();
    else
      return nullptr;
  }
  std::size_t residual_size() const override {
    if constexpr (Compressor::has_error_feedback)
      return reducer_->residual().size();
    else
      return 0;
  }
  std::size_t parameter_count() const override { return params_.elements(); }
  std::size_t flat_size() const override { return params_.total(); }
  std::size_t offset(std::size_t k) const override { return params_.offset(k); }
  std::size_t tensor_count() const override { return params_.count(); }
  std::size_t steps_in_round() const override { return steps_in_round_; }
  const diloco::stats& statistics() const override { return stats_; }

  void reset_inner_state() override { inner_.reset(); }
  void set_inner_lr(float lr) override { inner_.set_lr(lr); }
  float inner_lr() const override { return inner_.settings().lr; }

  void inner_step(std::span<const raw_tensor> grads) override {
    inner_.step(exec_, params_, grads);
    ++steps_in_round_;
    ++stats_.inner_steps;
  }

  void outer_round() override {
    const auto t_round = clock::now();
    const auto update = Outer::make_update(opts_.outer, stats_.rounds + 1);
    float* state = outer_slots_ ? outer_state_.data() : nullptr;

    if constexpr (!Compressor::lossless)
      compressed_round(update, state);
    else if (world_ == 1)
      local_round(update, state);
    else
      all_reduce_round(update, state);
    stats_.wire_bytes_per_parameter =
        static_cast<double>(stats_.last_round_bytes_sent) / static_cast<double>(params_.elements());
    ++stats_.rounds;
    steps_in_round_ = 0;
    stats_.outer_seconds += seconds_since(t_round);
  }

 private:
  // A world of one, nothing travels: the norm check, then the outer step
  // with the pseudo-gradient computed in the same pass.
  template <class Update>
  void local_round(const Update& update, float* state) {
    const std::size_t n = params_.total();
    double sq = 0.0;
    for (std::size_t k = 0; k < params_.count(); ++k)
      sq += exec_.transform_reduce(params_[k].size(), kernels::pseudo_gradient_sq{global_.data() + params_.offset(k),
                                                                                   params_[k].data()});
    stats_.pseudo_gradient_norm = std::sqrt(sq);
    if (!std::isfinite(stats_.pseudo_gradient_norm))
      reject(concat("non-finite pseudo-gradient from rank 0 (norm ", stats_.pseudo_gradient_norm, ")"), false);
    for (std::size_t k = 0; k < params_.count(); ++k) {
      const std::size_t off = params_.offset(k);
      exec_.for_each(params_[k].size(), kernels::outer_apply_local<typename Outer::update>{
                                            update, global_.data() + off, state ? state + off : nullptr, n,
                                            params_[k].data()});
    }
    stats_.last_round_bytes_sent = stats_.last_round_bytes_received = 0;
    stats_.last_round_comm_seconds = 0.0;
  }

  // fp32 on the wire: pseudo-gradient pass, all-reduce (sum), outer pass.
  template <class Update>
  void all_reduce_round(const Update& update, float* state) {
    const std::size_t n = params_.total();
    double sq = 0.0;
    for (std::size_t k = 0; k < params_.count(); ++k) {
      const std::size_t off = params_.offset(k);
      sq += exec_.transform_reduce(params_[k].size(), kernels::pseudo_gradient{global_.data() + off,
                                                                                params_[k].data(),
                                                                                wire_.data() + off});
    }
    stats_.pseudo_gradient_norm = std::sqrt(sq);
    std::vector<float>& norms = norm_slots_;
    norms.assign(static_cast<std::size_t>(world_), 0.0f);
    norms[static_cast<std::size_t>(rank_)] = static_cast<float>(stats_.pseudo_gradient_norm);
    copy_to_wire_tail(norms);

    const auto traffic0 = comm_.traffic();
    const auto t0 = clock::now();
    transport_.all_reduce(comm_, exec_, wire_.data(), wire_.size(), reduce_op::sum);
    stats_.last_round_comm_seconds = seconds_since(t0);
    stats_.comm_seconds += stats_.last_round_comm_seconds;
    add_traffic(traffic0, true);

    read_wire_tail(norms);
    double total = 0.0;
    std::string bad;
    for (int r = 0; r < world_; ++r) {
      const float v = norms[static_cast<std::size_t>(r)];
      if (!std::isfinite(v)) bad += concat(bad.empty() ? "" : ", ", "rank ", r, " (norm ", v, ")");
      total += v;
    }
    if (bad.empty() && !(total <= std::numeric_limits<float>::max()))
      bad = concat("all ranks together (sum of norms ", total, " overflows fp32)");
    if (!bad.empty()) reject(concat("non-finite pseudo-gradient from ", bad), false);

    const float scale = 1.0f / static_cast<float>(world_);
    for (std::size_t k = 0; k < params_.count(); ++k) {
      const std::size_t off = params_.offset(k);
      exec_.for_each(params_[k].size(), kernels::outer_apply<typename Outer::update>{
                                            update, wire_.data() + off, scale, global_.data() + off,
                                            state ? state + off : nullptr, n, params_[k].data()});
    }
  }

  // A round through the compressed mean (compress/compressed_mean.hpp).
  template <class Update>
  void compressed_round(const Update& update, float* state) {
    const auto traffic0 = comm_.traffic();
    const auto t0 = clock::now();
    const auto res = [&] {
      if constexpr (std::is_same_v<Space, host_space>)
        return reducer_->exchange(exec_, comm_, global_.data(), stats_.rounds + 1);
      else
        return reducer_->exchange(exec_, comm_, transport_, global_.data(), stats_.rounds + 1);
    }();
    stats_.last_round_comm_seconds = seconds_since(t0);
    stats_.comm_seconds += stats_.last_round_comm_seconds;
    add_traffic(traffic0, true);
    stats_.pseudo_gradient_norm = res.delta_norm;
    stats_.compression_error_norm = res.error_norm;
    stats_.encoded_bytes_per_parameter =
        static_cast<double>(res.encoded_bytes) / static_cast<double>(params_.elements());
    if (!res.accepted) reject(res.problem, res.corrupt);
    reducer_->apply(exec_, update, global_.data(), state, params_.total());
  }

  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  void add_traffic(const traffic_counters& before, bool is_round) {
    const auto after = comm_.traffic();
    const std::uint64_t sent = after.bytes_sent - before.bytes_sent;
    const std::uint64_t received = after.bytes_received - before.bytes_received;
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    if (is_round) {
      stats_.last_round_bytes_sent = sent;
      stats_.last_round_bytes_received = received;
    }
  }

  void copy_local_to_global() {
    for (std::size_t k = 0; k < params_.count(); ++k)
      exec_.for_each(params_[k].size(), kernels::copy{params_[k].data(), global_.data() + params_.offset(k)});
  }

  void copy_global_to_local() {
    for (std::size_t k = 0; k < params_.count(); ++k)
      exec_.for_each(params_[k].size(), kernels::copy{global_.data() + params_.offset(k), params_[k].data()});
  }

  // The per-rank norm slots behind the pseudo-gradient on the wire.
  void copy_to_wire_tail(const std::vector<float>& norms) {
    exec_.from_host(wire_.data() + params_.total(), norms.data(), norms.size());
  }
  void read_wire_tail(std::vector<float>& norms) {
    exec_.to_host(norms.data(), wire_.data() + params_.total(), norms.size());
  }

  // Refuses the round: theta_global, the outer state and any error-feedback
  // residual stay as they were, every replica restarts from theta_global,
  // and the caller learns why (numeric_error for non-finite values,
  // format_error for corrupt bytes).
  [[noreturn]] void reject(const std::string& problem, bool corrupt) {
    copy_global_to_local();
    steps_in_round_ = 0;
    ++stats_.rejected_rounds;
    const auto msg = concat("outer round ", stats_.rounds + 1, " rejected: ", problem,
                            "; theta_global is unchanged and the replica was reset to it");
    if (corrupt) raise<format_error>(msg);
    raise<numeric_error>(msg);
  }

  Comm& comm_;
  options opts_;
  parameter_set<float, Space> params_;
  int world_;
  int rank_;
  executor exec_;
  wire_transport<Comm, Space, executor> transport_;
  std::size_t outer_slots_ = 0;
  buffer<float, Space> global_;
  optimizer_core<Inner, Space> inner_;
  buffer<float, Space> outer_state_;
  buffer<float, Space> wire_;
  using reducer_type = std::conditional_t<Compressor::lossless, int, compress::compressed_mean<Compressor, Space>>;
  std::unique_ptr<reducer_type> reducer_;
  std::vector<float> norm_slots_;
  std::size_t steps_in_round_ = 0;
  diloco::stats stats_;
};

}  // namespace detail

// DiLoCo. Every worker constructs one instance over its replica (a list of
// its parameter tensors, or a single tensor) and calls step() with its
// gradients after each backward pass; every `inner_steps` steps the workers
// average their pseudo-gradients and apply the outer optimizer together.
//
// Construction and outer rounds are collective: every rank of the
// communicator must take part. The instance keeps pointers into the user's
// tensors; they must outlive it and must not move.
template <inner_optimizer Inner, outer_optimizer Outer, compressor Compressor, any_communicator Comm>
class algorithm {
 public:
  using inner_type = Inner;
  using outer_type = Outer;
  using compressor_type = Compressor;
  using comm_type = Comm;
  using options = algorithm_options<Inner, Outer, Compressor>;

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
  // the parameters), then an outer round if H inner steps have passed since
  // the last one. Returns true when an outer round ran.
  template <class Grads>
    requires(tensor_range<Grads> || float_tensor<Grads>)
  bool step(Grads&& grads) {
    inner_step(std::forward<Grads>(grads));
    if (engine_->steps_in_round() < opts_.inner_steps) return false;
    engine_->outer_round();
    return true;
  }

  // One inner step only; no outer round, whatever the step count.
  template <class Grads>
    requires(tensor_range<Grads> || float_tensor<Grads>)
  void inner_step(Grads&& grads) {
    if constexpr (float_tensor<Grads>)
      check_space<tensor_space_t<Grads>>();
    else
      check_space<tensor_space_t<std::ranges::range_reference_t<Grads>>>();
    detail::collect(std::forward<Grads>(grads), raw_grads_);
    engine_->inner_step(raw_grads_);
  }

  // An outer round now, whatever the step count (collective). Throws
  // numeric_error, leaving theta_global unchanged, if any worker's
  // pseudo-gradient is not finite.
  void outer_round() { engine_->outer_round(); }

  // Forgets the inner optimizer's state (moments) and step count.
  void reset_inner_state() { engine_->reset_inner_state(); }

  // Learning-rate schedules for the inner optimizer: the next inner step
  // uses `lr` (validated like the option).
  void set_inner_lr(float lr) { engine_->set_inner_lr(lr); }
  float inner_lr() const { return engine_->inner_lr(); }

  const diloco::stats& stats() const { return engine_->statistics(); }
  const options& settings() const { return opts_; }
  std::size_t parameter_count() const { return engine_->parameter_count(); }
  std::size_t steps_in_round() const { return engine_->steps_in_round(); }

  // The error-feedback residual in flat layout (empty without error
  // feedback): part of the algorithm's state. In the parameters' memory
  // space, with the layout of global_parameters().
  template <class Space = host_space>
  tensor_view<const float, Space> compression_residual() const {
    check_space<Space>();
    return {engine_->residual_data(), engine_->residual_size()};
  }

  // theta_global as a flat view (tensor k at global_offset(k)), in the
  // parameters' memory space. Host tensors are packed end to end; device
  // tensors start at multiples of 16 floats, with zero padding between.
  template <class Space = host_space>
  tensor_view<const float, Space> global_parameters() const {
    check_space<Space>();
    return {engine_->global_data(), engine_->flat_size()};
  }
  // Where parameter tensor k starts in global_parameters().
  std::size_t global_offset(std::size_t k) const {
    if (k >= engine_->tensor_count())
      detail::raise<config_error>("global_offset(", k, "): there are ", engine_->tensor_count(), " parameter tensors");
    return engine_->offset(k);
  }

 private:
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
    engine_ = std::make_unique<detail::engine<Inner, Outer, Compressor, Comm, Space>>(std::move(set), comm, opts_);
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
