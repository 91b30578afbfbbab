#pragma once

// The fused passes of a compressed round, one functor call per codec block
// (see compress/codec.hpp and compress/compressed_mean.hpp). Each reads its
// block's elements straight from the parameter tensors and writes straight
// into wire segments, so no fp32 copy of the pseudo-gradient is ever made.

#include <cstddef>
#include <cstdint>

#include "diloco/compress/block_layout.hpp"
#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// Two sums from one pass.
struct sums2 {
  double a = 0.0;
  double b = 0.0;
  DILOCO_HD sums2& operator+=(const sums2& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};

// Where tensor t's elements live: the user's replica, and offset t in the
// library's flat buffers (global parameters, outer state, residuals).
struct tensor_table {
  float* const* local;
  const std::size_t* offset;
};

// Stage 1, per block: v = (global - local) + residual, encoded into the
// segment; the new residual v - decode(encode(v)) when error feedback is on.
// Returns (||delta||^2, ||v - decoded||^2) of the block.
// Bytes per element, int8 with error feedback: read 12 (global, local,
// residual), write ~5 (1 value + 4 new residual, plus 4/B of block factor).
template <class Codec>
struct encode_pseudo_gradient {
  Codec codec;
  const compress::block_ref* blocks;  // the shard's first block
  tensor_table tensors;
  const float* global;
  const float* residual;  // nullptr without error feedback
  float* new_residual;    // nullptr without error feedback
  std::byte* payload;     // the shard's payload; block b at b * stride
  std::size_t stride;
  std::uint64_t stream;

  DILOCO_HD sums2 operator()(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    const std::size_t off = tensors.offset[blk.tensor] + blk.start;
    const float* local = tensors.local[blk.tensor] + blk.start;
    // Value-initialized: the codec reads only [0, len), which the compiler
    // cannot see.
    float v[Codec::block]{};
    float dq[Codec::block];
    sums2 out;
    for (std::size_t j = 0; j < blk.len; ++j) {
      const float d = global[off + j] - local[j];
      out.a += static_cast<double>(d) * static_cast<double>(d);
      v[j] = residual ? d + residual[off + j] : d;
    }
    codec.encode(v, blk.len, payload + b * stride, dq, stream, off);
    for (std::size_t j = 0; j < blk.len; ++j) {
      const float e = v[j] - dq[j];
      out.b += static_cast<double>(e) * static_cast<double>(e);
      if (new_residual) new_residual[off + j] = e;
    }
    return out;
  }
};

// Stages 3 and 4 fused, per block of this rank's shard: decode the M
// received encodings, sum them in rank order (deterministic), divide by M,
// re-encode the mean into this rank's reduced segment. Returns the squared
// norm of the decoded reduced block (its finiteness is checked by everyone).
template <class Codec>
struct reduce_shard {
  Codec codec;
  const compress::block_ref* blocks;
  const std::size_t* offset;           // flat offset per tensor (stochastic rounding index)
  const std::byte* const* received;    // M payloads of this shard, in rank order
  int world;
  std::byte* payload;
  std::size_t stride;
  std::uint64_t stream;

  DILOCO_HD double operator()(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    float acc[Codec::block];
    float dq[Codec::block];
    codec.decode(received[0] + b * stride, blk.len, acc);
    for (int k = 1; k < world; ++k) {
      codec.decode(received[k] + b * stride, blk.len, dq);
      for (std::size_t j = 0; j < blk.len; ++j) acc[j] += dq[j];
    }
    const auto m = static_cast<float>(world);
    for (std::size_t j = 0; j < blk.len; ++j) acc[j] = acc[j] / m;
    codec.encode(acc, blk.len, payload + b * stride, dq, stream, offset[blk.tensor] + blk.start);
    double sq = 0.0;
    for (std::size_t j = 0; j < blk.len; ++j) sq += static_cast<double>(dq[j]) * static_cast<double>(dq[j]);
    return sq;
  }
};

// Stage 6, per block: decode the averaged pseudo-gradient, apply the outer
// optimizer to the global parameters and copy them into the replica.
// Bytes per element, int8 and Nesterov: read ~9 (1 value, state, global),
// write 12 (state, global, local).
template <class Codec, class Update>
struct decode_apply {
  Codec codec;
  Update update;
  const compress::block_ref* blocks;
  tensor_table tensors;
  const std::byte* payload;
  std::size_t stride;
  float* global;
  float* state;  // nullptr when the outer optimizer keeps none
  std::size_t state_stride;

  DILOCO_HD void operator()(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    const std::size_t off = tensors.offset[blk.tensor] + blk.start;
    float* local = tensors.local[blk.tensor] + blk.start;
    float dq[Codec::block];
    codec.decode(payload + b * stride, blk.len, dq);
    for (std::size_t j = 0; j < blk.len; ++j) {
      float g = global[off + j];
      update(g, dq[j], state ? state + off + j : nullptr, state_stride);
      global[off + j] = g;
      local[j] = g;
    }
  }
};

}  // namespace diloco::kernels
