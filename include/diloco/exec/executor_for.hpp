// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which executor runs the passes over memory of a space: exec::host for
// host memory here; the CUDA backend adds device_space -> exec::cuda
// (exec/cuda.hpp). make_executor builds an engine's executor on the
// caller's device stream where the executor takes one.

#include <type_traits>

#include "diloco/core/memory_space.hpp"
#include "diloco/exec/host.hpp"

namespace diloco::detail {

enum class space_id { host, device };
template <class Space>
inline constexpr space_id space_id_v = std::is_same_v<Space, host_space> ? space_id::host : space_id::device;

template <class Space>
struct executor_for;
template <>
struct executor_for<host_space> {
  using type = exec::host;
};

// An engine's executor: on the caller's device stream when it takes one
// (exec::cuda::on_stream), else default-constructed.
template <class Exec>
Exec make_executor(void* stream) {
  if constexpr (requires { Exec::on_stream(stream); })
    return Exec::on_stream(stream);
  else
    return (void)stream, Exec{};
}

}  // namespace diloco::detail
