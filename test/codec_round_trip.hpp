// SPDX-License-Identifier: Apache-2.0
// A codec block encoded and decoded, shared by the codec tests: encode's
// own decoded values must equal decode's bit for bit, and the block's bytes
// must pass the codec's structure check.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

// Encodes v (one block) into bytes prefilled with a marker, so padding the
// codec forgets to write is caught by its check; returns decode(encode(v)),
// and the bytes in *out when asked.
template <class Codec>
std::vector<float> round_trip(const Codec& codec, const std::vector<float>& v, std::uint64_t stream = 0,
                              std::vector<std::byte>* out = nullptr) {
  std::vector<std::byte> bytes(codec.stride(), std::byte{0x5a});
  std::vector<float> dq(v.size()), back(v.size());
  codec.encode(v.data(), v.size(), bytes.data(), dq.data(), stream, 0);
  codec.decode(bytes.data(), v.size(), back.data());
  for (std::size_t j = 0; j < v.size(); ++j) REQUIRE(std::memcmp(&dq[j], &back[j], 4) == 0);  // encode's dq = decode
  REQUIRE(codec.check(bytes.data(), v.size()) == nullptr);
  if (out) *out = bytes;
  return back;
}
