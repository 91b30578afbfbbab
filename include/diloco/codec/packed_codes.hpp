// SPDX-License-Identifier: Apache-2.0
#pragma once

// Host helper of the block codecs' codes (codec/blockwise.hpp): packing a
// block's codes a 64-bit word at a time, which gives what the code-by-code
// loop gives without a loop per code (8 codes take a handful of shifts and
// masks). Decoding needs no table: the small floats' codes have a
// branch-free value (minifloat_grid::value_branchless) whose loops vectorize
// (a 256-entry table's loads did not, and were slower; issue 46). Host
// only: the device passes pack and decode a group of codes per thread
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

}  // namespace diloco::compress::packed_codes

DILOCO_EXACT_FP_END
