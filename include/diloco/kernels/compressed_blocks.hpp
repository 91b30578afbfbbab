// SPDX-License-Identifier: Apache-2.0
#pragma once

// The compressed round's three fused passes over device memory, as team
// programs: a team of threads per codec block, each thread owning groups of
// 4 consecutive elements (2 when B is not a multiple of 4) and moving them
// with 16-byte accesses where the pointers allow. They are the device form
// of kernels/compressed_passes.hpp (the host reference) and produce the
// same bytes and the same fp32 results: every element goes through the same
// float operations (kernels/codec_elements.hpp, with core/exact_float.hpp
// where nvcc could fuse a product into a sum).
//
// A team program P runs, for each block b, on P::team threads t:
//   m = p.load(b, t, shared, regs)        read, and a contribution to the
//                                         team max (int32 |x| bit patterns)
//   m = max over the team's m             (P::team_max; CUB on the device)
//   p.store(b, t, shared, regs, m)        write
//   barrier; p.lanes(t < P::lane_count)   the norms' lanes (P::norms > 0)
//   barrier; p.lanes_step(t, w)           the lanes' tree, w = lane_count / 2, ..., 1
//   barrier; p.publish(t == 0, ...)       the block's sums
// exec/cuda/team_kernels.cuh is that sequence as a CUDA kernel; the host
// tests replay it thread by thread (test/cuda_grid_sim.hpp).
//
// The norms reproduce the host's order exactly: lane l of L = norm_lanes(B)
// sums the squares of elements l, l + L, ... in fp32 (lane_squares), the
// lanes meet in lane_tree's tree, and the per-block doubles are summed by the host
// executor's chunked order (kernels/wire_passes.hpp, chunk_lane_sums).

#include <cstddef>
#include <cstdint>

#include "diloco/codec/block_layout.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/kernels/codec_elements.hpp"
#include "diloco/kernels/compressed_passes.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/codec/float_formats.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/core/random.hpp"
#include "diloco/kernels/vec4.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Tensor t as the device passes see it.
struct device_tensor {
  float* local;          ///< the user's replica
  std::uint64_t offset;  ///< in the library's flat buffers (padded on the device)
  std::uint64_t index0;  ///< in the packed order of the host engine: seeds
                         ///< stochastic rounding, so both draw the same numbers
};

/// Threads per team for `units` units of work (a codec block's groups over
/// the groups each thread takes, team_shape's Per; a top-k chunk's
/// elements): rounded up to a power of two, at least 8 (the norms' lanes)
/// and at most 256 (larger blocks loop).
constexpr unsigned team_threads(std::size_t groups) {
  unsigned t = 8;
  while (t < groups && t < 256) t *= 2;
  return t;
}

/// How a team covers a block of E::block elements in groups of E::group,
/// each thread taking about `Per` groups (when the block has that many).
/// The passes with a team max and norms (encode, reduce) take 4: several
/// 16-byte loads in flight per thread, and the team's per-block work (the
/// block's descriptor, the team max, the norms' lanes and tree, which only
/// norm_lanes(B) threads run) shared by more elements. With one group per
/// thread at B = 128 on an H100 (bench_cuda_kernels, Nsight Compute) the
/// int8 encode and the shard reduce were bound by instruction issue (SM
/// throughput 79 % and 69 %, DRAM 44 % and 18 %); with 4, of the copy's
/// bandwidth: int8+EF 0.88 -> 0.90, int4+EF 0.87 -> 0.98, int8+EF at
/// B = 64 0.88 -> 0.99 and B = 1024 0.91 -> 1.0, int8 without EF 0.58 ->
/// 0.64, the reduce of 4 0.23 -> 0.25. Then (2026-11-27, same machine):
/// the factor's divisions once per block instead of per element, whole
/// blocks of a normal scale without per-element bounds or branches, the
/// team max by shuffles with warp barriers, 16-byte shared stores of the
/// squares, and every group's loads issued before any arithmetic (the
/// last alone took int8 without EF from 0.83 to 1.01: the group-by-group
/// loop had one group's loads in flight per thread, DRAM at 69 %): int8+EF
/// 0.91 -> 1.02-1.04, int8 0.65 -> 1.01-1.02, int4+EF 0.98 -> 1.03-1.04,
/// the reduce 0.25 -> 0.47. decode_apply, with no team work,
/// keeps 1 (it streams at the copy's rate so; with 2 at bf16 B = 64 nvcc
/// split its 16-byte stores). The team's size does not change the bits: the
/// amax is a max, and the norms' lanes are summed in norm_lanes(B)'s order
/// whichever thread holds the squares.
template <class E, std::size_t Per = 1>
struct team_shape {
  static constexpr std::size_t groups = E::block / E::group;  ///< groups per block
  /// Threads per team: team_threads of the block's groups / Per.
  static constexpr unsigned threads = team_threads((groups + Per - 1) / Per);
  static constexpr std::size_t groups_per_thread = (groups + threads - 1) / threads;  ///< groups each thread owns
  /// First element of a thread's k-th group: consecutive threads take
  /// consecutive groups, so a warp's accesses are contiguous.
  DILOCO_HD static constexpr std::size_t first(unsigned t, std::size_t k) { return (t + k * threads) * E::group; }
};

/// What a team shares: the squares of its block's elements for N norms, and
/// their lanes, summed as lane_squares<norm_lanes(B)> sums them: thread
/// t < lanes adds elements t, t + lanes, ... in order (consecutive threads
/// read consecutive words: no bank conflicts), then the team runs
/// lane_tree's levels, one per barrier (tree_step(t, w) for w = lanes / 2,
/// ..., 1).
template <std::size_t B, std::size_t N>
struct norm_scratch {
  /// Threads that sum the lanes: norm_lanes(B).
  static constexpr unsigned lanes = static_cast<unsigned>(norm_lanes(B));
  alignas(B % 4 == 0 ? 16 : 4) float sq[N][B];  ///< sq[n][j]: norm n's square of element j
  float lane[N][lanes];  ///< lane[n][l]: norm n's lane l

  /// Norm n's squares x of elements [j0, j0 + W), those below len: one 16-byte store on the
  /// device when W is 4 and all are below len (j0 is a multiple of W).
  template <std::size_t W>
  DILOCO_HD DILOCO_FORCEINLINE void put(std::size_t n, unsigned j0, unsigned len, const float (&x)[W]) {
#if defined(__CUDA_ARCH__)
    if constexpr (W == 4 && B % 4 == 0) {
      if (j0 + 4 <= len) {
        *reinterpret_cast<float4*>(&sq[n][j0]) = make_float4(x[0], x[1], x[2], x[3]);
        return;
      }
    }
#endif
    for (unsigned i = 0; i < W && j0 + i < len; ++i) sq[n][j0 + i] = x[i];
  }
  /// Thread t's lane of every norm (t < lanes): elements t, t + lanes, ... below len, in order.
  DILOCO_HD void sum_lanes(unsigned t, unsigned len) {
    if (len == B)
      sum_lanes_below<true>(t, len);  // a whole block: a fixed count, unrolled
    else
      sum_lanes_below<false>(t, len);
  }
  /// sum_lanes, with len == B when Whole.
  template <bool Whole>
  DILOCO_HD DILOCO_FORCEINLINE void sum_lanes_below(unsigned t, unsigned len) {
    const unsigned n_end = Whole ? static_cast<unsigned>(B) : len;
    for (std::size_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (unsigned j = t; j < n_end; j += lanes) acc = add_rn(acc, sq[n][j]);
      lane[n][t] = acc;
    }
  }
  /// One level of the lanes' tree: lane t (t < w) adds lane t + w.
  DILOCO_HD void tree_step(unsigned t, unsigned w) {
    if (t < w)
      for (std::size_t n = 0; n < N; ++n) lane[n][t] = add_rn(lane[n][t], lane[n][t + w]);
  }
  /// Norm n's block sum, once the tree is done.
  DILOCO_HD double total(std::size_t n) const { return static_cast<double>(lane[n][0]); }
};
template <std::size_t B>
struct norm_scratch<B, 0> {};

/// Four floats written once and read back only in a later pass (the next
/// round's residual): a streaming 16-byte store (st.global.cs.v4, through an
/// intrinsic the compiler keeps whole) on the device.
DILOCO_HD DILOCO_FORCEINLINE void store4_streaming(float* p, const vec4f& v) {
#if defined(__CUDA_ARCH__)
  __stcs(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
#else
  store4(p, v);
#endif
}

/// W floats of p[j0, j0 + W), zeros past len; one 16-byte load when W is 4,
/// the group is whole and `vector` says p is 16-byte aligned (and the
/// store's mirror image).
template <std::size_t W, class Index>
DILOCO_HD DILOCO_FORCEINLINE void load_group(const float* p, Index j0, Index len, bool vector, float (&x)[W]) {
  if constexpr (W == vec_width) {
    if (vector && j0 + W <= len) {
      const vec4f v = load4_readonly(p + j0);
      for (std::size_t i = 0; i < W; ++i) x[i] = v[i];
      return;
    }
  }
  for (Index i = 0; i < W; ++i) x[i] = j0 + i < len ? p[j0 + i] : 0.0f;
}
/// The store of load_group: p[j0, j0 + W) below len, with one streaming 16-byte store when W
/// is 4, the group whole and p aligned.
template <std::size_t W, class Index>
DILOCO_HD DILOCO_FORCEINLINE void store_group_streaming(float* p, Index j0, Index len, bool vector,
                                                        const float (&x)[W]) {
  if constexpr (W == vec_width) {
    if (vector && j0 + W <= len) {
      store4_streaming(p + j0, {{x[0], x[1], x[2], x[3]}});
      return;
    }
  }
  for (Index i = 0; i < W && j0 + i < len; ++i) p[j0 + i] = x[i];
}

/// |x|'s bits as an int32 (ordered like |x| for non-negative floats: the team max runs on
/// them).
DILOCO_HD DILOCO_FORCEINLINE std::int32_t magnitude_bits(float x) {
  return static_cast<std::int32_t>(float_bits(x) & 0x7fffffffu);
}

/// The store of a block whose codes are scaled by its amax (encode_blocks,
/// reduce_blocks): the factor (thread 0), then the program's
/// store_groups<true> for a whole block with a normal scale (no per-element
/// bounds or branches: the common case), else store_groups<false>. The
/// factor's divisions are made once, in E::terms.
template <class E, class P, class Shared, class Registers>
DILOCO_HD DILOCO_FORCEINLINE void store_scaled(const P& p, std::byte* out, unsigned t, Shared& sh, Registers& r,
                                               std::int32_t max_bits) {
  const float amax = bits_float(static_cast<std::uint32_t>(max_bits));
  const auto terms = E::terms(amax);
  if (t == 0) E::put_factor(out, amax);
  if (r.blk.len == E::block && E::normal(terms))
    p.template store_groups<true>(t, sh, r, terms, out);
  else
    p.template store_groups<false>(t, sh, r, terms, out);
}

/// Stage 1, per block of a shard: v = (global - local) + residual, encoded
/// into the shard's segment; the new residual v - decode(encode(v)) with
/// error feedback. Sums: (||delta||^2, ||v - decoded||^2) of the block.
/// Bytes per element, int8 with error feedback: read 12 (global, local,
/// residual: 16-byte loads), write 5 + 4/B (code, new residual: 16-byte
/// streaming stores, the factor); int4: 4.5 + 4/B written; bf16/fp16: 6
/// written. Without error feedback: read 8, write 1 + 4/B (int8).
template <class E>
struct encode_blocks {
  using shape = team_shape<E, 4>;  ///< how the team covers a block (about 4 groups a thread)
  static constexpr unsigned team = shape::threads;  ///< threads per team
  static constexpr bool team_max = E::scaled;  ///< whether load()'s values meet in a team max (the block's amax)
  static constexpr std::size_t norms = 2;  ///< norms summed per block: ||delta||^2 and ||v - decoded||^2
  static constexpr std::size_t W = E::group;  ///< elements per group
  // load_group(global/residual, ..., true): blocks start at multiples of B.
  static_assert(W != vec_width || E::block % vec_width == 0, "16-byte groups need blocks of a multiple of 4");
  /// What a thread keeps between load() and store().
  struct registers {
    compress::block_ref blk;  ///< the block
    std::uint64_t offset;  ///< of the block in the flat buffers
    std::uint64_t index;   ///< of its first element in the packed order
    float v[shape::groups_per_thread * W];  ///< v of the thread's groups
  };
  using shared = norm_scratch<E::block, norms>;          ///< the team's shared memory: the norms' squares and lanes
  static constexpr unsigned lane_count = shared::lanes;  ///< threads that sum the norms' lanes
  static_assert(lane_count <= team, "every norm lane needs a thread of the team");

  const compress::block_ref* blocks;  ///< the shard's first block
  const device_tensor* tensors;  ///< the replica's tensors
  const float* global;  ///< theta_global, flat
  const float* residual;  ///< nullptr without error feedback
  float* new_residual;    ///< nullptr without error feedback
  std::byte* payload;     ///< the shard's payload; block b at b * E::stride
  std::uint64_t stream;  ///< the stochastic rounding stream
  sums2* sums;            ///< block b's sums at sums[b]
  bool vector;            ///< the replica's tensors are 16-byte aligned (and W == 4)

  /// Thread t's part of block b: v and its squares; returns its share of the team max (|v|
  /// bits).
  DILOCO_HD std::int32_t load(std::size_t b, unsigned t, shared& sh, registers& r) const {
    r.blk = blocks[b];
    const device_tensor tt = tensors[r.blk.tensor];
    r.offset = tt.offset + r.blk.start;
    r.index = tt.index0 + r.blk.start;
    const float* g = global + r.offset;
    const float* l = tt.local + r.blk.start;
    const float* e = residual ? residual + r.offset : nullptr;
    // A whole block (all but each tensor's last) runs without per-element bounds.
    return r.blk.len == E::block ? load_groups<true>(t, sh, r, g, l, e) : load_groups<false>(t, sh, r, g, l, e);
  }
  /// load's groups; Whole: the block has E::block elements.
  template <bool Whole>
  DILOCO_HD DILOCO_FORCEINLINE std::int32_t load_groups(unsigned t, shared& sh, registers& r, const float* g,
                                                        const float* l, const float* e) const {
    const unsigned len = Whole ? static_cast<unsigned>(E::block) : r.blk.len;
    constexpr std::size_t G = shape::groups_per_thread;
    // Every group's loads first, then the arithmetic: all of a thread's
    // bytes are in flight at once (a loop that loads and computes group by
    // group waits on each group's loads in turn).
    float gv[G][W], lv[G][W], ev[G][W] = {};
    for (std::size_t k = 0; k < G; ++k) {
      const unsigned j0 = static_cast<unsigned>(shape::first(t, k));
      load_group(g, j0, len, true, gv[k]);  // our buffers: aligned at every block
      load_group(l, j0, len, vector, lv[k]);
      if (e) load_group(e, j0, len, true, ev[k]);
    }
    std::int32_t m = 0;
    for (std::size_t k = 0; k < G; ++k) {
      const unsigned j0 = static_cast<unsigned>(shape::first(t, k));
      float sq[W];
      for (unsigned i = 0; i < W; ++i) {
        const unsigned j = j0 + i;
        const float d = sub_rn(gv[k][i], lv[k][i]);
        const float v = e ? add_rn(d, ev[k][i]) : d;
        r.v[k * W + i] = v;  // 0 past len
        sq[i] = mul_rn(d, d);
        if (j < len) {
          const std::int32_t bits = magnitude_bits(v);
          m = bits > m ? bits : m;
        }
      }
      if (j0 < len) sh.put(0, j0, len, sq);
    }
    return m;
  }

  /// Thread t's part of block b's output: the codes (and the factor, thread 0) against the
  /// block's amax, and the new residual.
  DILOCO_HD void store(std::size_t b, unsigned t, shared& sh, registers& r, std::int32_t max_bits) const {
    store_scaled<E>(*this, payload + b * E::stride, t, sh, r, max_bits);
  }
  /// store's groups; Fast: a whole block, E::normal(terms).
  template <bool Fast>
  DILOCO_HD DILOCO_FORCEINLINE void store_groups(unsigned t, shared& sh, registers& r,
                                                 const typename E::factor_terms& terms, std::byte* out) const {
    const unsigned len = Fast ? static_cast<unsigned>(E::block) : r.blk.len;
    for (std::size_t k = 0; k < shape::groups_per_thread; ++k) {
      const unsigned j0 = static_cast<unsigned>(shape::first(t, k));
      if (j0 >= E::block) break;
      typename E::code q[W];
      float err[W], sq[W];
      for (unsigned i = 0; i < W; ++i) {
        const unsigned j = j0 + i;
        q[i] = 0;  // a partial block's padding codes are zero
        err[i] = 0.0f;
        sq[i] = 0.0f;
        if (j < len) {
          const float v = r.v[k * W + i];
          const float u = E::stochastic ? random_unit(stream, r.index + j) : 0.0f;
          float dq;
          if constexpr (Fast)
            E::encode_normal(v, terms, u, q[i], dq);
          else
            E::encode(v, terms, u, q[i], dq);
          err[i] = sub_rn(v, dq);
          sq[i] = mul_rn(err[i], err[i]);
        }
      }
      if (j0 < len) sh.put(1, j0, len, sq);
      E::put_codes(out, j0, q);
      if (new_residual) store_group_streaming(new_residual + r.offset, j0, len, true, err);
    }
  }

  /// Thread t's lane of the norms.
  DILOCO_HD void lanes(unsigned t, shared& sh, const registers& r) const { sh.sum_lanes(t, r.blk.len); }
  /// One level of the lanes' tree (width w).
  DILOCO_HD void lanes_step(unsigned t, unsigned w, shared& sh) const { sh.tree_step(t, w); }
  /// Block b's sums (thread 0).
  DILOCO_HD void publish(std::size_t b, const shared& sh) const { sums[b] = {sh.total(0), sh.total(1)}; }
};

/// Stages 3 and 4, per block of this rank's shard: decode the M received
/// encodings, sum them in rank order, divide by M, re-encode into the
/// reduced segment. Sums: (||decoded mean||^2, 0).
/// Bytes per element, int8: read M (codes) + 4M/B (factors), write 1 + 4/B.
template <class E>
struct reduce_blocks {
  using shape = team_shape<E, 4>;  ///< how the team covers a block (about 4 groups a thread)
  static constexpr unsigned team = shape::threads;  ///< threads per team
  static constexpr bool team_max = E::scaled;  ///< whether load()'s values meet in a team max (the block's amax)
  static constexpr std::size_t norms = 1;  ///< norms summed per block: ||decoded mean||^2
  static constexpr std::size_t W = E::group;  ///< elements per group
  // load_group(global/residual, ..., true): blocks start at multiples of B.
  static_assert(W != vec_width || E::block % vec_width == 0, "16-byte groups need blocks of a multiple of 4");
  /// What a thread keeps between load() and store().
  struct registers {
    compress::block_ref blk;  ///< the block
    std::uint64_t index;  ///< its first element in the packed order
    float v[shape::groups_per_thread * W];  ///< the mean of the thread's groups
  };
  using shared = norm_scratch<E::block, norms>;          ///< the team's shared memory: the norm's squares and lanes
  static constexpr unsigned lane_count = shared::lanes;  ///< threads that sum the norm's lanes
  static_assert(lane_count <= team, "every norm lane needs a thread of the team");

  const compress::block_ref* blocks;  ///< this rank's shard's first block
  const device_tensor* tensors;       ///< the replica's tensors
  const std::byte* const* received;   ///< the M payloads of this shard, in rank order
  int world;                          ///< M
  std::byte* payload;                 ///< the reduced segment's payload
  std::uint64_t stream;               ///< the stochastic rounding stream
  sums2* sums;                        ///< block b's sums at sums[b]

  /// Thread t's part of block b: the mean of the M decoded encodings; returns its share of the
  /// team max (|mean| bits).
  DILOCO_HD std::int32_t load(std::size_t b, unsigned t, shared&, registers& r) const {
    r.blk = blocks[b];
    r.index = tensors[r.blk.tensor].index0 + r.blk.start;
    return r.blk.len == E::block ? load_groups<true>(b, t, r) : load_groups<false>(b, t, r);
  }
  /// Source src's decoded codes added to thread t's sums (the first source's are the sums);
  /// Plain: E::plain(terms).
  template <bool Plain>
  DILOCO_HD DILOCO_FORCEINLINE void add_source(unsigned t, unsigned len, int src, const std::byte* in,
                                               const typename E::factor_terms& terms,
                                               float (&acc)[shape::groups_per_thread][W]) const {
    for (std::size_t k = 0; k < shape::groups_per_thread; ++k) {
      const unsigned j0 = static_cast<unsigned>(shape::first(t, k));
      if (j0 >= len) break;
      typename E::code q[W];
      E::codes(in, j0, q);
      for (unsigned i = 0; i < W; ++i) {
        const float x = Plain ? E::decode_plain(q[i], terms) : E::decode(q[i], terms);
        acc[k][i] = src == 0 ? x : add_rn(acc[k][i], x);
      }
    }
  }
  /// load's groups; Whole: the block has E::block elements.
  template <bool Whole>
  DILOCO_HD DILOCO_FORCEINLINE std::int32_t load_groups(std::size_t b, unsigned t, registers& r) const {
    const unsigned len = Whole ? static_cast<unsigned>(E::block) : r.blk.len;
    const float m_float = static_cast<float>(world);
    // Each element's sum runs over the sources in rank order; sources are
    // the outer loop so each block's factor is read and worked out once.
    float acc[shape::groups_per_thread][W] = {};
    for (int src = 0; src < world; ++src) {
      const std::byte* in = received[src] + b * E::stride;
      const auto terms = E::terms(E::factor(in));
      if (E::plain(terms))
        add_source<true>(t, len, src, in, terms, acc);
      else
        add_source<false>(t, len, src, in, terms, acc);
    }
    std::int32_t m = 0;
    for (std::size_t k = 0; k < shape::groups_per_thread; ++k) {
      const unsigned j0 = static_cast<unsigned>(shape::first(t, k));
      for (unsigned i = 0; i < W; ++i) {
        const float mean = j0 + i < len ? acc[k][i] / m_float : 0.0f;
        r.v[k * W + i] = mean;
        if (j0 + i < len) {
          const std::int32_t bits = magnitude_bits(mean);
          m = bits > m ? bits : m;
        }
      }
    }
    return m;
  }

  /// Thread t's part of block b's output: the re-encoded mean (and the factor, thread 0).
  DILOCO_HD void store(std::size_t b, unsigned t, shared& sh, registers& r, std::int32_t max_bits) const {
    store_scaled<E>(*this, payload + b * E::stride, t, sh, r, max_bits);
  }
  /// store's groups; Fast: a whole block, E::normal(terms).
  template <bool Fast>
  DILOCO_HD DILOCO_FORCEINLINE void store_groups(unsigned t, shared& sh, registers& r,
                                                 const typename E::factor_terms& terms, std::byte* out) const {
    const unsigned len = Fast ? static_cast<unsigned>(E::block) : r.blk.len;
    for (std::size_t k = 0; k < shape::groups_per_thread; ++k) {
      const unsigned j0 = static_cast<unsigned>(shape::first(t, k));
      if (j0 >= E::block) break;
      typename E::code q[W];
      float sq[W];
      for (unsigned i = 0; i < W; ++i) {
        const unsigned j = j0 + i;
        q[i] = 0;
        sq[i] = 0.0f;
        if (j < len) {
          const float u = E::stochastic ? random_unit(stream, r.index + j) : 0.0f;
          float dq;
          if constexpr (Fast)
            E::encode_normal(r.v[k * W + i], terms, u, q[i], dq);
          else
            E::encode(r.v[k * W + i], terms, u, q[i], dq);
          sq[i] = mul_rn(dq, dq);
        }
      }
      if (j0 < len) sh.put(0, j0, len, sq);
      E::put_codes(out, j0, q);
    }
  }

  /// Thread t's lane of the norm.
  DILOCO_HD void lanes(unsigned t, shared& sh, const registers& r) const { sh.sum_lanes(t, r.blk.len); }
  /// One level of the lanes' tree (width w).
  DILOCO_HD void lanes_step(unsigned t, unsigned w, shared& sh) const { sh.tree_step(t, w); }
  /// Block b's sums (thread 0).
  DILOCO_HD void publish(std::size_t b, const shared& sh) const { sums[b] = {sh.total(0), 0.0}; }
};

/// Stage 7, per block of one shard's reduced segment: decode the averaged
/// pseudo-gradient, apply the outer optimizer to theta_global, copy it into
/// the replica. No team work: every group is independent.
/// Bytes per element, int8 and Nesterov: read 9 + 4/B (code, global,
/// momentum: 16-byte loads), write 12 (global, momentum, local: 16-byte
/// stores).
template <class E, class Update, class Merge = merge::overwrite>
struct decode_apply_blocks {
  using shape = team_shape<E>;  ///< how the team covers a block
  static constexpr unsigned team = shape::threads;  ///< threads per team
  static constexpr bool team_max = false;  ///< no team max
  static constexpr std::size_t norms = 0;  ///< no norms
  static constexpr std::size_t W = E::group;  ///< elements per group
  // load_group(global/residual, ..., true): blocks start at multiples of B.
  static_assert(W != vec_width || E::block % vec_width == 0, "16-byte groups need blocks of a multiple of 4");
  struct registers {};
  using shared = norm_scratch<E::block, norms>;  ///< no shared memory

  Update update;                      ///< the outer optimizer's element step
  const compress::block_ref* blocks;  ///< the shard's first block
  const device_tensor* tensors;       ///< the replica's tensors
  const std::byte* payload;           ///< the shard's reduced payload
  float* global;                      ///< theta_global, flat
  float* state;                       ///< nullptr when the outer optimizer keeps none
  std::size_t state_stride;           ///< elements between an element's slots
  bool vector;                        ///< replica, global and state all allow 16-byte accesses (and W == 4)
  Merge merge{};                      ///< how theta_global reaches the replica (kernels/merge.hpp)

  /// Nothing to load: every group is independent.
  DILOCO_HD std::int32_t load(std::size_t, unsigned, shared&, registers&) const { return 0; }

  /// Thread t's groups of block b: decode, outer step, merge into the replica.
  DILOCO_HD void store(std::size_t b, unsigned t, shared&, registers&, std::int32_t) const {
    const compress::block_ref blk = blocks[b];
    const device_tensor tt = tensors[blk.tensor];
    const std::size_t off = tt.offset + blk.start;
    float* local = tt.local + blk.start;
    const std::size_t len = blk.len;
    const std::byte* in = payload + b * E::stride;
    const auto terms = E::terms(E::factor(in));
    for (std::size_t k = 0; k < shape::groups_per_thread; ++k) {
      const std::size_t j0 = shape::first(t, k);
      if (j0 >= len) break;
      typename E::code q[W];
      E::codes(in, j0, q);
      float dq[W];
      for (std::size_t i = 0; i < W; ++i) dq[i] = E::plain(terms) ? E::decode_plain(q[i], terms) : E::decode(q[i], terms);
      if constexpr (W == vec_width && vectorizable_update<Update> && Merge::is_overwrite) {
        if (vector && j0 + W <= len) {
          vec4f x = load4(global + off + j0);
          update4(update, x, {{dq[0], dq[1], dq[2], dq[3]}}, state ? state + off + j0 : nullptr, state_stride);
          store4(global + off + j0, x);
          store4(local + j0, x);
          continue;
        }
      }
      for (std::size_t i = 0; i < W && j0 + i < len; ++i) {
        const std::size_t j = j0 + i;
        float g = global[off + j];
        float l = local[j];
        merge::apply_element(update, merge, off + j, g, dq[i], state ? state + off + j : nullptr, state_stride, l);
        global[off + j] = g;
        local[j] = l;
      }
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
