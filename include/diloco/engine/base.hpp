// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::engine_base: what the algorithm front end (algorithm.hpp) and the
// checkpoints (checkpoint/state_io.hpp) call of an engine, behind a small
// virtual interface, so that the front end picks the engine from the
// tensors' memory space at run time and instantiates only that one.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "diloco/core/agreement.hpp"
#include "diloco/core/state.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/exec/executor_for.hpp"
#include "diloco/reduce/ready.hpp"
#include "diloco/optimizer.hpp"

namespace diloco::detail {

// What the algorithm front end calls; one implementation per memory space,
// instantiated only for the space the user's tensors live in.
struct engine_base {
  virtual ~engine_base() = default;
  virtual space_id space() const = 0;
  virtual void inner_step(std::span<const raw_tensor> grads) = 0;
  // The schedule's decisions after a step(); true when a reduction was applied.
  virtual bool after_step() = 0;
  virtual void outer_round() = 0;
  virtual void finish() = 0;
  // Elastic membership: this worker leaves the group (collective with the
  // members' next check); left() afterwards.
  virtual void leave() = 0;
  virtual bool left() const = 0;
  // This worker's rank and the group's size now (they change when an
  // elastic group re-forms).
  virtual int rank() const = 0;
  virtual int world() const = 0;
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
  virtual std::size_t fragment_count() const = 0;
  virtual std::size_t fragment_of(std::size_t k) const = 0;
  virtual const diloco::stats& statistics() const = 0;
  virtual const std::vector<per_rank_option>& per_rank_options() const = 0;
  virtual void visit_state(state_visitor& v) = 0;
  // For checkpoints (checkpoint/): the replica (the user's tensors) as
  // buffers "replica.<k>", whether a reduction is in flight, and copies
  // between the engine's memory space and host memory (its executor's).
  virtual void visit_replica(state_visitor& v) = 0;
  // How many passes have written the replica so far (a low-precision
  // replica's tensors follow its mirror after each: tensor/low_precision.hpp).
  virtual std::uint64_t replica_writes() const = 0;
  // `before` runs once per call (replica_call_begins() starts one), before
  // the first pass of it that reads or writes the replica: a low-precision
  // replica's mirror reads the user's tensors then, and only then.
  virtual void set_replica_access(std::function<void()> before) = 0;
  virtual void replica_call_begins() = 0;
  virtual bool in_flight() const = 0;
  virtual void to_host(float* host, const float* src, std::size_t n) = 0;
  virtual void from_host(float* dst, const float* host, std::size_t n) = 0;
  virtual void to_host(std::byte* host, const std::byte* src, std::size_t n) = 0;
  virtual void from_host(std::byte* dst, const std::byte* host, std::size_t n) = 0;
  // Checkpoints of reductions in flight: settle() (collective) waits for
  // each without applying it, so that it becomes ready (its collectives
  // done, its verdict kept) and is applied at the schedule's own step as if
  // nothing had happened; ready(p) says whether fragment p's is;
  // visit_ready(p) walks what its application reads (the verdict, the
  // reducer's result buffers); set_ready(p), after a restore has written
  // them into an instance with nothing in flight, puts fragment p's
  // reduction back in flight, ready.
  virtual void settle() = 0;
  virtual bool ready(std::size_t p) const = 0;
  virtual void visit_ready(std::size_t p, reduce::ready_visitor& v) = 0;
  virtual void set_ready(std::size_t p) = 0;
  // Takes back what a restore put in flight with set_ready (a load that is
  // rolled back leaves nothing in flight, as before it).
  virtual void drop_ready() = 0;
  // Collective: every rank's text, in rank order (algorithm::load compares
  // what each rank restored with it).
  virtual std::vector<std::string> exchange_text(const std::string& mine) = 0;
};

}  // namespace diloco::detail
