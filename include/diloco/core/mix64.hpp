// SPDX-License-Identifier: Apache-2.0
#pragma once

// SplitMix64's finalizer, the one 64-bit mix of the library: the wire
// checksum (core/checksum.hpp) and the counter-based random streams
// (core/random.hpp, which names it kernels::mix64) use it.

#include <cstdint>

#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::detail {

// A bijective mix of 64 bits.
DILOCO_HD DILOCO_FORCEINLINE std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace diloco::detail

DILOCO_EXACT_FP_END
