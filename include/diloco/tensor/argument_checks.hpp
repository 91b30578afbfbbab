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
#include "diloco/tensor/tensor_traits.hpp"

namespace diloco::detail {

// The tensor type of a tensor argument: itself when it is an fp32 tensor, a
// list's elements when it is a list of tensors (std::vector<T> is a tensor
// whatever T, so a list of vectors is one too), else itself.
template <class T>
struct argument_tensor {
  using type = T;
};
template <class T>
  requires(!float_tensor<T> && any_tensor_range<T>)
struct argument_tensor<T> {
  using type = std::ranges::range_reference_t<T>;
};
template <class T>
using argument_tensor_t = typename argument_tensor<T>::type;

template <tensor_argument Params>
consteval bool parameter_tensors_ok() {
  using T = argument_tensor_t<Params>;
  if constexpr (!std::same_as<tensor_value_t<T>, float>) {
    static_assert(std::same_as<tensor_value_t<T>, float>,
                  "diloco: parameters must be fp32 tensors (float elements): the optimizers and the outer state "
                  "compute in fp32; keep an fp32 copy of the model (e.g. std::vector<float>) and train that");
    return false;
  } else if constexpr (!mutable_float_tensor<T>) {
    static_assert(mutable_float_tensor<T>,
                  "diloco: parameters must be writable: they are updated in place, so pass the parameter tensors "
                  "themselves, not const tensors (a const std::vector<float>) or views of const elements");
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
