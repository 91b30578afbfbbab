// SPDX-License-Identifier: Apache-2.0
#pragma once

// A block codec written once, as its elements. The device team programs
// (kernels/compressed_blocks.hpp) code a block element by element through
// the codec's element-level form (kernels/codec_elements.hpp);
// element_codec<E> builds from the same form the block codec the host
// passes call (codec/block_codec.hpp's block_codec: encode, decode, check), so
// each element goes through the same float operations on both and the wire
// carries the same bytes. A codec outside the library is one such form
// plus a policy (test/test_codec_scaled_sign.cpp: a 1-bit scaled sign).
//
// The form E gives, all static (DILOCO_HD where the device runs them):
//   id                       its codec_id (from codec_id::user_first up)
//   block, group             elements per block; per group (consecutive
//                            elements whose codes fill whole bytes, which
//                            one device thread moves together; block is a
//                            multiple of group)
//   scaled                   whether codes depend on the block's amax (the
//                            largest magnitude, NaN if any element is NaN:
//                            kernels::block_amax, the team max on the device)
//   stochastic               whether encode uses its draw u in [0, 1)
//   stride                   bytes per encoded block (a partial block keeps it)
//   code                     the type of one element's code
//   put_factor(blk, amax), factor(blk)     the block's factor, written, read
//   factor_terms, terms(amax)             what encode/decode need of it,
//                                         worked out once per block
//   encode(v, terms, u, q, dq)  one element: its code q and decoded value dq
//   normal(terms), encode_normal(...)     a whole block's fast form (the
//                                         same results as encode when normal)
//   decode(q, terms), plain(terms), decode_plain(q, terms)   likewise
//   put_codes(blk, j0, q[group]), codes(blk, j0, q[group])   a group's codes
//                                         (j0 a multiple of group); a partial
//                                         block's padding codes are 0
//   check(blk, len) -> const char*       nullptr if the block is well
//                                         formed, else what is wrong

#include <cstddef>
#include <cstdint>

#include "diloco/codec/block_codec.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/codec/quantize.hpp"
#include "diloco/core/random.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The block codec of the element-level form E (see the header's comment):
/// kernels::codec_elements<element_codec<E>> is E, so the device passes serve it.
template <class E>
struct element_codec {
  static_assert(E::block % E::group == 0, "element_codec: the block size must be a multiple of the group size");
  using elements = E;  ///< the element-level form (kernels/codec_elements.hpp serves it to the team programs)
  static constexpr std::size_t block = E::block;  ///< elements per block
  static constexpr codec_id id = E::id;  ///< the codec's id in segment headers

  /// Bytes of an encoded block.
  DILOCO_HD static constexpr std::size_t stride() { return E::stride; }

  /// Encodes v[0, len) into out and writes what decode gives into dq; `stream`
  /// and `index0 + j` seed element j's draw (stochastic forms).
  DILOCO_HD void encode(const float* v, std::size_t len, std::byte* out, float* dq, std::uint64_t stream,
                        std::uint64_t index0) const {
    len = len < block ? len : block;
    float amax = 0.0f;
    if constexpr (E::scaled) amax = kernels::block_amax(v, len);
    const auto terms = E::terms(amax);
    E::put_factor(out, amax);
    for (std::size_t j0 = 0; j0 < block; j0 += E::group) {
      typename E::code q[E::group];
      for (std::size_t i = 0; i < E::group; ++i) {
        const std::size_t j = j0 + i;
        q[i] = 0;  // a partial block's padding codes are zero
        if (j < len) {
          const float u = E::stochastic ? kernels::random_unit(stream, index0 + j) : 0.0f;
          float d;
          E::encode(v[j], terms, u, q[i], d);
          dq[j] = d;
        }
      }
      E::put_codes(out, j0, q);
    }
  }

  /// Decodes a block into dq[0, len).
  DILOCO_HD void decode(const std::byte* in, std::size_t len, float* dq) const {
    len = len < block ? len : block;
    const auto terms = E::terms(E::factor(in));
    const bool plain = E::plain(terms);
    for (std::size_t j0 = 0; j0 < len; j0 += E::group) {
      typename E::code q[E::group];
      E::codes(in, j0, q);
      for (std::size_t i = 0; i < E::group && j0 + i < len; ++i)
        dq[j0 + i] = plain ? E::decode_plain(q[i], terms) : E::decode(q[i], terms);
    }
  }

  /// nullptr if the block's bytes are well formed, else what is wrong (E::check).
  DILOCO_HD const char* check(const std::byte* in, std::size_t len) const {
    return E::check(in, len < block ? len : block);
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
