// SPDX-License-Identifier: Apache-2.0
#pragma once

// Moving a group of codes (kernels/codec_elements.hpp: the consecutive
// elements one device thread codes together) as one access: the element
// forms of the block codecs (codec/blockwise.hpp, codec/cast.hpp) put and
// read their groups' bytes and factors through these.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

namespace detail {

template <std::size_t N>
struct word_of;
template <>
struct word_of<1> {
  using type = std::uint8_t;
};
template <>
struct word_of<2> {
  using type = std::uint16_t;
};
template <>
struct word_of<4> {
  using type = std::uint32_t;
};
template <>
struct word_of<8> {
  using type = std::uint64_t;
};

}  // namespace detail

/// N bytes (N = 1, 2, 4, 8) as one access on the device, where `p` must be
/// N-byte aligned; byte copies on the host (same bytes, no alignment rules).
template <std::size_t N>
DILOCO_HD DILOCO_FORCEINLINE void store_bytes(std::byte* p, const unsigned char (&bytes)[N]) {
#if defined(__CUDA_ARCH__)
  typename detail::word_of<N>::type w;
  std::memcpy(&w, bytes, N);
  *reinterpret_cast<typename detail::word_of<N>::type*>(p) = w;
#else
  std::memcpy(p, bytes, N);
#endif
}

/// The load of store_bytes: N bytes as one access on the device (p N-byte aligned there).
template <std::size_t N>
DILOCO_HD DILOCO_FORCEINLINE void load_bytes(const std::byte* p, unsigned char (&bytes)[N]) {
#if defined(__CUDA_ARCH__)
  const typename detail::word_of<N>::type w = *reinterpret_cast<const typename detail::word_of<N>::type*>(p);
  std::memcpy(bytes, &w, N);
#else
  std::memcpy(bytes, p, N);
#endif
}

/// An fp32 at `p`, which is 4-byte aligned when Aligned (else read bytewise).
template <bool Aligned>
DILOCO_HD DILOCO_FORCEINLINE float load_float(const std::byte* p) {
  float x;
  if constexpr (Aligned) {
    unsigned char b[4];
    load_bytes<4>(p, b);
    std::memcpy(&x, b, 4);
  } else {
    std::memcpy(&x, p, 4);
  }
  return x;
}
/// The store of load_float: an fp32 to `p`, 4-byte aligned when Aligned.
template <bool Aligned>
DILOCO_HD DILOCO_FORCEINLINE void store_float(std::byte* p, float x) {
  if constexpr (Aligned) {
    unsigned char b[4];
    std::memcpy(b, &x, 4);
    store_bytes<4>(p, b);
  } else {
    std::memcpy(p, &x, 4);
  }
}

}  // namespace diloco::kernels
