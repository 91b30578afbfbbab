// SPDX-License-Identifier: Apache-2.0
#pragma once

// Host helpers of the block codecs' codes (compress/blockwise.hpp):
// packing a block's codes a 64-bit word at a time, and decoding them by a
// table that holds, for each of the 256 byte values, the grid values of the
// codes in it. Both give what the code-by-code loops give (the table is
// filled by the grid's own value()), only without a loop or a branch per
// code: packing 8 codes takes a handful of shifts and masks, and a code's
// value is one load (fp8's value() takes a branch on the exponent field).
// Host only: the device passes pack and decode a group of codes per thread
// (kernels/codec_elements.hpp).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/core/macros.hpp"
#include "diloco/codec/grids.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress::packed_codes {

static_assert(std::endian::native == std::endian::little,
              "packed_codes: the word-at-a-time packing assumes a little-endian host (as the wire format does)");

/// Packs codes c[0, n) of Bits bits (each below 2^Bits) as blockwise_codec
/// lays them out: element j at bit (j % (8 / Bits)) * Bits of byte
/// j / (8 / Bits). Writes ceil(n * Bits / 8) bytes and returns that count.
template <int Bits>
inline std::size_t pack(const unsigned char* c, std::size_t n, unsigned char* out) {
  static_assert(Bits == 2 || Bits == 4 || Bits == 8, "packed_codes: 2, 4 or 8 bits per code");
  constexpr std::size_t per_byte = 8 / Bits;
  if constexpr (Bits == 8) {
    if (n != 0) std::memcpy(out, c, n);  // memcpy's pointers must not be null, even for 0 bytes (an empty vector's are)
    return n;
  } else {
    constexpr std::size_t bytes_per_word = 8 / per_byte;  // 8 codes (one per byte) -> this many bytes
    const std::size_t words = n / 8;
    for (std::size_t w = 0; w < words; ++w) {
      std::uint64_t x;
      std::memcpy(&x, c + 8 * w, 8);
      // Fold neighbouring bytes together, halving the field count each time
      // and doubling each field's width, until the codes sit side by side.
      if constexpr (Bits == 4) {
        x = (x | (x >> 4)) & 0x00ff00ff00ff00ffULL;
        x = (x | (x >> 8)) & 0x0000ffff0000ffffULL;
        x = (x | (x >> 16)) & 0x00000000ffffffffULL;
      } else {
        x = (x | (x >> 6)) & 0x000f000f000f000fULL;
        x = (x | (x >> 12)) & 0x000000ff000000ffULL;
        x = (x | (x >> 24)) & 0x000000000000ffffULL;
      }
      std::memcpy(out + bytes_per_word * w, &x, bytes_per_word);
    }
    std::size_t used = words * bytes_per_word;
    for (std::size_t j = words * 8; j < n; j += per_byte, ++used) {
      unsigned byte = 0;
      for (std::size_t i = 0; i < per_byte && j + i < n; ++i) byte |= static_cast<unsigned>(c[j + i]) << (i * Bits);
      out[used] = static_cast<unsigned char>(byte);
    }
    return used;
  }
}

/// For each byte value, the grid values of the 8 / Bits codes in it, from
/// the low bits (element i of the byte in v[byte][i]).
template <int Bits>
struct byte_values {
  alignas(4 * (8 / Bits) <= 16 ? 4 * (8 / Bits) : 16) float v[256][8 / Bits];  ///< the values, by byte and position
};

/// The table of a block format (filled once, on first use, by its grid's value()).
template <class Format>
inline const byte_values<Format::bits>& values_of_bytes() {
  constexpr int bits = Format::bits;
  static const byte_values<bits> table = [] {
    byte_values<bits> t{};
    constexpr auto g = kernels::grid<Format>();
    constexpr unsigned mask = (1u << bits) - 1u;
    for (unsigned b = 0; b < 256; ++b)
      for (unsigned i = 0; i < 8 / bits; ++i) t.v[b][i] = g.value((b >> (i * bits)) & mask);
    return t;
  }();
  return table;
}

}  // namespace diloco::compress::packed_codes

DILOCO_EXACT_FP_END
