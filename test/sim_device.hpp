// SPDX-License-Identifier: Apache-2.0
// For a program that replays device code on the host: its "device" is host
// memory behind device_space types. device_space buffers are host buffers
// and device_space work runs on sim::cuda_executor (the CUDA grid and team
// launches replayed serially). Include it in the programs that want this,
// and only there: it specializes the library's templates for the program.
#pragma once

#include <diloco/diloco.hpp>

#include "cuda_grid_sim.hpp"

namespace diloco {
template <class T>
class buffer<T, device_space> : public buffer<T, host_space> {
 public:
  using buffer<T, host_space>::buffer;
  tensor_view<T, device_space> view() { return {this->data(), this->size()}; }
};
namespace detail {
template <>
struct executor_for<device_space> {
  using type = sim::cuda_executor;
};
}  // namespace detail
}  // namespace diloco
