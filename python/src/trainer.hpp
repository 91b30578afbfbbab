// SPDX-License-Identifier: Apache-2.0
#pragma once

// The extension's DiLoCo trainer behind one interface (trainer_base), and
// the explicit grid of compiled policy sets it is chosen from at run time
// (make_trainer). Each schedule's trainers are compiled in their own
// translation unit (trainers_<sync>.cpp); docs/python.md lists the grid.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "any_comm.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/tensor/low_precision.hpp"

namespace diloco::python {

/// Everything the Python constructor takes besides the tensors and the communicator.
struct trainer_config {
  std::string outer = "nesterov";  ///< "nesterov" or "sgd"
  std::string compress = "none";   ///< a key of compressor_names()
  std::string sync = "blocking";   ///< a key of sync_names()
  std::size_t inner_steps = 500;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  float outer_dampening = 0.0f;      ///< outer::sgd only
  float outer_weight_decay = 0.0f;   ///< outer::sgd only
  bool outer_nesterov = false;       ///< outer::sgd only
  std::uint64_t seed = 0;            ///< a lossy codec's rounding seed
  std::size_t fragments = 1;         ///< sync::streaming: P
  std::size_t delay = 0;             ///< sync::streaming: tau
  float alpha = 0.0f;                ///< sync::streaming: mixing factor
  bool broadcast_initial = true;
  int host_threads = 0;
  event_hook on_event{};
};

/// One DiLoCo instance of some compiled policy set, over the user's host
/// tensors (fp32, or bf16 / fp16: a low-precision replica, docs/algorithms.md
/// section 6a).
class trainer_base {
 public:
  virtual ~trainer_base() = default;
  /// Counts an inner step taken by the user's optimizer and runs what the schedule asks for;
  /// true when an outer step was applied.
  virtual bool step() = 0;
  virtual void finish() = 0;
  virtual const diloco::stats& statistics() const = 0;
  virtual std::vector<std::byte> save_bytes() = 0;
  virtual void load_bytes(std::span<const std::byte> bytes) = 0;
  virtual const float* global_data() const = 0;
  virtual std::size_t global_size() const = 0;
  virtual std::size_t global_offset(std::size_t k) const = 0;
  virtual std::size_t tensor_count() const = 0;
  virtual std::size_t steps_in_round() const = 0;
  virtual std::size_t parameter_count() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string policies() const = 0;
};

/// The factory of one compiled policy set over tensors of element type E.
template <class E>
using factory_of =
    std::function<std::unique_ptr<trainer_base>(const trainer_config&, std::vector<std::span<E>>&, any_comm)>;
/// Key: "<outer>|<compress>|<sync>".
template <class E>
using registry_of = std::map<std::string, factory_of<E>>;
using trainer_factory = factory_of<float>;
using trainer_registry = registry_of<float>;

///@{
/// Each schedule's translation unit adds its compiled policy sets; the
/// low-precision one adds the (smaller) grids of bf16 and fp16 tensors.
void register_blocking(trainer_registry& r);
void register_one_step_delay(trainer_registry& r);
void register_streaming(trainer_registry& r);
void register_low_precision(registry_of<bfloat16>& bf16, registry_of<float16>& fp16);
///@}

/// The compiled grid of tensors of element type E (built once).
template <class E>
const registry_of<E>& registry();

///@{
/// The trainer of `config`'s policy set over `params` (std::invalid_argument
/// naming the allowed values when that set is not compiled for that dtype).
std::unique_ptr<trainer_base> make_trainer(const trainer_config& config, std::vector<std::span<float>>& params,
                                           any_comm comm);
std::unique_ptr<trainer_base> make_trainer(const trainer_config& config, std::vector<std::span<bfloat16>>& params,
                                           any_comm comm);
std::unique_ptr<trainer_base> make_trainer(const trainer_config& config, std::vector<std::span<float16>>& params,
                                           any_comm comm);
///@}

}  // namespace diloco::python
