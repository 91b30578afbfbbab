// SPDX-License-Identifier: Apache-2.0
#pragma once

// The fused passes of a compressed round, one functor call per codec block
// (see codec/block_codec.hpp and compress/compressed_mean.hpp). Each reads its
// block's elements straight from the parameter tensors and writes straight
// into wire segments, so no fp32 copy of the pseudo-gradient is ever made.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "diloco/codec/block_layout.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/kernels/eager_block.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/kernels/host_simd.hpp"
#include "diloco/kernels/host_simd512.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/sgd_update.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Lanes of a codec block's sums of squares: a power of two, about one per
/// 16 elements (8 up to B = 255, 64 at B = 1024, 256 from B = 4096 on), so
/// that on the device a team's threads add ~16 squares each and then meet in
/// a tree of log2(lanes) levels instead of 8 threads adding B / 8 each.
DILOCO_HD constexpr std::size_t norm_lanes(std::size_t block) {
  std::size_t lanes = 8;
  while (lanes < 256 && 32 * lanes <= block) lanes *= 2;
  return lanes;
}

/// acc[0] = the sum of acc[0, Lanes), added as a tree: acc[l] += acc[l + w]
/// for w = Lanes / 2, ..., 1 (at 8 lanes ((a0 + a4) + (a2 + a6)) + ((a1 + a5)
/// + (a3 + a7))). The device team runs the same levels, one per barrier.
template <std::size_t Lanes>
DILOCO_HD DILOCO_FORCEINLINE float lane_tree(float* acc) {
  static_assert(Lanes > 0 && (Lanes & (Lanes - 1)) == 0, "the lane tree halves a power of two");
  for (std::size_t w = Lanes / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) acc[l] = add_rn(acc[l], acc[l + w]);
  return acc[0];
}

/// The sum of squares of f(j) over j in [0, len), in Lanes fixed fp32 lanes
/// (element j in lane j % Lanes, in order; so the loop vectorizes without
/// reassociating anything: deterministic), the lanes added by lane_tree,
/// returned in double. The codec passes use norm_lanes(B) lanes, as the
/// device's team programs do (kernels/compressed_blocks.hpp). f may write as
/// it goes: this is how a block's pass fuses its stores with its norms.
template <std::size_t Lanes, class F>
DILOCO_HD DILOCO_FORCEINLINE double lane_squares(std::size_t len, F&& f) {
  float acc[Lanes] = {};
  std::size_t j = 0;
  for (; j + Lanes <= len; j += Lanes)
    for (std::size_t l = 0; l < Lanes; ++l) {
      const float x = f(j + l);
      acc[l] = add_rn(acc[l], mul_rn(x, x));  // never an FMA: the device's bits
    }
  for (std::size_t l = 0; j < len; ++j, ++l) {
    const float x = f(j);
    acc[l] = add_rn(acc[l], mul_rn(x, x));  // never an FMA: the device's bits
  }
  return static_cast<double>(lane_tree<Lanes>(acc));
}

/// Whether Codec encodes a block as a few entries with encode_entries (the
/// sent positions and their decoded values; zero elsewhere), as chunk_topk
/// does: the encode pass then forms the error without a dense decoded block.
template <class Codec>
concept sparse_codec = requires(const Codec& c, const float* v, std::byte* out, std::uint64_t* idx, float* sdq) {
  { c.encode_entries(v, std::size_t{}, out, idx, sdq, std::uint64_t{}, std::uint64_t{}) } -> std::same_as<std::size_t>;
};

#if defined(DILOCO_HOST_SIMD_X86)
/// Whether Codec's whole blocks can take kernels/host_simd.hpp's passes: a
/// supported codec whose block is a whole number of norm lanes.
template <class Codec>
inline constexpr bool host_simd_codec =
    host_simd::supports<Codec>::value && Codec::block % norm_lanes(Codec::block) == 0;
#endif

#if defined(DILOCO_HOST_BLOCK_LOOPS)
/// Whether Codec's whole blocks can take host_simd::block_loops (every
/// blockwise format with round to nearest, B a multiple of 8 and of its
/// norm lanes), and those loops.
template <class Codec>
inline constexpr bool host_block_codec = host_simd::fused<Codec>::value && Codec::block % norm_lanes(Codec::block) == 0;
/// Codec's fused host block loops (host_simd::fused), with its norm lanes.
template <class Codec>
using host_loops = typename host_simd::fused<Codec>::template loops<norm_lanes(Codec::block)>;
#endif

/// Two sums from one pass.
struct sums2 {
  ///@{
  /// The two sums.
  double a = 0.0;
  double b = 0.0;
  ///@}
  /// Adds o's sums to these.
  DILOCO_HD sums2& operator+=(const sums2& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};

/// Where tensor t's elements live: the user's replica, and offset t in the
/// library's flat buffers (global parameters, outer state, residuals).
struct tensor_table {
  ///@{
  /// local[t]: tensor t's first element in the replica; offset[t]: where it starts in the
  /// flat buffers.
  float* const* local;
  const std::size_t* offset;
  ///@}
};

/// Stage 1, per block: v = (global - local) + residual, encoded into the
/// segment; the new residual v - decode(encode(v)) when error feedback is on.
/// Returns (||delta||^2, ||v - decoded||^2) of the block.
/// Bytes per element, int8 with error feedback: read 12 (global, local,
/// residual), write ~5 (1 value + 4 new residual, plus 4/B of block factor).
template <class Codec>
struct encode_pseudo_gradient {
  /// One call covers a block: the executor weighs its parallel threshold by it.
  static constexpr std::size_t elements_per_call = Codec::block;
  ///@{
  /// The pass's inputs and outputs: the codec, the shard's blocks, the replica's tensors,
  /// theta_global (flat), the residuals, the payload, the bytes between blocks in it (the
  /// codec's stride), the stochastic rounding stream, the error-feedback decay.
  Codec codec;
  const compress::block_ref* blocks;  ///< the shard's first block
  tensor_table tensors;
  const float* global;
  const float* residual;  ///< nullptr without error feedback
  float* new_residual;    ///< nullptr without error feedback
  std::byte* payload;     ///< the shard's payload; block b at b * stride
  std::size_t stride;
  std::uint64_t stream;
  float decay = 1.0f;     ///< error feedback: the new residual is decay * (v - decoded)
  ///@}

  /// Block b: encodes it; returns (||delta||^2, ||v - decoded||^2). On the
  /// host the blockwise codecs' whole blocks take kernels/host_simd.hpp's
  /// intrinsics where the CPU has AVX2, else its fused loops (the same bits).
  DILOCO_HD sums2 operator()(std::size_t b) const {
#if defined(DILOCO_HOST_BLOCK_LOOPS)
    if constexpr (host_block_codec<Codec>) {
      const compress::block_ref blk = blocks[b];
      if (blk.len == Codec::block) {
        const std::size_t off = tensors.offset[blk.tensor] + blk.start;
        const float* g = global + off;
        const float* l = tensors.local[blk.tensor] + blk.start;
        const float* e = residual ? residual + off : nullptr;
        float* next = new_residual ? new_residual + off : nullptr;
        std::byte* out = payload + b * stride;
        // The streams this block reads, prefetch_distance ahead (where the
        // next blocks of the tensor are).
        constexpr std::size_t block_bytes = Codec::block * sizeof(float);
        host_simd::prefetch_ahead(g, host_simd::prefetch_distance, block_bytes);
        host_simd::prefetch_ahead(l, host_simd::prefetch_distance, block_bytes);
        if (e) host_simd::prefetch_ahead(e, host_simd::prefetch_distance, block_bytes);
        sums2 s;
#if defined(DILOCO_HOST_SIMD_X86)
        // With AVX2, the codecs host_simd::supports take its intrinsics
        // (the rare block they refuse, the portable code); without, and for
        // the others, the fused loops of the ISA the CPU runs. So only the
        // loops' baseline form is compiled for the former.
        if constexpr (host_simd_codec<Codec>) {
          if (host_simd::enabled()) {
            if (host_simd::encode_block_widest<typename host_simd::supports<Codec>::format, Codec::block,
                                        norm_lanes(Codec::block)>(g, l, e, next, decay, out, s.a, s.b))
              return s;
            return portable_avx2(b);
          }
          if (host_loops<Codec>::encode_baseline(g, l, e, next, decay, out, s.a, s.b)) return s;
          return portable(b);
        } else
#endif
        if (host_loops<Codec>::encode_any(g, l, e, next, decay, out, s.a, s.b))
          return s;
      }
    }
#endif
#if defined(DILOCO_HOST_SIMD_X86)
    if (host_simd::enabled()) {
      if constexpr (sparse_codec<Codec>)
        if (host_simd::avx512()) return portable_avx512(b);
      return portable_avx2(b);
    }
#endif
    return portable(b);
  }

  /// Block b by the portable code (what every other path must equal).
  DILOCO_HD sums2 portable(std::size_t b) const { return portable_body(b); }
#if defined(DILOCO_HOST_SIMD_X86)
  /// The portable code compiled for AVX2 (what operator() runs where no
  /// other form takes the block and the CPU has it: chunk_topk, fp16, the
  /// stochastic codecs, partial blocks; the same operations, no FMA, the
  /// same bits).
  __attribute__((target("avx2"))) sums2 portable_avx2(std::size_t b) const { return portable_body<256>(b); }
  /// The portable code compiled for AVX-512 (the features
  /// host_simd::avx512() asks for), which operator() runs for the sparse codecs (chunk_topk)
  /// where host_simd::avx512(): the compiler vectorizes the element loops
  /// and the selection's column maxima 16 lanes wide, and chunk_topk's
  /// selection compacts and searches its candidates in AVX-512
  /// (encode_entries<512>). The same operations (no FMA: fp-contract off,
  /// add_rn and mul_rn), the same bits and bytes.
  __attribute__((target(DILOCO_HOST_AVX512_TARGET))) sums2 portable_avx512(std::size_t b) const
    requires sparse_codec<Codec>
  {
    return portable_body<512>(b);
  }
#endif
  /// The portable code's body; with Width 512 or 256 (portable_avx512,
  /// portable_avx2), a sparse codec's encode_entries<Width> where it has
  /// one (chunk_topk's selection compacts in AVX-512 or AVX2: the same
  /// bytes).
  template <int Width = 0>
  DILOCO_HD DILOCO_FORCEINLINE sums2 portable_body(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    const std::size_t off = tensors.offset[blk.tensor] + blk.start;
    const float* DILOCO_RESTRICT local = tensors.local[blk.tensor] + blk.start;
    float v[Codec::block];
    const float* DILOCO_RESTRICT g = global + off;
    double delta_sq;
    if (residual) {
      const float* DILOCO_RESTRICT e = residual + off;
      delta_sq = lane_squares<norm_lanes(Codec::block)>(blk.len, [&](std::size_t j) {
        const float d = g[j] - local[j];
        v[j] = d + e[j];
        return d;
      });
    } else {
      delta_sq = lane_squares<norm_lanes(Codec::block)>(blk.len, [&](std::size_t j) {
        const float d = g[j] - local[j];
        v[j] = d;
        return d;
      });
    }
    // The new residual: decay * the error, in one copy.
    auto keep = [&](const float* DILOCO_RESTRICT x) {
      if (!new_residual) return;
      float* DILOCO_RESTRICT e = new_residual + off;
      if (decay == 1.0f)
        for (std::size_t j = 0; j < blk.len; ++j) e[j] = x[j];
      else
        for (std::size_t j = 0; j < blk.len; ++j) e[j] = decay * x[j];
    };
    double error_sq;
    if constexpr (sparse_codec<Codec>) {
      // A codec that sends a few entries (chunk_topk) decodes to zero
      // elsewhere, where v - dq is v: the error is v with its n sent
      // entries' decoded values subtracted in place.
      std::uint64_t idx[Codec::block];
      float sdq[Codec::k];
      std::size_t n;
      if constexpr (Width != 0 && requires { codec.template encode_entries<Width>(v, blk.len, payload, idx, sdq, stream, off); })
        n = codec.template encode_entries<Width>(v, blk.len, payload + b * stride, idx, sdq, stream, off);
      else
        n = codec.encode_entries(v, blk.len, payload + b * stride, idx, sdq, stream, off);
      for (std::size_t e = 0; e < n; ++e) v[idx[e]] = v[idx[e]] - sdq[e];
      error_sq = lane_squares<norm_lanes(Codec::block)>(blk.len, [&](std::size_t j) { return v[j]; });
      keep(v);
    } else {
      float dq[Codec::block];
      codec.encode(v, blk.len, payload + b * stride, dq, stream, off);
      // The error v - dq replaces dq in place (local arrays only, so the lane
      // sums vectorize).
      error_sq = lane_squares<norm_lanes(Codec::block)>(blk.len, [&](std::size_t j) {
        dq[j] = v[j] - dq[j];
        return dq[j];
      });
      keep(dq);
    }
    return {delta_sq, error_sq};
  }
};

/// Stages 3 and 4 fused, per block of this rank's shard: decode the M
/// received encodings, sum them in rank order (deterministic), divide by M,
/// re-encode the mean into this rank's reduced segment. Returns the squared
/// norm of the decoded reduced block (its finiteness is checked by everyone).
template <class Codec>
struct reduce_shard {
  /// One call covers a block: the executor weighs its parallel threshold by it.
  static constexpr std::size_t elements_per_call = Codec::block;
  ///@{
  /// The pass's inputs and outputs: the codec, this rank's shard's blocks, the tensors' flat
  /// offsets, the M received payloads, M, the reduced segment's payload, the bytes between
  /// blocks (the codec's stride), the stochastic rounding stream.
  Codec codec;
  const compress::block_ref* blocks;
  const std::size_t* offset;           ///< flat offset per tensor (stochastic rounding index)
  const std::byte* const* received;    ///< M payloads of this shard, in rank order
  int world;
  std::byte* payload;
  std::size_t stride;
  std::uint64_t stream;
  ///@}

  /// Block b: the decoded mean, re-encoded; returns its squared norm. On
  /// the host the blockwise codecs' whole blocks take kernels/host_simd.hpp's
  /// intrinsics where the CPU has AVX2, else its fused loops (the same bits).
  DILOCO_HD double operator()(std::size_t b) const {
#if defined(DILOCO_HOST_BLOCK_LOOPS)
    if constexpr (host_block_codec<Codec>) {
      if (blocks[b].len == Codec::block && world <= host_simd::max_world) {
        const std::byte* in[host_simd::max_world];
        for (int k = 0; k < world; ++k) in[k] = received[k] + b * stride;
        std::byte* out = payload + b * stride;
        double norm_sq;
#if defined(DILOCO_HOST_SIMD_X86)
        // As encode_pseudo_gradient: the intrinsics with AVX2, else the
        // loops' baseline form, for the codecs host_simd::supports.
        if constexpr (host_simd_codec<Codec>) {
          if (host_simd::enabled()) {
            // A run of one: batch()'s instantiation, so only it is compiled.
            if (host_simd::reduce_blocks_widest<typename host_simd::supports<Codec>::format, Codec::block,
                                         norm_lanes(Codec::block), run_blocks>(in, stride, world, 1u, out, &norm_sq))
              return norm_sq;
          } else if (host_loops<Codec>::reduce_baseline(in, world, out, norm_sq)) {
            return norm_sq;
          }
          return portable(b);
        } else
#endif
        if (host_loops<Codec>::reduce_any(in, world, out, norm_sq))
          return norm_sq;
      }
    }
#endif
    return portable(b);
  }

#if defined(DILOCO_HOST_SIMD_X86) && defined(DILOCO_HOST_BLOCK_LOOPS)
  /// The blocks host_simd::reduce_blocks takes in one run: as many as fill
  /// 1024 floats of means, at most 8 (exec::host hands batch() 8 blocks).
  static constexpr std::size_t run_blocks = Codec::block >= 1024 ? 1 : Codec::block >= 128 ? 1024 / Codec::block : 8;
#endif
  /// Blocks [b, b + n) into norm_sq[0, n): norm_sq[j] = operator()(b + j),
  /// the same bits and bytes (exec::host's sums call it 8 blocks at a time
  /// and add the norms in the order they add operator()'s). With AVX2 the
  /// whole blocks of the codecs host_simd::supports go to
  /// host_simd::reduce_blocks run_blocks at a time, which overlaps their
  /// dependent chains; the blocks it refuses take operator() (so the
  /// portable code), one by one.
  void batch(std::size_t b, std::size_t n, double* norm_sq) const {
#if defined(DILOCO_HOST_SIMD_X86) && defined(DILOCO_HOST_BLOCK_LOOPS)
    if constexpr (host_block_codec<Codec> && host_simd_codec<Codec> && run_blocks > 1) {
      if (host_simd::enabled() && world >= 1 && world <= host_simd::max_world) {
        const std::byte* in[host_simd::max_world];
        for (std::size_t r = 0; r < n; r += run_blocks) {
          const std::size_t count = n - r < run_blocks ? n - r : run_blocks;
          unsigned want = 0;
          for (std::size_t j = 0; j < count; ++j)
            if (blocks[b + r + j].len == Codec::block) want |= 1u << j;
          for (int k = 0; k < world; ++k) in[k] = received[k] + (b + r) * stride;
          const unsigned done =
              host_simd::reduce_blocks_widest<typename host_simd::supports<Codec>::format, Codec::block,
                                       norm_lanes(Codec::block), run_blocks>(in, stride, world, want,
                                                                            payload + (b + r) * stride, norm_sq + r);
          // The others by operator(), which tries the block alone and
          // gives it to the portable code (one copy of it compiled here, not two).
          for (std::size_t j = 0; j < count; ++j)
            if (!(done >> j & 1u)) norm_sq[r + j] = (*this)(b + r + j);
        }
        return;
      }
    }
#endif
    for (std::size_t j = 0; j < n; ++j) norm_sq[j] = (*this)(b + j);
  }

  /// Block b by the portable code (what every other path must equal).
  DILOCO_HD double portable(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    float acc[Codec::block];
    float dq[Codec::block];
    codec.decode(received[0] + b * stride, blk.len, acc);
    for (int k = 1; k < world; ++k) {
      codec.decode(received[k] + b * stride, blk.len, dq);
      float* DILOCO_RESTRICT a = acc;
      const float* DILOCO_RESTRICT d = dq;
      for (std::size_t j = 0; j < blk.len; ++j) a[j] += d[j];
    }
    const auto m = static_cast<float>(world);
    if ((world & (world - 1)) == 0) {
      // x / 2^k and x * 2^-k are one real number, each rounded once: the
      // same float (subnormal results too), and a multiply vectorizes cheaply.
      const float inv = 1.0f / m;
      for (std::size_t j = 0; j < blk.len; ++j) acc[j] = acc[j] * inv;
    } else {
      for (std::size_t j = 0; j < blk.len; ++j) acc[j] = acc[j] / m;
    }
    codec.encode(acc, blk.len, payload + b * stride, dq, stream, offset[blk.tensor] + blk.start);
    return lane_squares<norm_lanes(Codec::block)>(blk.len, [&](std::size_t j) { return dq[j]; });
  }
};

namespace detail {

template <class U, class M>
DILOCO_HD DILOCO_FORCEINLINE void apply_element(const U& u, const M& m, std::size_t j, float* DILOCO_RESTRICT g,
                                                float* DILOCO_RESTRICT l, float mean, float* s, std::size_t ss) {
  float gj = g[j];
  float lj = l[j];
  merge::apply_element(u, m, j, gj, mean, s, ss, lj);
  g[j] = gj;
  l[j] = lj;
}
/// The apply passes' element loop over a block's means, in a form compilers
/// vectorize: the update and the merge (already shifted to the block)
/// copied to locals (no store through a float* can change them, so their
/// branches leave the loop), the state's presence decided once, and the
/// arrays distinct (restrict). Each element's operations are
/// merge::apply_element's, in the same order, so the bits are too.
template <class U, class M>
DILOCO_HD DILOCO_FORCEINLINE void apply_elements(const U& update_, const M& merge_, float* DILOCO_RESTRICT g,
                                                 float* DILOCO_RESTRICT l, const float* DILOCO_RESTRICT mean,
                                                 std::size_t n, float* DILOCO_RESTRICT s, std::size_t ss) {
  const U u = update_;
  const M m = merge_;
  if (s == nullptr) {
    for (std::size_t j = 0; j < n; ++j) apply_element(u, m, j, g, l, mean[j], nullptr, 0);
  } else {
    for (std::size_t j = 0; j < n; ++j) apply_element(u, m, j, g, l, mean[j], s + j, ss);
  }
}

}  // namespace detail

/// The gathered (sparse) aggregation's last pass, per block: decode every
/// rank's encoding of the block, sum in rank order (deterministic), divide
/// by M, apply the outer optimizer and copy into the replica.
/// Bytes per element, chunk_topk 64/4096 int2 and Nesterov: read
/// M * 0.028 (the segments) + 8 (state, global), write 12 (state, global,
/// local). Its encode is encode_pseudo_gradient's: read 12, write 4 + 0.028.
template <class Codec, class Update, class Merge = merge::overwrite>
struct gathered_decode_apply {
  /// One call covers a block: the executor weighs its parallel threshold by it.
  static constexpr std::size_t elements_per_call = Codec::block;
  ///@{
  /// The pass's inputs: the codec, the outer optimizer's element step, the blocks, the replica's
  /// tensors, the M payloads, M, the bytes between blocks (the codec's stride), theta_global
  /// (flat), the outer optimizer's slots and their stride, the merge into the replica.
  Codec codec;
  Update update;
  const compress::block_ref* blocks;
  tensor_table tensors;
  const std::byte* const* payloads;  ///< M payloads, in rank order; block b at b * stride
  int world;
  std::size_t stride;
  float* global;
  float* state;
  std::size_t state_stride;
  Merge merge{};
  ///@}

  /// Block b: decoded from every payload, summed in rank order, divided by M, then the outer
  /// step and the merge. On the host, compiled for AVX2 too and chosen at run time
  /// (host_simd::enabled(): the same operations, no FMA, the same bits).
  DILOCO_HD void operator()(std::size_t b) const {
#if defined(DILOCO_HOST_SIMD_X86)
    if (host_simd::enabled()) return run_avx2(b);
#endif
    run(b);
  }
#if defined(DILOCO_HOST_SIMD_X86)
  /// run() compiled for AVX2.
  __attribute__((target("avx2"))) void run_avx2(std::size_t b) const { run(b); }
#endif
  /// Block b at the baseline ISA (what operator() runs).
  DILOCO_HD DILOCO_FORCEINLINE void run(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    const std::size_t off = tensors.offset[blk.tensor] + blk.start;
    float* local = tensors.local[blk.tensor] + blk.start;
    float acc[Codec::block];
    float dq[Codec::block];
    codec.decode(payloads[0] + b * stride, blk.len, acc);
    for (int k = 1; k < world; ++k) {
      codec.decode(payloads[k] + b * stride, blk.len, dq);
      for (std::size_t j = 0; j < blk.len; ++j) acc[j] += dq[j];
    }
    const auto m = static_cast<float>(world);
    for (std::size_t j = 0; j < blk.len; ++j) acc[j] = acc[j] / m;
    // decode_apply's loop over the means (the merge shifted to the block,
    // as decode_apply runs it), so it vectorizes as that pass does.
    const Merge mg = merge.shifted(off);
    float* DILOCO_RESTRICT g = global + off;
    float* DILOCO_RESTRICT l = local;
    float* const s = state == nullptr ? nullptr : state + off;
    if constexpr (eager_sgd<std::remove_cv_t<Merge>, std::remove_cv_t<Update>>) {
      if (eager_block<Codec::block>(update, mg, g, l, acc, blk.len, s)) return;
    }
    detail::apply_elements(update, mg, g, l, acc, blk.len, s, state_stride);
  }
};

/// Stage 6, per block: decode the averaged pseudo-gradient, apply the outer
/// optimizer to the global parameters and copy them into the replica.
/// Bytes per element, int8 and Nesterov: read ~9 (1 value, state, global),
/// write 12 (state, global, local).
template <class Codec, class Update, class Merge = merge::overwrite>
struct decode_apply {
  /// One call covers a block: the executor weighs its parallel threshold by it.
  static constexpr std::size_t elements_per_call = Codec::block;
  ///@{
  /// The pass's inputs: the codec, the outer optimizer's element step, the shard's blocks, the
  /// replica's tensors, the reduced payload, the bytes between blocks (the codec's stride),
  /// theta_global (flat), the outer optimizer's slots and their stride, the merge into the
  /// replica.
  Codec codec;
  Update update;
  const compress::block_ref* blocks;
  tensor_table tensors;
  const std::byte* payload;
  std::size_t stride;
  float* global;
  float* state;  ///< nullptr when the outer optimizer keeps none
  std::size_t state_stride;
  Merge merge{};  ///< how theta_global reaches the replica (kernels/merge.hpp)
  ///@}

  /// Block b: decoded, then the outer step and the merge. On the host, compiled for AVX2
  /// too and chosen at run time (host_simd::enabled(): the same operations, no FMA, the
  /// same bits).
  DILOCO_HD void operator()(std::size_t b) const {
#if defined(DILOCO_HOST_SIMD_X86)
    if (host_simd::enabled()) return run_avx2(b);
#endif
    run(b);
  }
#if defined(DILOCO_HOST_SIMD_X86)
  /// run() compiled for AVX2.
  __attribute__((target("avx2"))) void run_avx2(std::size_t b) const { run(b); }
#endif
  /// Block b at the baseline ISA (what operator() runs).
  DILOCO_HD DILOCO_FORCEINLINE void run(std::size_t b) const {
    const compress::block_ref blk = blocks[b];
    const std::size_t off = tensors.offset[blk.tensor] + blk.start;
    float dq[Codec::block];
    codec.decode(payload + b * stride, blk.len, dq);
    // The element loop in a form compilers vectorize: the update and the
    // merge copied to locals (no store through a float* can change them, so
    // their branches leave the loop), the state's presence decided once, and
    // the arrays distinct (restrict). Each element's operations are the
    // same, in the same order, so the bits are too.
    const Merge m = merge.shifted(off);
    float* DILOCO_RESTRICT g = global + off;
    float* DILOCO_RESTRICT l = tensors.local[blk.tensor] + blk.start;
    float* const s = state == nullptr ? nullptr : state + off;
    if constexpr (eager_sgd<std::remove_cv_t<Merge>, std::remove_cv_t<Update>>) {
      // Eager's element runs two outer steps, the worker's own and the
      // shared one, four invariant branches in all: their branch-free forms,
      // chosen here, let the loop vectorize (kernels/eager_block.hpp).
      if (eager_block<Codec::block>(update, m, g, l, dq, blk.len, s)) return;
    }
    detail::apply_elements(update, m, g, l, dq, blk.len, s, state_stride);
  }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
