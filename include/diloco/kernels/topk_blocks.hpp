// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "diloco/codec/block_layout.hpp"
#include "diloco/codec/chunk_topk.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/kernels/compressed_blocks.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/core/random.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// An add to a shared counter: an atomic on the device, a plain add in the
/// host replay (which runs one thread at a time).
DILOCO_HD DILOCO_FORCEINLINE void shared_add(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned*>(p), static_cast<unsigned>(v));
#else
  *p += v;
#endif
}

/// Which elements of a chunk each thread of its team owns.
template <class Codec>
struct topk_shape {
  static constexpr std::size_t chunk = Codec::block;  ///< elements per chunk
  static constexpr unsigned threads = team_threads(chunk);  ///< threads per team (team_threads)
  static constexpr std::size_t per = (chunk + threads - 1) / threads;  ///< consecutive elements each thread owns
  /// 16-byte accesses when a thread's range is whole groups of 4.
  static constexpr std::size_t W = per % vec_width == 0 ? vec_width : 1;
  /// The first element thread t owns.
  DILOCO_HD static constexpr std::size_t first(unsigned t) { return static_cast<std::size_t>(t) * per; }
};

/// The chunk_topk codecs the device passes take: the counts and positions
/// kept in shared memory bound the chunk.
template <class Codec>
inline constexpr bool topk_device_form = Codec::block <= 4096;

/// The encode pass of the gathered (sparse) round over device memory for
/// compress::chunk_topk; with topk_decode_apply_blocks, the round's two fused
/// passes, as team programs (kernels/compressed_blocks.hpp describes the
/// model): one team per chunk, thread t owning the `per` consecutive
/// elements [t * per, (t + 1) * per) of it. They are the device
/// form of kernels/compressed_passes.hpp's encode_pseudo_gradient and
/// gathered_decode_apply over chunk_topk_codec and give the same bytes and
/// the same fp32 results.
///
/// Encoding selects the K largest magnitudes of a chunk (ties to the lower
/// index) without sorting: a radix select over the 31-bit magnitude patterns
/// (|v| as bits; NaN above infinity, as on the host) finds the K-th largest
/// pattern T, 8 bits per pass, with a 256-bin histogram in shared memory;
/// then every element above T is kept and, of those equal to T, the ones of
/// lowest index until K are. A prefix count over the threads (their counts
/// in index order) gives each kept element its entry number, so the
/// positions come out strictly increasing as the codec lays them out. The
/// chunk's block is packed byte by byte from the entries in shared memory.
/// The program, each step after a barrier (kernels run them in order, the
/// host tests replay them thread by thread):
/// ```
/// load       v = (global - local) + residual; squares of delta
/// phase 0-7  4 radix passes: count digits (shared atomics), pick (thread 0)
/// phase 8    per-thread counts above / equal to T, and each thread's max
/// phase 9    thread 0: prefix counts over the threads, the chunk's amax
/// phase 10   quantize the kept elements into the entries, new residual,
///            squares of the error
/// store      pack the chunk's block byte by byte from the entries
/// lanes, publish   the norms' lanes and the chunk's sums
/// ```
/// Shared memory per chunk: 8 bytes per element for the norms' squares, 3
/// per kept entry, ~3 KB of counts; the device form takes chunks of at most
/// 4096 elements (SparseLoCo's).
///
/// Decoding binary-searches each sender's (increasing) positions for the
/// thread's range and sums the M decoded values per element in rank order,
/// adding the zeros of the chunks that did not keep the element as the host
/// does (so -0 + 0 gives +0 on both).
template <class Codec>
struct topk_encode_blocks {
  static_assert(topk_device_form<Codec>,
                "compress::chunk_topk over device tensors takes chunks of at most 4096 elements (the chunk's "
                "selection runs in shared memory)");
  using shape = topk_shape<Codec>;  ///< which elements each thread owns
  static constexpr std::size_t chunk = shape::chunk;  ///< elements per chunk
  static constexpr std::size_t per = shape::per;  ///< elements per thread
  static constexpr std::size_t W = shape::W;  ///< elements per access (4 when a thread's range is whole groups of 4)
  static constexpr std::size_t K = Codec::k;  ///< entries a full chunk keeps
  static constexpr unsigned team = shape::threads;  ///< threads per team
  static constexpr bool team_max = false;  ///< no team max (the amax comes from the selection)
  static constexpr std::size_t norms = 2;  ///< norms summed per chunk: ||delta||^2 and ||v - decoded||^2
  static constexpr unsigned lane_count = norm_scratch<chunk, 2>::lanes;  ///< threads that sum the norms' lanes
  static_assert(lane_count <= team, "every norm lane needs a thread of the team");
  static constexpr unsigned radix_passes = 4;  ///< 8-bit digits of the 31-bit magnitude patterns
  static constexpr unsigned phases = 2 * radix_passes + 3;  ///< the program's phases between load and store
  static constexpr unsigned bins = 256;  ///< histogram bins per radix pass

  /// What a thread keeps between the program's steps.
  struct registers {
    compress::block_ref blk;  ///< the chunk
    std::uint64_t offset;  ///< of the chunk in the flat buffers
    std::uint64_t index;   ///< of its first element in the packed order
    float v[per];          ///< v of the thread's elements
  };
  /// What the team shares while it selects and packs the chunk.
  struct shared {
    norm_scratch<chunk, 2> norm;  ///< the squares of delta and of the error, and their lanes
    std::uint32_t hist[bins];    ///< radix digits; then each thread's largest pattern
    std::uint32_t above[team];   ///< per thread: kept above T; then the entries before it
    std::uint32_t equal[team];   ///< per thread: equal to T; then those before it
    std::uint32_t threshold;     ///< T, as found so far (its high digits)
    std::uint32_t need;          ///< how many still to take at the current digit; then of those equal to T
    std::uint32_t amax_bits;  ///< the chunk's amax, as bits
    std::uint16_t position[K];  ///< the kept entries' positions
    std::uint8_t code[K];  ///< the kept entries' value codes
  };

  const compress::block_ref* blocks;  ///< the shard's chunks
  const device_tensor* tensors;  ///< the replica's tensors
  const float* global;    ///< theta_global, flat
  const float* residual;  ///< nullptr without error feedback
  float* new_residual;    ///< nullptr without error feedback
  std::byte* payload;     ///< block b at b * Codec::stride()
  std::uint64_t stream;   ///< the stochastic rounding stream
  sums2* sums;            ///< block b's sums at sums[b]
  float decay;            ///< error feedback: the new residual is decay * (v - decoded)
  bool vector;            ///< the replica's tensors are 16-byte aligned

  /// |x|'s 31-bit magnitude pattern (ordered like |x|, NaN above infinity).
  DILOCO_HD static std::uint32_t pattern(float x) { return float_bits(x) & 0x7fffffffu; }
  /// The end of thread t's range in a chunk of len elements.
  DILOCO_HD static std::size_t range_end(unsigned t, std::size_t len) {
    const std::size_t e = shape::first(t) + per;
    return e < len ? e : len;
  }

  /// Thread t's elements of chunk b: v and the squares of delta.
  DILOCO_HD std::int32_t load(std::size_t b, unsigned t, shared& sh, registers& r) const {
    r.blk = blocks[b];
    const device_tensor tt = tensors[r.blk.tensor];
    r.offset = tt.offset + r.blk.start;
    r.index = tt.index0 + r.blk.start;
    const std::size_t len = r.blk.len;
    const float* g = global + r.offset;
    const float* l = tt.local + r.blk.start;
    const float* e = residual ? residual + r.offset : nullptr;
    for (std::size_t k = 0; k < per; k += W) {
      const std::size_t j0 = shape::first(t) + k;
      float gv[W], lv[W], ev[W] = {};
      load_group(g, j0, len, true, gv);  // our buffers: aligned at every chunk
      load_group(l, j0, len, vector, lv);
      if (e) load_group(e, j0, len, true, ev);
      for (std::size_t i = 0; i < W; ++i) {
        const float d = sub_rn(gv[i], lv[i]);
        r.v[k + i] = e ? add_rn(d, ev[i]) : d;
        if (j0 + i < len) sh.norm.sq[0][j0 + i] = mul_rn(d, d);
      }
    }
    for (unsigned i = t; i < bins; i += team) sh.hist[i] = 0;
    if (t == 0) {
      sh.threshold = 0;
      sh.need = static_cast<std::uint32_t>(Codec::entries(len));
    }
    return 0;
  }

  /// Step s of the selection and quantization (the phases of the description above).
  DILOCO_HD void phase(unsigned s, std::size_t, unsigned t, shared& sh, registers& r) const {
    const std::size_t len = r.blk.len;
    const std::size_t j0 = shape::first(t), j1 = range_end(t, len);
    if (s < 2 * radix_passes) {
      const unsigned pass = s / 2;
      const unsigned shift = 24 - 8 * pass;
      const std::uint32_t high = pass == 0 ? 0u : ~std::uint32_t{0} << (32 - 8 * pass);
      if (s % 2 == 0) {  // count the digits of the elements that match T so far
        for (std::size_t j = j0; j < j1; ++j) {
          const std::uint32_t p = pattern(r.v[j - j0]);
          if ((p & high) == sh.threshold) shared_add(&sh.hist[(p >> shift) & (bins - 1)], 1);
        }
      } else if (t == 0) {  // the digit where the `need` largest end
        std::uint32_t seen = 0;
        for (unsigned d = bins; d-- > 0;) {
          if (seen + sh.hist[d] >= sh.need) {
            sh.threshold |= static_cast<std::uint32_t>(d) << shift;
            sh.need -= seen;
            break;
          }
          seen += sh.hist[d];
        }
        for (unsigned d = 0; d < bins; ++d) sh.hist[d] = 0;
      }
    } else if (s == 2 * radix_passes) {  // this thread's counts and largest pattern
      std::uint32_t above = 0, equal = 0, top = 0;
      for (std::size_t j = j0; j < j1; ++j) {
        const std::uint32_t p = pattern(r.v[j - j0]);
        above += p > sh.threshold;
        equal += p == sh.threshold;
        top = p > top ? p : top;
      }
      sh.above[t] = above;
      sh.equal[t] = equal;
      sh.hist[t] = top;
    } else if (s == 2 * radix_passes + 1) {
      if (t == 0) {  // the entries and the ties before each thread, in index order
        std::uint32_t entries = 0, ties = 0, top = 0;
        for (unsigned u = 0; u < team; ++u) {
          const std::uint32_t above = sh.above[u], equal = sh.equal[u];
          const std::uint32_t left = sh.need > ties ? sh.need - ties : 0;
          sh.above[u] = entries;
          sh.equal[u] = ties;
          entries += above + (equal < left ? equal : left);
          ties += equal;
          top = sh.hist[u] > top ? sh.hist[u] : top;
        }
        sh.amax_bits = top;
      }
    } else {
      quantize(t, sh, r);
    }
  }

  /// Phase 10: quantize the kept elements into the entries, the new
  /// residual, the squares of the error.
  DILOCO_HD void quantize(unsigned t, shared& sh, const registers& r) const {
    const std::size_t len = r.blk.len;
    const std::size_t j0 = shape::first(t), j1 = range_end(t, len);
    const float amax = bits_float(sh.amax_bits);
    std::uint32_t entry = sh.above[t], ties = sh.equal[t];
    float err[per] = {};
    for (std::size_t j = j0; j < j1; ++j) {
      const float v = r.v[j - j0];
      const std::uint32_t p = pattern(v);
      bool keep = p > sh.threshold;
      if (p == sh.threshold) keep = ties++ < sh.need;
      float dq = 0.0f;
      if (keep) {
        const float u = Codec::stochastic ? random_unit(stream, r.index + j) : 0.0f;
        unsigned code;
        Codec::encode_value(v, amax, u, code, dq);
        sh.position[entry] = static_cast<std::uint16_t>(j);
        sh.code[entry] = static_cast<std::uint8_t>(code);
        ++entry;
      }
      const float x = sub_rn(v, dq);
      err[j - j0] = decay == 1.0f ? x : mul_rn(decay, x);
      sh.norm.sq[1][j] = mul_rn(x, x);
    }
    if (new_residual) {
      float* out = new_residual + r.offset;
      for (std::size_t k = 0; k < per; k += W) {
        float x[W];
        for (std::size_t i = 0; i < W; ++i) x[i] = err[k + i];
        store_group_streaming(out, j0 + k, len, true, x);
      }
    }
  }

  /// The chunk's block, byte by byte across the team.
  DILOCO_HD void store(std::size_t b, unsigned t, shared& sh, registers& r, std::int32_t) const {
    const std::size_t n = Codec::entries(r.blk.len);
    std::byte* out = payload + b * Codec::stride();
    for (std::size_t y = t; y < Codec::stride(); y += team) pack_byte(y, sh, n, out);
  }

  /// Thread t's lane of the norms.
  DILOCO_HD void lanes(unsigned t, shared& sh, const registers& r) const { sh.norm.sum_lanes(t, r.blk.len); }
  /// One level of the lanes' tree (width w).
  DILOCO_HD void lanes_step(unsigned t, unsigned w, shared& sh) const { sh.norm.tree_step(t, w); }
  /// Chunk b's sums (thread 0).
  DILOCO_HD void publish(std::size_t b, const shared& sh) const { sums[b] = {sh.norm.total(0), sh.norm.total(1)}; }

  /// Byte y of the chunk's block: the amax, then the value codes and the
  /// positions as little-endian bit streams (fields past the chunk's
  /// entries, and padding bits, zero).
  DILOCO_HD void pack_byte(std::size_t y, const shared& sh, std::size_t n, std::byte* out) const {
    unsigned byte = 0;
    if (y < 4) {
      byte = (sh.amax_bits >> (8 * y)) & 0xffu;
    } else {
      const bool values = y < 4 + Codec::value_bytes;
      const int bits = values ? Codec::value_bits : Codec::index_bits;
      const std::size_t bit0 = 8 * (y - (values ? 4 : 4 + Codec::value_bytes));
      for (std::size_t f = bit0 / static_cast<std::size_t>(bits); f < n; ++f) {
        const std::size_t at = f * static_cast<std::size_t>(bits);
        if (at >= bit0 + 8) break;
        const std::uint64_t field = values ? sh.code[f] : sh.position[f];
        // The field's bits [at, at + bits) shifted to the byte's bit 0.
        byte |= static_cast<unsigned>(at >= bit0 ? field << (at - bit0) : field >> (bit0 - at));
      }
      byte &= 0xffu;
    }
    out[y] = static_cast<std::byte>(byte);
  }
};

/// The decode-apply pass: per chunk, the M senders' blocks decoded and
/// summed in rank order, divided by M, the outer step, copy-back. No shared
/// memory: each thread finds its range's entries in every block by binary
/// search over the (strictly increasing) positions.
template <class Codec, class Update, class Merge = merge::overwrite>
struct topk_decode_apply_blocks {
  static_assert(topk_device_form<Codec>,
                "compress::chunk_topk over device tensors takes chunks of at most 4096 elements");
  using shape = topk_shape<Codec>;                  ///< which elements each thread owns
  static constexpr std::size_t per = shape::per;    ///< elements per thread
  static constexpr unsigned team = shape::threads;  ///< threads per team
  static constexpr bool team_max = false;           ///< no team max
  static constexpr std::size_t norms = 0;           ///< no norms
  struct registers {};
  struct shared {};

  Update update;                     ///< the outer optimizer's element step
  const compress::block_ref* blocks;  ///< the shard's chunks
  const device_tensor* tensors;      ///< the replica's tensors
  const std::byte* const* payloads;  ///< M payloads, in rank order; block b at b * Codec::stride()
  int world;                         ///< M
  float* global;                     ///< theta_global, flat
  float* state;                      ///< nullptr when the outer optimizer keeps none
  std::size_t state_stride;          ///< elements between an element's slots
  Merge merge{};                     ///< how theta_global reaches the replica (kernels/merge.hpp)

  /// The first of a block's n entries whose position is at least j.
  DILOCO_HD static std::size_t first_entry(const std::byte* in, std::size_t n, std::size_t j) {
    std::size_t lo = 0, hi = n;
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (Codec::position(in, mid) < j)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  }

  /// Nothing to load.
  DILOCO_HD std::int32_t load(std::size_t, unsigned, shared&, registers&) const { return 0; }

  /// Thread t's range of chunk b: the M senders' values decoded and summed in rank order,
  /// divided by M, the outer step, the merge into the replica.
  DILOCO_HD void store(std::size_t b, unsigned t, shared&, registers&, std::int32_t) const {
    const compress::block_ref blk = blocks[b];
    const device_tensor tt = tensors[blk.tensor];
    const std::size_t off = tt.offset + blk.start;
    float* local = tt.local + blk.start;
    const std::size_t len = blk.len;
    const std::size_t j0 = shape::first(t);
    if (j0 >= len) return;
    const std::size_t j1 = j0 + per < len ? j0 + per : len;
    const std::size_t n = Codec::entries(len);
    float acc[per] = {};
    for (int k = 0; k < world; ++k) {
      const std::byte* in = payloads[k] + b * Codec::stride();
      const float amax = Codec::factor(in);
      float dq[per] = {};
      for (std::size_t e = first_entry(in, n, j0); e < n; ++e) {
        const std::size_t i = Codec::position(in, e);
        if (i >= j1) break;
        dq[i - j0] = Codec::decode_value(Codec::value_code(in, e), amax);
      }
      for (std::size_t j = j0; j < j1; ++j) acc[j - j0] = k == 0 ? dq[j - j0] : add_rn(acc[j - j0], dq[j - j0]);
    }
    const auto m = static_cast<float>(world);
    for (std::size_t j = j0; j < j1; ++j) {
      float g = global[off + j];
      float l = local[j];
      merge::apply_element(update, merge, off + j, g, acc[j - j0] / m, state ? state + off + j : nullptr, state_stride,
                           l);
      global[off + j] = g;
      local[j] = l;
    }
  }

  ///@{
  /// No norms.
  DILOCO_HD void lanes(unsigned, shared&, const registers&) const {}
  DILOCO_HD void publish(std::size_t, const shared&) const {}
  ///@}
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
