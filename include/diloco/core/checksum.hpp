// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/core/mix64.hpp"

namespace diloco {

/// The checksum of wire buffers: the wrapping sum over 64-bit little-endian
/// words w_i (the tail zero-padded) of mix64(w_i + (i + 1) * golden), mixed
/// once more with the length. Every term is a bijection of its word, so any
/// change to a single word changes the sum; the position in the term catches
/// reordered words. Being a sum, it is computed in any order: by OpenMP
/// threads or GPU blocks alike. Not cryptographic: it detects accidents, not
/// attackers.
inline std::uint64_t checksum_words(const std::byte* data, std::size_t bytes, std::uint64_t first_word_index = 0) {
  constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ULL;
  std::uint64_t acc[4] = {0, 0, 0, 0};  // independent lanes, so the loop pipelines
  const std::size_t words = (bytes + 7) / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w = 0;
    std::memcpy(&w, data + 8 * i, i + 1 < words || bytes % 8 == 0 ? 8 : bytes % 8);
    acc[i & 3] += detail::mix64(w + (first_word_index + i + 1) * golden);
  }
  return acc[0] + acc[1] + acc[2] + acc[3];
}

/// Finishes a checksum: the sum of checksum_words over a whole buffer, mixed with its length in bytes.
inline std::uint64_t checksum_finish(std::uint64_t sum, std::uint64_t total_bytes) {
  return detail::mix64(sum ^ detail::mix64(total_bytes));
}

}  // namespace diloco
