// SPDX-License-Identifier: Apache-2.0
#pragma once

// Bitwise equality of two float vectors (a -0.0 for 0.0 or a changed NaN is
// a difference), the check of every test that asks for the same bits.

#include <cstring>
#include <vector>

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
