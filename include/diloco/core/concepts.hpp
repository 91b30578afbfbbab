// SPDX-License-Identifier: Apache-2.0
#pragma once

// The concepts a policy must satisfy. Each algorithm template parameter is
// constrained by one of them, so a type that does not fit is rejected where
// the user names it, with the concept's name in the compiler's message.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/optimizer_role.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

// ---------------------------------------------------------------- tensors
/// A type whose tensor_traits give a contiguous buffer of elements in a known
/// memory space.
template <class T>
concept tensor = requires(std::remove_cvref_t<T>& t) {
  typename tensor_traits_of<T>::value_type;
  typename tensor_traits_of<T>::memory_space;
  { tensor_traits_of<T>::data(t) } -> std::convertible_to<const typename tensor_traits_of<T>::value_type*>;
  { tensor_traits_of<T>::size(t) } -> std::convertible_to<std::size_t>;
} && is_memory_space_v<typename tensor_traits_of<T>::memory_space>;

/// Parameters and gradients are fp32: that is the precision the outer state
/// and the inner optimizers keep.
template <class T>
concept float_tensor = tensor<T> && std::same_as<tensor_value_t<T>, float>;

/// A tensor whose elements can be written (parameters are updated in place):
/// a const std::vector<float> is not one; a tensor_view<float> is, const or
/// not (a view does not own its elements).
template <class T>
concept mutable_float_tensor = float_tensor<T> && requires(std::remove_reference_t<T>& t) {
  { tensor_traits_of<T>::data(t) } -> std::convertible_to<float*>;
};

/// A list of tensors (a model's parameters or gradients).
template <class R>
concept tensor_range = std::ranges::forward_range<R> && float_tensor<std::ranges::range_reference_t<R>>;

/// A list of tensors of any element type (tensor_argument's list form).
template <class R>
concept any_tensor_range = std::ranges::forward_range<R> && tensor<std::ranges::range_reference_t<R>>;
/// A tensor or a list of tensors of any element type: what the parameter and
/// gradient arguments accept, so that the element type and constness are
/// checked by static_asserts that name the rule (tensor/argument_checks.hpp)
/// rather than by a constraint the compiler reports as "not satisfied".
template <class T>
concept tensor_argument = tensor<T> || any_tensor_range<T>;

// ------------------------------------------------------------ optimizers
/// The per-element update of an optimizer: p is the parameter, g its gradient
/// (already scaled by any clipping), s points at the element's first state
/// slot, slot k at s[k * stride]. Trivially copyable so it can be passed by
/// value to a CUDA kernel.
template <class U>
concept update_functor =
    std::is_trivially_copyable_v<U> && requires(const U& u, float& p, float g, float* s, std::size_t stride) {
      { u(p, g, s, stride) };
    };

/// An optimizer policy: an options struct of hyper-parameters with a learning
/// rate `lr` (set_inner_lr / optimizer::set_lr write it), validation that
/// throws config_error, the number of fp32 state slots per parameter, and a
/// factory for the step's update functor of type `update` (step counts from
/// 1). This is everything the library uses of an optimizer: a type that has
/// these compiles.
template <class O>
concept optimizer_policy =
    requires(const typename O::options& o, typename O::options& writable, std::uint64_t step, float lr) {
      typename O::options;
      typename O::update;
      requires update_functor<typename O::update>;
      { O::name } -> std::convertible_to<const char*>;
      { O::validate(o) };
      { O::state_slots(o) } -> std::convertible_to<std::size_t>;
      { O::make_update(o, step) } -> std::convertible_to<typename O::update>;
      { o.lr } -> std::convertible_to<float>;
      writable.lr = lr;
    };

/// A whole-tensor optimizer policy (inner::muon): options with `lr`, `name`,
/// `validate` and `state_slots` as above, but instead of an element functor
/// a `stepper<Space>`: scratch memory and handles for one memory space
/// (default-constructible, movable, no training state) whose
/// step(exec, options, step, tensor_step) updates one whole tensor, with its
/// shape (tensor/tensor_step.hpp). optimizer_core calls it once per tensor
/// after clipping. Its slots live in the same flat buffer as an element-wise
/// policy's, so they are visited and checkpointed the same way.
template <class O>
concept tensor_optimizer_policy = requires(const typename O::options& o, typename O::options& writable, float lr) {
  typename O::options;
  typename O::template stepper<host_space>;
  requires std::default_initializable<typename O::template stepper<host_space>>;
  requires std::movable<typename O::template stepper<host_space>>;
  { O::name } -> std::convertible_to<const char*>;
  { O::validate(o) };
  { O::state_slots(o) } -> std::convertible_to<std::size_t>;
  { o.lr } -> std::convertible_to<float>;
  writable.lr = lr;
};

namespace detail_concepts {
// Which kind of policy O says it is: 2 inner::external (user_steps), 1
// whole-tensor (a stepper), 0 element-wise. The concepts below check O
// against its own kind only, as a conjunction in which the other kinds'
// concepts see a stand-in that satisfies them: a compiler explains the one
// failing requirement of a conjunction (GCC at its default depth), where of
// a disjunction ("no operand is satisfied") it says nothing more.
template <class O>
consteval int policy_kind() {
  if constexpr (requires { O::user_steps; })
    return 2;
  else if constexpr (requires { typename O::template stepper<host_space>; })
    return 1;
  else
    return 0;
}
struct stand_in_options {
  float lr = 0.0f;
};
struct element_stand_in {
  using options = stand_in_options;
  struct update {
    void operator()(float&, float, float*, std::size_t) const {}
  };
  static constexpr const char* name = "";
  static void validate(const options&) {}
  static std::size_t state_slots(const options&) { return 0; }
  static update make_update(const options&, std::uint64_t) { return {}; }
};
struct tensor_stand_in {
  using options = stand_in_options;
  template <class Space>
  struct stepper {};
  static constexpr const char* name = "";
  static void validate(const options&) {}
  static std::size_t state_slots(const options&) { return 0; }
};
struct external_stand_in {
  using options = stand_in_options;
  static constexpr const char* name = "";
  static constexpr bool user_steps = true;
};
// O where its kind is K, else the stand-in.
template <class O, int K, class StandIn>
using as_kind = std::conditional_t<policy_kind<O>() == K, O, StandIn>;
}  // namespace detail_concepts

/// Either kind of optimizer policy: what diloco::optimizer and the inner slot
/// take (checked against the kind O declares, so a missing requirement is
/// named).
template <class O>
concept any_optimizer_policy =
    detail_concepts::policy_kind<O>() != 2 &&
    optimizer_policy<detail_concepts::as_kind<O, 0, detail_concepts::element_stand_in>> &&
    tensor_optimizer_policy<detail_concepts::as_kind<O, 1, detail_concepts::tensor_stand_in>>;

/// An optimizer policy's role (core/optimizer_role.hpp): its `role`, or any.
template <class O>
consteval optimizer_role optimizer_role_of() {
  if constexpr (requires { { O::role } -> std::convertible_to<optimizer_role>; })
    return O::role;
  else
    return optimizer_role::any;
}

/// Wrapper mode's inner "optimizer" (inner::external): the user's own
/// optimizer takes the inner steps; the policy only says so.
template <class O>
concept external_inner = requires {
  typename O::options;
  { O::name } -> std::convertible_to<const char*>;
  requires O::user_steps;
};

/// The optimizer each worker runs on its replica between rounds: element-wise
/// or whole-tensor, or the user's own (inner::external); checked against the
/// kind O declares, so a missing requirement is named.
template <class O>
concept inner_optimizer = optimizer_policy<detail_concepts::as_kind<O, 0, detail_concepts::element_stand_in>> &&
                          tensor_optimizer_policy<detail_concepts::as_kind<O, 1, detail_concepts::tensor_stand_in>> &&
                          external_inner<detail_concepts::as_kind<O, 2, detail_concepts::external_stand_in>>;

/// The optimizer applied to the global parameters with the averaged
/// pseudo-gradient as its gradient.
template <class O>
concept outer_optimizer = optimizer_policy<O>;

/// O in the inner (as_inner) or outer (as_outer) slot, whatever its role:
/// algorithm<inner::adamw, as_outer<inner::adamw>, ...> runs AdamW as the
/// outer optimizer (with AdamW's defaults: set the outer options).
template <optimizer_policy O>
struct as_inner : O {
  static constexpr optimizer_role role = optimizer_role::inner;  ///< the slot it is forced into
};
/// O forced into the outer slot (see as_inner).
template <optimizer_policy O>
struct as_outer : O {
  static constexpr optimizer_role role = optimizer_role::outer;  ///< the slot it is forced into
};

// The compressor concept lives beside its axis: compress/concepts.hpp.

// ---------------------------------------------------------- communicators
/// The handle of a non-blocking collective. wait() blocks until it has
/// completed (rethrowing its error), test() polls. A default-constructed
/// request is complete, and so is one already waited on: wait() returns at
/// once and test() is true.
template <class R>
concept comm_request = std::movable<R> && requires(R& r) {
  { r.wait() };
  { r.test() } -> std::convertible_to<bool>;
};

/// The operations of a communicator over buffers of the given kinds (fp32
/// values, bytes, read-only bytes) that the library calls: fp32 all-reduce
/// (sum or mean) and broadcast; byte all-to-all and all-gather, where
/// compressed payloads travel. traffic() counts this rank's bytes. A
/// communicator with these blocking operations alone runs sync::blocking.
template <class C, class Floats, class Bytes, class ConstBytes>
concept communicator_over = requires(C& c, const C& cc, Floats f, Bytes b, ConstBytes cb, reduce_op op) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.traffic() } -> std::convertible_to<traffic_counters>;
  { c.all_reduce(f, op) };
  { c.broadcast(f, 0) };
  { c.all_to_all(cb, b) };
  { c.all_gather(cb, b) };
};

/// The same operations non-blocking (i-prefixed), each returning a request
/// to wait() on: what the overlapping schedules (sync::streaming,
/// sync::one_step_delay, sync::eager) need to keep a reduction in flight
/// while inner steps run.
template <class C, class Floats, class Bytes, class ConstBytes>
concept async_communicator_over =
    communicator_over<C, Floats, Bytes, ConstBytes> && requires(C& c, Floats f, Bytes b, ConstBytes cb, reduce_op op) {
      typename C::request;
      requires comm_request<typename C::request>;
      { c.iall_reduce(f, op) } -> std::same_as<typename C::request>;
      { c.iall_to_all(cb, b) } -> std::same_as<typename C::request>;
      { c.iall_gather(cb, b) } -> std::same_as<typename C::request>;
    };

/// A member of a group of workers exchanging host buffers (std::span).
template <class C>
concept communicator = communicator_over<C, std::span<float>, std::span<std::byte>, std::span<const std::byte>>;

/// A communicator that takes device memory: the same operations over
/// tensor_view<..., device_space> (NCCL natively; MPI when CUDA-aware or
/// staging through pinned host memory). A communicator may model both.
template <class C>
concept device_communicator = communicator_over<C, tensor_view<float, device_space>, tensor_view<std::byte, device_space>,
                                                tensor_view<const std::byte, device_space>>;


/// A communicator of host memory, of device memory, or of both: the
/// algorithm hands it the buffers of the parameters' space, staging device
/// buffers through host memory when it only takes host memory.
template <class C>
concept any_communicator = communicator<C> || device_communicator<C>;

/// A communicator whose collectives over host buffers also run non-blocking.
template <class C>
concept async_host_communicator =
    async_communicator_over<C, std::span<float>, std::span<std::byte>, std::span<const std::byte>>;
/// A communicator whose collectives over device buffers also run non-blocking.
template <class C>
concept async_device_communicator =
    async_communicator_over<C, tensor_view<float, device_space>, tensor_view<std::byte, device_space>,
                            tensor_view<const std::byte, device_space>>;
/// A communicator whose collectives also run non-blocking, over host
/// buffers (async_host_communicator) or device buffers.
template <class C>
concept async_communicator = async_host_communicator<C> || async_device_communicator<C>;

/// An async host communicator that also runs a caller's task on its progress
/// thread, in issue order, where the task may call its blocking collectives
/// (comm::threads, comm::gloo): `submit(std::function<void()>)` returns the
/// task's request. Over host parameters reduce::staged chains a lossy
/// exchange's collectives and the work between them into one such task, so
/// the exchange advances whenever its data arrives instead of when the
/// training thread next polls.
template <class C>
concept task_communicator = async_host_communicator<C> && requires(C& c, std::function<void()> task) {
  { c.submit(std::move(task)) } -> std::same_as<typename C::request>;
};

/// Where a worker stands when it takes part in a membership check
/// (elastic_communicator::at_boundary).
enum class boundary_kind {
  round_start,  ///< before a round's first collective: leaves only
  round_end,    ///< after a round was applied, nothing in flight: leaves and joins
};

/// A communicator whose group may change while training runs (comm::threads
/// over an elastic world, comm::gloo with options.elastic). The algorithm
/// drives it; users only construct it and call algorithm::leave().
///   elastic()            whether membership may change (a run-time choice);
///   generation()         how many times the group has re-formed;
///   joining(), join()    a worker that is not a member yet: join() blocks
///                        until the running group admits it at a round end
///                        (rank() and size() are valid afterwards);
///   at_boundary(l, k)    collective over the members at a point where no
///                        reduction is in flight: `l` announces that this
///                        worker leaves; true when the group changed (this
///                        worker's rank and size may differ afterwards; a
///                        leaver is no longer a member);
///   recover()            after a comm_error: forms the next generation from
///                        the members still alive; throws comm_error when
///                        this worker was dropped or too few remain.
template <class C>
concept elastic_communicator = requires(C& c, const C& cc, bool leave, boundary_kind k) {
  { cc.elastic() } -> std::convertible_to<bool>;
  { cc.generation() } -> std::convertible_to<std::uint64_t>;
  { c.joining() } -> std::convertible_to<bool>;
  { c.join() };
  { c.at_boundary(leave, k) } -> std::convertible_to<bool>;
  { c.recover() };
};

}  // namespace diloco
