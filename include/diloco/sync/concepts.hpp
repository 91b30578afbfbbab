// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "diloco/core/memory_space.hpp"
#include "diloco/sync/plan.hpp"

namespace diloco::sync {

/// When a schedule's reductions are applied. periodic: fragments reduced at fixed steps of each
/// round (blocking, streaming); delayed: the whole model's round r reduction is applied at the
/// end of round r+1 (one-step delay, eager).
enum class schedule_kind { periodic, delayed };

/// What a synchronisation schedule (the fifth policy of diloco::algorithm)
/// must provide. A schedule decides, after each inner step, which fragments
/// begin a reduction and which apply one; the engine does the work.
///
/// ```
/// options          runtime numbers, designated-initializer defaults
/// name             for messages and experiment rows
/// overlaps         true when a reduction may stay in flight while inner
///                  steps run: the communicator must then model
///                  async_communicator
/// kind             periodic: fragments reduced at fixed steps of each
///                  round (blocking, streaming); delayed: the whole model's
///                  round r reduction is applied at the end of round r+1
///                  (one-step delay, eager)
/// validate(o, H, tensor count)   config_error naming the option and range
/// plan(o, H, sizes)              the fragments and their steps (periodic)
/// runtime<Space, Outer>          one worker's schedule: its state and the
///                                hooks the engine calls (sync/runtime.hpp),
///                                constructed from the options; optional for
///                                a periodic schedule (sync/periodic.hpp)
/// ```
template <class S>
concept sync_policy = requires(const typename S::options& o, std::size_t h, std::span<const std::size_t> sizes) {
  typename S::options;
  { S::name } -> std::convertible_to<const char*>;
  { S::overlaps } -> std::convertible_to<bool>;
  { S::kind } -> std::convertible_to<schedule_kind>;
  { S::validate(o, h, h) };
  { S::plan(o, h, sizes) } -> std::same_as<fragment_plan>;
  requires S::kind == schedule_kind::periodic || requires { typename S::template runtime<host_space, void>; };
};

}  // namespace diloco::sync
