// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::algorithm_options: the numbers of one algorithm instance (the
// policies' option structs, H, and the settings that are not the
// algorithm's math), and visit_options, which names every one of them with
// whether the ranks must agree on it.

#include <cstddef>
#include <string_view>

#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/options.hpp"
#include "diloco/sync/blocking.hpp"

namespace diloco {

/// Hyper-parameters of one algorithm instance. Algorithmic choices are the
/// template's types; numbers live here, with designated-initializer defaults.
template <class Inner, class Outer, class Compressor, class Sync = sync::blocking>
struct algorithm_options {
  std::size_t inner_steps = 500;  ///< H: inner steps between outer rounds
  typename Inner::options inner{};  ///< the inner optimizer's options (may differ per rank)
  typename Outer::options outer{};  ///< the outer optimizer's options
  typename Compressor::options compress{};  ///< the compressor's options
  typename Sync::options sync{};  ///< the schedule's options
  /// At construction, rank 0's parameters are broadcast so every replica
  /// starts from the same theta_global. Turn off only if the replicas are
  /// already identical.
  bool broadcast_initial = true;
  /// Host threads per worker for the fused passes; 0 = the cores divided
  /// among the workers that share this process.
  int host_threads = 0;
  /// Device tensors: the CUDA stream (a cudaStream_t) every pass and copy of
  /// the algorithm runs on; nullptr is the legacy default stream. Work you
  /// queue on that stream before step() (the backward pass that writes the
  /// gradients) runs before the step's, and the step's runs before what you
  /// queue after it; step() returns once its work is queued (it waits only
  /// where the host needs a result: norms, verdicts, staged transfers). With
  /// host tensors it must stay nullptr. Not an option of the algorithm's
  /// math: not agreed across ranks, not in checkpoints.
  void* device_stream = nullptr;
  /// Called with each round summary, rejection, abort and membership change
  /// (core/event.hpp, which also states what happens when it throws).
  /// Empty: silent, and no event is built. Not an option of the algorithm's
  /// math: not visited, not agreed across ranks, not in checkpoints.
  event_hook on_event{};
};

/// Every option by name (core/options.hpp), with whether ranks must agree on
/// it: H, broadcast_initial and the outer, compressor and schedule options
/// must; the inner optimizer's options and host_threads may differ per rank.
template <class Inner, class Outer, class Compressor, class Sync, class F>
void visit_options(const algorithm_options<Inner, Outer, Compressor, Sync>& o, F&& f) {
  auto under = [&f](const char* prefix, agreement a) {
    return [&f, prefix, a](std::string_view name, const auto& value) { f(detail::concat(prefix, name), value, a); };
  };
  f("inner_steps", o.inner_steps, agreement::across_ranks);
  visit_policy_options(o.inner, under("inner.", agreement::per_rank));
  visit_policy_options(o.outer, under("outer.", agreement::across_ranks));
  visit_policy_options(o.compress, under("compress.", agreement::across_ranks));
  visit_policy_options(o.sync, under("sync.", agreement::across_ranks));
  f("broadcast_initial", o.broadcast_initial, agreement::across_ranks);
  f("host_threads", o.host_threads, agreement::per_rank);
}

}  // namespace diloco
