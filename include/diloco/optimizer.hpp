// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::optimizer: an optimizer policy applied on its own to a list of
// tensors, with global-norm clipping, for users who want the fused step
// without DiLoCo (a synchronous data-parallel baseline, a single worker).
// diloco::algorithm runs its inner steps through the same core.

#include "diloco/core/require_cxx20.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/tensor_passes.hpp"
#include "diloco/tensor/argument_checks.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_list.hpp"
#include "diloco/tensor/tensor_step.hpp"

namespace diloco {

namespace detail {

// A gradient as the type-erased layers pass it on.
struct raw_tensor {
  const float* data;
  std::size_t size;
};

template <class Options>
float max_grad_norm_of(const Options& o) {
  if constexpr (requires { o.max_grad_norm; })
    return o.max_grad_norm;
  else
    return 0.0f;
}

// What a whole-tensor policy keeps per memory space besides its slots
// (scratch, handles); nothing for an element-wise one.
struct no_stepper {};
template <class Opt, class Space>
struct stepper_of {
  using type = no_stepper;
};
template <class Opt, class Space>
  requires tensor_optimizer_policy<Opt>
struct stepper_of<Opt, Space> {
  using type = typename Opt::template stepper<Space>;
};

// The state of one optimizer over one parameter set, and its step: clip
// (one reduction over all gradients), then one fused pass over all tensors
// (exec/chunks.hpp: one parallel region on the host, one launch on the GPU),
// or, for a whole-tensor policy, its stepper once per tensor with its shape.
template <class Opt, class Space>
class optimizer_core {
 public:
  optimizer_core() = default;
  optimizer_core(std::size_t total, const typename Opt::options& opts)
      : opts_(opts), slots_(Opt::state_slots(opts)), total_(total), state_(total * slots_) {}

  // `params` must be the same set at every call (its tensor list is made,
  // and on the device uploaded, at the first).
  template <class Exec>
  void step(Exec& exec, const parameter_set<float, Space>& params, std::span<const raw_tensor> grads) {
    if (grads.size() != params.count())
      raise<config_error>(Opt::name, " step: got ", grads.size(), " gradient tensors, expected ", params.count(),
                          " (one per parameter tensor)");
    for (std::size_t k = 0; k < grads.size(); ++k)
      if (grads[k].size != params[k].size())
        raise<config_error>(Opt::name, " step: gradient ", k, " has ", grads[k].size, " elements, parameter ", k,
                            " has ", params[k].size());
    if (list_.count() != params.count()) {
      list_ = tensor_list<Space>(params, exec);
      grads_ = gradient_list<Space>(params.count());
    }
    const float* const* g = grads_.update(exec, [&](std::size_t k) { return grads[k].data; });

    float scale = 1.0f;
    if (const float max_norm = max_grad_norm_of(opts_); max_norm > 0.0f) {
      const double sq = exec.transform_reduce_chunked(list_.chunks(), kernels::squares_of{g});
      // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1.
      const double coef = static_cast<double>(max_norm) / (std::sqrt(sq) + 1e-6);
      scale = static_cast<float>(std::min(coef, 1.0));
    }
    if constexpr (tensor_optimizer_policy<Opt>) {
      ++steps_;
      for (std::size_t k = 0; k < params.count(); ++k)
        stepper_.step(exec, opts_, steps_,
                      tensor_step{params[k].data(), grads[k].data, scale,
                                  slots_ ? state_.data() + params.offset(k) : nullptr, total_, params.shape(k)});
    } else {
      const auto update = Opt::make_update(opts_, ++steps_);
      exec.for_each_chunked(list_.chunks(), kernels::inner_steps<typename Opt::update>{
                                                update, list_.ptrs(), g, scale, slots_ ? state_.data() : nullptr, total_});
    }
  }

  void reset() {
    state_ = buffer<float, Space>(total_ * slots_);
    steps_ = 0;
  }
  // Learning-rate schedules: the next step uses `lr`.
  void set_lr(float lr) {
    auto next = opts_;
    next.lr = lr;
    Opt::validate(next);
    opts_ = next;
  }
  std::uint64_t steps() const { return steps_; }
  const typename Opt::options& settings() const { return opts_; }
  float lr() const { return opts_.lr; }

  // The moments (slot k of parameter i at k * total + i) and the step count.
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    if (slots_) v.buffer(std::string(prefix) + ".slots", state_.data(), state_.size(), !std::is_same_v<Space, host_space>);
    v.scalar(std::string(prefix) + ".steps", steps_);
  }

 private:
  typename Opt::options opts_{};
  std::size_t slots_ = 0;
  std::size_t total_ = 0;
  buffer<float, Space> state_;
  std::uint64_t steps_ = 0;
  tensor_list<Space> list_;
  gradient_list<Space> grads_;
  [[no_unique_address]] typename stepper_of<Opt, Space>::type stepper_;
};

// inner::external (wrapper mode): the user's optimizer takes the inner
// steps on the replica's tensors; the library keeps no inner state and its
// step only checks that no gradients came with it.
template <class Opt, class Space>
  requires external_inner<Opt>
class optimizer_core<Opt, Space> {
 public:
  optimizer_core() = default;
  optimizer_core(std::size_t, const typename Opt::options&) {}
  template <class Exec>
  void step(Exec&, const parameter_set<float, Space>&, std::span<const raw_tensor> grads) {
    if (!grads.empty())
      raise<config_error>("inner::external: the user's optimizer takes the inner steps, and ", grads.size(),
                          " gradient tensors came with this one; call step() without gradients after your "
                          "optimizer's step");
  }
  void reset() {}
  [[noreturn]] void set_lr(float) const {
    raise<config_error>("inner::external: the inner learning rate is your optimizer's (set it there); the library "
                        "takes no inner step");
  }
  [[noreturn]] float lr() const {
    raise<config_error>("inner::external: the inner learning rate is your optimizer's (read it there); the library "
                        "takes no inner step");
  }
  std::uint64_t steps() const { return 0; }
  template <class Visitor>
  void visit_state(Visitor&, std::string_view) {}
};

// The memory space an executor runs in: its `memory_space`, host if it
// names none.
template <class Exec>
struct executor_space {
  using type = host_space;
};
template <class Exec>
  requires requires { typename Exec::memory_space; }
struct executor_space<Exec> {
  using type = typename Exec::memory_space;
};

// The memory space of a tensor, or of the elements of a range of tensors.
template <class T>
struct tensors_space {
  using type = tensor_space_t<std::ranges::range_reference_t<T>>;
};
template <class T>
  requires float_tensor<T>
struct tensors_space<T> {
  using type = tensor_space_t<T>;
};

// Collects a tensor or a range of tensors as raw views into `out`.
template <class Grads>
void collect(Grads&& grads, std::vector<raw_tensor>& out) {
  out.clear();
  if constexpr (float_tensor<Grads>) {
    out.push_back({tensor_data(grads), tensor_size(grads)});
  } else {
    for (auto&& g : grads) out.push_back({tensor_data(g), tensor_size(g)});
  }
}

}  // namespace detail

/// An optimizer policy applied by an executor: optimizer<inner::adamw> opt(params);
/// then opt.step(grads) after each backward pass. The executor fixes the
/// memory space: exec::host (the default) takes host tensors,
/// exec::cuda (<diloco/cuda.hpp>) device tensors, and the whole step runs as
/// fused kernels on the GPU. Tensors of the other space do not compile.
template <any_optimizer_policy Opt, class Exec = exec::host>
class optimizer {
 public:
  using memory_space = typename detail::executor_space<Exec>::type;  ///< host_space or device_space, from the executor

  /// Over `params` (a range of writable fp32 tensors, or one, in the executor's memory space),
  /// with zeroed optimizer state. The tensors must outlive the optimizer and stay where they are.
  template <tensor_argument Params>
  explicit optimizer(Params&& params, typename Opt::options opts = {}, Exec exec = Exec{}) : exec_(std::move(exec)) {
    if constexpr (detail::parameter_tensors_ok<Params>()) {
      static_assert(std::is_same_v<typename detail::tensors_space<Params>::type, memory_space>,
                    "diloco::optimizer: the parameters and the executor are in different memory spaces (host "
                    "tensors run on exec::host, device tensors on exec::cuda from <diloco/cuda.hpp>)");
      Opt::validate(opts);
      if constexpr (float_tensor<Params>) {
        params_ = parameter_set<float, memory_space>(std::span<std::remove_reference_t<Params>>(&params, 1));
      } else {
        params_ = parameter_set<float, memory_space>(params);
      }
      core_ = detail::optimizer_core<Opt, memory_space>(params_.total(), opts);
    }
  }

  /// One step with these gradients (same count and sizes as the parameters): clipping to
  /// options.max_grad_norm if set, then the fused update of every tensor. Throws config_error on
  /// a count or size mismatch.
  template <tensor_argument Grads>
  void step(Grads&& grads) {
    if constexpr (detail::gradient_tensors_ok<Grads>()) {
      static_assert(std::is_same_v<typename detail::tensors_space<Grads>::type, memory_space>,
                    "diloco::optimizer::step: the gradients are not in the parameters' memory space (host and "
                    "device tensors cannot be mixed in one call)");
      detail::collect(std::forward<Grads>(grads), raw_);
      core_.step(exec_, params_, raw_);
    }
  }

  /// Steps taken since construction or reset().
  std::uint64_t steps() const { return core_.steps(); }
  /// Zeroes the optimizer state and the step count.
  void reset() { core_.reset(); }
  /// For learning-rate schedules: the next step uses `lr` (validated).
  void set_lr(float lr) { core_.set_lr(lr); }
  /// The learning rate the next step uses.
  float lr() const { return core_.settings().lr; }
  /// The executor that runs the passes.
  Exec& executor() { return exec_; }

 private:
  parameter_set<float, memory_space> params_;
  detail::optimizer_core<Opt, memory_space> core_;
  Exec exec_;
  std::vector<detail::raw_tensor> raw_;
};

}  // namespace diloco
