// SPDX-License-Identifier: Apache-2.0
#pragma once
// The codecs the wire-decoder fuzzer drives, by index (the input's first
// byte modulo codec_count), shared with the seed writer so that every
// codec has seeds. low_rank's segments are plain floats (no codec blocks):
// the fuzzer's plain mode (input[1] bit 1) drives their validation, with
// the expectation below.
#include <cstddef>
#include <diloco/diloco.hpp>

namespace fuzz {

namespace cp = diloco::compress;

inline constexpr unsigned codec_count = 10;

template <class F>
void with_codec(unsigned index, F&& f) {
  switch (index % codec_count) {
    case 0: f(cp::blockwise_codec<diloco::int8, 16, cp::round_nearest>{}); break;
    case 1: f(cp::blockwise_codec<diloco::int4, 16, cp::round_nearest>{}); break;
    case 2: f(cp::cast_codec<diloco::bf16, cp::round_nearest, 8>{}); break;
    case 3: f(cp::cast_codec<diloco::fp16, cp::round_nearest, 8>{}); break;
    case 4: f(cp::topk<16>::make_codec({.fraction = 0.3f})); break;
    case 5: f(cp::blockwise_codec<diloco::fp8_e4m3, 16, cp::round_nearest>{}); break;
    case 6: f(cp::blockwise_codec<diloco::fp8_e5m2, 16, cp::round_nearest>{}); break;
    case 7: f(cp::blockwise_codec<diloco::fp4_e3m0, 16, cp::stochastic_rounding>{}); break;
    case 8: f(cp::chunk_topk_codec<64, 8, diloco::int2, cp::round_nearest>{}); break;
    default: f(cp::blockwise_codec<diloco::int2, 16, cp::round_nearest>{}); break;
  }
}

// The two blocks every fuzzed segment holds: a full one and a partial odd one.
template <class Codec>
struct segment_shape {
  cp::block_ref blocks[2] = {{0, static_cast<std::uint32_t>(Codec::block), 0},
                             {0, static_cast<std::uint32_t>(Codec::block / 2 + 1), Codec::block}};
  std::size_t elements() const { return blocks[0].len + blocks[1].len; }
};

// A low_rank factor segment: rank 2, a 5 x 3 matrix's P (5 x 2 floats),
// sent by rank 1 in round 3 (exchange 1).
inline constexpr std::size_t plain_floats = 10;
inline diloco::wire::expectation plain_expectation() {
  return {cp::codec_id::low_rank, diloco::wire::flag_error_feedback, 2, 1, 15, 4 * plain_floats, 3};
}

// Writes the header plain_expectation() asks for at the start of `slot`.
inline void write_plain_header(std::byte* slot) {
  const diloco::wire::expectation want = plain_expectation();
  diloco::wire::header h;
  h.codec = want.codec;
  h.flags = want.flags;
  h.block_size = want.block_size;
  h.sender = want.sender;
  h.elements = want.elements;
  h.payload_bytes = want.payload_bytes;
  h.round = want.round;
  diloco::wire::write_header(slot, h);
}

}  // namespace fuzz
