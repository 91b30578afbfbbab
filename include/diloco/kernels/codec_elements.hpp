// SPDX-License-Identifier: Apache-2.0
#pragma once

// Element-level access to a block codec's bytes, for the device passes
// (kernels/compressed_blocks.hpp), which give the elements of a codec block
// to the threads of a team instead of the whole block to one call. A codec
// carries its element-level form as `Codec::elements`, written once beside
// the codec (codec/blockwise.hpp, codec/cast.hpp, or a codec written as its
// elements, codec/element_codec.hpp): the host block codec and the device
// team programs quantize each element through the same functions, so a
// block coded element by element has the same bytes, bit for bit.
//
// Elements go in groups of `group` consecutive elements (4, or 2 when B is
// not a multiple of 4) whose codes fill `group_bytes` consecutive bytes of
// the block; the layouts keep every group's bytes aligned to their size, so
// a thread moves them with one access (codec/group_bytes.hpp).

#include "diloco/codec/blockwise.hpp"
#include "diloco/codec/cast.hpp"
#include "diloco/codec/group_bytes.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Codecs without an element-level form (top-k selects per block) have
/// supported == false; the device compressed mean refuses them.
template <class Codec>
struct codec_elements {
  /// No element-level form.
  static constexpr bool supported = false;
};

/// A codec that carries its element-level form as `Codec::elements` serves
/// the team programs through it; the form has the members codec/element_codec.hpp
/// lists (block, group, scaled, stochastic, stride, code, factor, put_factor,
/// factor_terms, terms, normal, encode_normal, encode, plain, decode_plain,
/// decode, put_codes, codes).
template <class Codec>
  requires requires { typename Codec::elements; }
struct codec_elements<Codec> : Codec::elements {
  using codec = Codec;  ///< the codec
  static constexpr bool supported = true;  ///< it has an element-level form
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
