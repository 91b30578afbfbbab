// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "diloco/core/macros.hpp"
#include "diloco/core/mix64.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

// SplitMix64's finalizer (core/mix64.hpp): a bijective mix of 64 bits.
// Counter-based randomness (hash of seed and position) is what lets
// stochastic rounding be reproducible and identical on any number of host
// threads or GPU blocks.
using diloco::detail::mix64;

/// 32 random bits for element `index` of the stream `stream` (a hash of the
/// seed, the round, the rank and the stage).
DILOCO_HD DILOCO_FORCEINLINE std::uint32_t random_bits(std::uint64_t stream, std::uint64_t index) {
  return static_cast<std::uint32_t>(mix64(stream ^ mix64(index + 0x9e3779b97f4a7c15ULL)) >> 32);
}

/// Uniform in [0, 1) with 24 random bits (exactly representable in fp32).
DILOCO_HD DILOCO_FORCEINLINE float random_unit(std::uint64_t stream, std::uint64_t index) {
  return static_cast<float>(random_bits(stream, index) >> 8) * (1.0f / 16777216.0f);
}

/// The stream of one stochastic rounding: a hash of the seed, the round, the rank and the stage.
inline std::uint64_t make_stream(std::uint64_t seed, std::uint64_t round, std::uint64_t rank, std::uint64_t stage) {
  return mix64(mix64(mix64(seed ^ 0x64696c6f636fULL) ^ round) ^ (rank << 8 | stage));
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
