// SPDX-License-Identifier: Apache-2.0
#pragma once

// trainer_impl<Outer, Compressor, Sync>: diloco::algorithm over any_comm,
// behind trainer_base. Included by the trainers_<sync>.cpp files only (each
// instantiation costs tens of seconds of compile time).

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "diloco/diloco.hpp"
#include "trainer.hpp"

namespace diloco::python {

// The inner optimizer slot: the user's (torch.optim, ...) takes the inner
// steps on the tensors in place; step() counts and runs the schedule.
using py_inner = inner::external;

template <class Outer>
typename Outer::options outer_options(const trainer_config& c) {
  typename Outer::options o{};
  o.lr = c.outer_lr;
  o.momentum = c.outer_momentum;
  if constexpr (std::is_same_v<Outer, outer::sgd>) {
    o.dampening = c.outer_dampening;
    o.weight_decay = c.outer_weight_decay;
    o.nesterov = c.outer_nesterov;
  }
  return o;
}

template <class Outer, class Compressor, class Sync, class E = float>
class trainer_impl final : public trainer_base {
  using algo = algorithm<py_inner, Outer, Compressor, any_comm, Sync>;

 public:
  trainer_impl(const trainer_config& c, std::vector<std::span<E>>& params, any_comm comm)
      : comm_(std::move(comm)), algo_(params, comm_, make_options(c)), tensors_(params.size()) {}

  bool step() override { return algo_.step(); }
  void finish() override { algo_.finish(); }
  const diloco::stats& statistics() const override { return algo_.stats(); }
  std::vector<std::byte> save_bytes() override { return algo_.save_bytes(); }
  void load_bytes(std::span<const std::byte> bytes) override { algo_.load(bytes); }
  const float* global_data() const override { return algo_.global_parameters().data(); }
  std::size_t global_size() const override { return algo_.global_parameters().size(); }
  std::size_t global_offset(std::size_t k) const override { return algo_.global_offset(k); }
  std::size_t tensor_count() const override { return tensors_; }
  std::size_t steps_in_round() const override { return algo_.steps_in_round(); }
  std::size_t parameter_count() const override { return algo_.parameter_count(); }
  int rank() const override { return algo_.rank(); }
  int world_size() const override { return algo_.world_size(); }
  std::string policies() const override {
    std::string out = std::string(Outer::name) + ", " + compress::fingerprint<Compressor>() + ", " + Sync::name;
    if constexpr (is_low_precision_v<E>) out += std::string(", ") + low_precision_name_v<E> + " replica";
    return out;
  }

 private:
  static typename algo::options make_options(const trainer_config& c) {
    typename algo::options o{};
    o.inner_steps = c.inner_steps;
    o.outer = outer_options<Outer>(c);
    if constexpr (requires { o.compress.seed; }) o.compress.seed = c.seed;
    if constexpr (std::is_same_v<Sync, sync::streaming>) {
      o.sync.fragments = c.fragments;
      o.sync.delay = c.delay;
      o.sync.alpha = c.alpha;
    }
    o.broadcast_initial = c.broadcast_initial;
    o.host_threads = c.host_threads;
    o.on_event = c.on_event;
    return o;
  }

  any_comm comm_;  // before algo_: the algorithm keeps a reference to it
  algo algo_;
  std::size_t tensors_;
};

/// Adds the trainer of one policy set over tensors of element type E.
template <class Outer, class Compressor, class Sync, class E>
void add_trainer(registry_of<E>& r, const std::string& key) {
  r[key] = [](const trainer_config& c, std::vector<std::span<E>>& params, any_comm comm) {
    return std::unique_ptr<trainer_base>(new trainer_impl<Outer, Compressor, Sync, E>(c, params, std::move(comm)));
  };
}

/// Adds the trainers of one schedule: outer {nesterov, sgd} x the compressors below.
template <class Sync>
void register_sync(trainer_registry& r, const std::string& sync_name) {
  auto add = [&]<class Outer, class Compressor>(const char* outer, const char* comp) {
    r[std::string(outer) + "|" + comp + "|" + sync_name] = [](const trainer_config& c,
                                                                std::vector<std::span<float>>& params, any_comm comm) {
      return std::unique_ptr<trainer_base>(new trainer_impl<Outer, Compressor, Sync>(c, params, std::move(comm)));
    };
  };
  using int8_ef = compress::error_feedback<compress::blockwise<int8>>;
  using int4_ef = compress::error_feedback<compress::blockwise<int4>>;
  add.template operator()<outer::nesterov, compress::none>("nesterov", "none");
  add.template operator()<outer::sgd, compress::none>("sgd", "none");
  add.template operator()<outer::nesterov, int8_ef>("nesterov", "int8+ef");
  add.template operator()<outer::nesterov, int4_ef>("nesterov", "int4+ef");
}

}  // namespace diloco::python
