// SPDX-License-Identifier: Apache-2.0
#pragma once

// The shape every lossy codec has (compress::block_codec), the codec layer's
// own concept: element codecs, formats, block layout and wire segments live
// in codec/, below kernels/, and the compressor policies that name them in
// compress/ (compress/codec.hpp, compress/concepts.hpp).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "diloco/codec/formats.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The shape every lossy codec has. A codec works on blocks: a block of up to
/// `block` consecutive elements of one tensor is encoded into a fixed
/// `stride` of bytes (a partial block at a tensor's end keeps the stride), so
/// any block's bytes are found by index, blocks encode in parallel, and the
/// CUDA backend can give each block to a thread block.
///
/// ```
/// codec.encode(v, len, out, dq, stream, index0)  v[0, len) -> out[0, stride);
///                                                 dq receives decode(out)
/// codec.decode(in, len, dq)                       in -> dq[0, len)
/// codec.check(in, len) -> const char*             nullptr if the block's
///                                                 bytes are well formed,
///                                                 else what is wrong
/// ```
/// `stream` and `index0 + j` seed stochastic rounding of element j.
template <class C>
concept block_codec = std::is_trivially_copyable_v<C> &&
                      requires(const C& c, const float* v, float* dq, std::byte* out, const std::byte* in,
                               std::size_t n, std::uint64_t s) {
                        { C::block } -> std::convertible_to<std::size_t>;
                        { C::id } -> std::convertible_to<codec_id>;
                        { c.stride() } -> std::convertible_to<std::size_t>;
                        { c.encode(v, n, out, dq, s, s) };
                        { c.decode(in, n, dq) };
                        { c.check(in, n) } -> std::convertible_to<const char*>;
                      };

namespace stand_in {
// A type that satisfies block_codec (declared only, for the concepts'
// unevaluated checks).

/// A block codec in name only (block_codec's requirements, declared).
struct any_block_codec {
  static constexpr std::size_t block = 1;         ///< elements per block
  static constexpr codec_id id = codec_id::none;  ///< a codec id
  ///@{
  /// block_codec's operations, declared only.
  std::size_t stride() const;
  void encode(const float*, std::size_t, std::byte*, float*, std::uint64_t, std::uint64_t) const;
  void decode(const std::byte*, std::size_t, float*) const;
  const char* check(const std::byte*, std::size_t) const;
  ///@}
};
}  // namespace stand_in

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
