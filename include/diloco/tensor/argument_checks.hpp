// SPDX-License-Identifier: Apache-2.0
#pragma once

// The rules for the tensors passed as parameters and gradients, each a
// static_assert that names the rule where it is broken (a concept could only
// say which constraint failed). The functions return whether every rule
// holds, so a caller compiles its body under `if constexpr` and a broken
// rule gives one message, not a cascade from deeper code.

#include <concepts>
#include <ranges>
#include <type_traits>

#include "diloco/core/concepts.hpp"
#include "diloco/tensor/low_precision.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco::detail {

/// Whether T is one tensor whose elements a replica may have: fp32, or bf16 /
/// fp16 (tensor/low_precision.hpp).
template <class T>
concept replica_element_tensor =
    tensor<T> && (std::same_as<tensor_value_t<T>, float> || is_low_precision_v<tensor_value_t<T>>);

// The tensor type of a tensor argument: itself when it is one tensor of a
// replica element type, a list's elements when it is a list of tensors
// (std::vector<T> is a tensor whatever T, so a list of vectors is one too),
// else itself.
template <class T>
struct argument_tensor {
  using type = T;
};
template <class T>
  requires(!replica_element_tensor<T> && any_tensor_range<T>)
struct argument_tensor<T> {
  using type = std::ranges::range_reference_t<T>;
};
template <class T>
using argument_tensor_t = typename argument_tensor<T>::type;

// Whether a range keeps its elements inside itself, so that they die with it:
// a container (std::vector, std::array, std::deque), not a view or a borrowed
// range such as std::span, whose elements live elsewhere. An owning_view
// (views::all of an rvalue container) is a view that owns its container.
template <class R>
inline constexpr bool is_owning_view_v = false;
template <class R>
inline constexpr bool is_owning_view_v<std::ranges::owning_view<R>> = true;
template <class R>
inline constexpr bool range_owns_elements_v =
    !std::ranges::borrowed_range<R> && (!std::ranges::view<std::remove_cvref_t<R>> ||
                                        is_owning_view_v<std::remove_cvref_t<R>>);

// The parameters outlive the call: the algorithm and the optimizer keep
// pointers into them (parameter_set). Params is a forwarding reference's
// deduced type, an lvalue reference exactly when the argument is an lvalue.
// A temporary that owns its elements (a std::vector<float> rvalue, or a
// container of such tensors) frees them when the constructor returns; a
// temporary that shares storage (a span, a view, a torch::Tensor handle, a
// list of views) leaves them where they are. A range that yields owning
// tensors by value (a transform making copies) dangles even as an lvalue.
template <class Params>
consteval bool parameters_outlive_call() {
  constexpr bool rvalue = !std::is_lvalue_reference_v<Params>;
  if constexpr (replica_element_tensor<Params>) {
    return !(rvalue && tensor_owns_storage_v<Params>);
  } else {
    using Ref = std::ranges::range_reference_t<Params>;
    if constexpr (!tensor_owns_storage_v<Ref>)
      return true;
    else
      return std::is_reference_v<Ref> && !(rvalue && range_owns_elements_v<Params>);
  }
}

template <tensor_argument Params>
consteval bool parameter_tensors_ok() {
  using T = argument_tensor_t<Params>;
  using E = std::remove_const_t<tensor_value_t<T>>;
  if constexpr (!std::same_as<E, float> && !is_low_precision_v<E>) {
    static_assert(std::same_as<E, float> || is_low_precision_v<E>,
                  "diloco: parameters must be fp32 tensors (float elements), or under inner::external bf16 / fp16 "
                  "tensors (diloco::bfloat16, diloco::float16): the outer state computes in fp32; keep an fp32 "
                  "copy of the model (e.g. std::vector<float>) and train that");
    return false;
  } else if constexpr (!requires(std::remove_reference_t<T>& t) {
                         { tensor_traits_of<T>::data(t) } -> std::convertible_to<E*>;
                       }) {
    static_assert(mutable_float_tensor<T>,
                  "diloco: parameters must be writable: they are updated in place, so pass the parameter tensors "
                  "themselves, not const tensors (a const std::vector<float>) or views of const elements");
    return false;
  } else if constexpr (!parameters_outlive_call<Params>()) {
    static_assert(parameters_outlive_call<Params>(),
                  "diloco: parameters must outlive the algorithm: it keeps pointers into the user's tensors, and "
                  "this argument is a temporary that owns its elements (an rvalue std::vector/std::array/"
                  "thrust::device_vector, a container of such tensors, or a range yielding copies of them), "
                  "freed when the constructor returns; pass an lvalue (a named variable) that outlives the "
                  "trainer, or views of it (std::span, diloco::tensor_view)");
    return false;
  } else {
    return true;
  }
}

template <tensor_argument Grads>
consteval bool gradient_tensors_ok() {
  using T = argument_tensor_t<Grads>;
  static_assert(std::same_as<tensor_value_t<T>, float>,
                "diloco: gradients must be fp32 tensors (float elements), one per parameter tensor");
  return std::same_as<tensor_value_t<T>, float>;
}

}  // namespace diloco::detail
