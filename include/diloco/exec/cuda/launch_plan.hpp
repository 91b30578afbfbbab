// SPDX-License-Identifier: Apache-2.0
#pragma once

// The index math of the CUDA launcher, as plain C++: how many blocks, which
// elements each thread visits, where the 4-wide path ends and the scalar
// tail begins, and the block reduction's steps. The kernels in
// exec/cuda/kernels.cuh are thin wrappers around the per-thread functions
// below; host tests run the same functions for every thread of a simulated
// grid, which is how we trust kernels we can compile but not run here.

#include <algorithm>
#include <concepts>
#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/vec4.hpp"

namespace diloco::exec::grid {

/// Threads per block. A power of two: the block reduction halves it.
inline constexpr unsigned block_size = 256;
/// Grid cap of element-wise passes: enough blocks to fill any current GPU
/// several times over; larger ranges loop (grid-stride).
inline constexpr unsigned max_blocks = 4096;
/// Grid cap of reductions. Fixed, not derived from the device, so the
/// partial sums and hence the result's bits depend only on the input.
inline constexpr unsigned max_reduce_blocks = 1024;

/// A functor with a 4-wide element-wise path (see kernels/vec4.hpp).
template <class F>
concept vectorized_map = requires(const F& f, std::size_t i) {
  { f.vec4(i) } -> std::same_as<void>;
  { f.vec4_aligned() } -> std::convertible_to<bool>;
};

/// A reducing functor with a 4-wide path returning the 4 values to sum.
template <class F>
concept vectorized_reduction = requires(const F& f, std::size_t i) {
  { f.vec4(i) } -> std::same_as<kernels::vec4f>;
  { f.vec4_aligned() } -> std::convertible_to<bool>;
};

/// The 4-wide path is taken only when the functor has one and every pointer
/// it touches is 16-byte aligned; otherwise every element goes scalar.
template <class F>
bool use_vector_path(const F& f) {
  if constexpr (vectorized_map<F> || vectorized_reduction<F>)
    return f.vec4_aligned();
  else
    return false;
}

/// One launch over n elements.
struct plan {
  std::size_t n = 0;         ///< elements
  bool vectorized = false;   ///< groups of 4 via vec4(), then a scalar tail
  std::size_t groups = 0;    ///< 4-wide groups: elements [0, 4 * groups)
  std::size_t tail_begin = 0;  ///< first element of the scalar part
  unsigned block = block_size;  ///< threads per block
  unsigned blocks = 0;       ///< 0: nothing to launch (n == 0)

  /// Threads in the grid.
  constexpr std::size_t threads() const { return static_cast<std::size_t>(blocks) * block; }
};

/// The launch for n elements. The work items are the 4-wide groups (or the
/// elements, when scalar); the tail's at most 3 elements go to the first
/// threads of the grid, so at least that many threads are launched.
constexpr plan make_plan(std::size_t n, bool vectorized, unsigned block = block_size, unsigned cap = max_blocks) {
  plan p;
  p.n = n;
  p.block = block;
  p.vectorized = vectorized;
  p.groups = vectorized ? n / kernels::vec_width : 0;
  p.tail_begin = p.groups * kernels::vec_width;
  const std::size_t items = vectorized ? std::max(p.groups, n - p.tail_begin) : n;
  const std::size_t blocks = (items + block - 1) / block;
  p.blocks = static_cast<unsigned>(std::min<std::size_t>(blocks, cap));
  return p;
}

/// What thread `thread` of `threads` does in an element-wise pass:
/// grid-stride over the 4-wide groups, then over the tail elements.
template <class F>
DILOCO_HD DILOCO_FORCEINLINE void for_each_thread(const F& f, const plan& p, std::size_t thread,
                                                  std::size_t threads) {
  std::size_t i = thread;
  if constexpr (vectorized_map<F>) {
    if (p.vectorized) {
      for (std::size_t g = thread; g < p.groups; g += threads) f.vec4(g * kernels::vec_width);
      i = p.tail_begin + thread;
    }
  }
  for (; i < p.n; i += threads) f(i);
}

/// The same visit for a reduction, returning this thread's sum in double,
/// accumulated in visiting order (4-wide groups lane by lane, then the tail).
template <class F>
DILOCO_HD DILOCO_FORCEINLINE double reduce_thread(const F& f, const plan& p, std::size_t thread,
                                                  std::size_t threads) {
  double sum = 0.0;
  std::size_t i = thread;
  if constexpr (vectorized_reduction<F>) {
    if (p.vectorized) {
      for (std::size_t g = thread; g < p.groups; g += threads) {
        const kernels::vec4f v = f.vec4(g * kernels::vec_width);
        for (std::size_t l = 0; l < kernels::vec_width; ++l) sum += static_cast<double>(v[l]);
      }
      i = p.tail_begin + thread;
    }
  }
  for (; i < p.n; i += threads) sum += static_cast<double>(f(i));
  return sum;
}

/// One level of the block's tree reduction over shared memory s[0, 2w):
/// thread t < w adds s[t + w] into s[t]. The kernel runs the levels
/// w = block/2, block/4, ..., 1 with a barrier after each; s[0] is the
/// block's sum, combined in a fixed order.
DILOCO_HD DILOCO_FORCEINLINE void tree_step(double* s, unsigned thread, unsigned width) {
  if (thread < width) s[thread] += s[thread + width];
}

/// The result of a reduction: the blocks' partial sums added in block order.
inline double sum_partials(const double* partials, unsigned blocks) {
  double total = 0.0;
  for (unsigned b = 0; b < blocks; ++b) total += partials[b];
  return total;
}

}  // namespace diloco::exec::grid
