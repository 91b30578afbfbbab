// SPDX-License-Identifier: Apache-2.0
#pragma once

// thrust::device_vector<T> as a diloco tensor in device memory.

#include <cstddef>
#include <thrust/device_vector.h>

#include "diloco/core/memory_space.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// thrust::device_vector<T> as a diloco tensor in device memory.
template <class T, class Alloc>
struct tensor_traits<thrust::device_vector<T, Alloc>> {
  ///@{
  /// The customization point's members (see tensor_traits): the element type, the memory space,
  /// the data pointer and the element count.
  using value_type = T;
  using memory_space = device_space;
  static constexpr bool owns_storage = true;  ///< a container: a temporary may not be the parameters
  static T* data(thrust::device_vector<T, Alloc>& t) { return thrust::raw_pointer_cast(t.data()); }
  static const T* data(const thrust::device_vector<T, Alloc>& t) { return thrust::raw_pointer_cast(t.data()); }
  static std::size_t size(const thrust::device_vector<T, Alloc>& t) { return t.size(); }
  ///@}
};

}  // namespace diloco
