// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <type_traits>

namespace diloco {

/// Where a tensor's elements live. The space is part of a tensor's type, and
/// the executor that runs a pass is chosen from it at compile time.
struct host_space {
  static constexpr const char* name = "host";  ///< for messages
};
/// Device (CUDA) memory: passes over it run on exec::cuda.
struct device_space {
  static constexpr const char* name = "device";  ///< for messages
};

/// True for host_space and device_space.
template <class S>
inline constexpr bool is_memory_space_v =
    std::is_same_v<S, host_space> || std::is_same_v<S, device_space>;

}  // namespace diloco
