// SPDX-License-Identifier: Apache-2.0
#pragma once

// Multi-tensor passes: one pass over every tensor of a list, as one parallel
// region on the host and one launch on the GPU, instead of one per tensor.
//
// The elements of the tensors, concatenated in order (the model's element
// space: no padding), are cut into chunks of `chunk_elements`. A piece is the
// part of one tensor that falls in one chunk; `chunk_table` lists them chunk
// by chunk, built once per tensor list. A pass hands the executor a
// multi-tensor functor m with `bind(k)`, which returns tensor k's ordinary
// element functor (pointers moved to tensor k); the executor runs
// m.bind(tensor)(i) for every element of every piece.
//
// Reductions have one definition, whatever the layout, the thread count or
// the executor: in each chunk, lane l (0 <= l < chunk_lanes) adds the
// elements whose position in the chunk is congruent to l, in increasing
// position; the lanes are added pairwise (l += l + w for w = lanes/2, ...,
// 1); the chunks' sums are added in chunk order. One tensor or 4096 of the
// same elements give the same bits, and so do the host and the GPU (the
// block of a chunk is chunk_lanes threads, one per lane; see
// exec/cuda/chunk_kernels.cuh and the per-thread functions below, which the
// host tests replay).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/vec4.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::exec {

///@{
/// Elements per chunk, and lanes per chunk: part of every multi-tensor
/// reduction's definition (and the GPU's block size for these passes).
inline constexpr std::size_t chunk_elements = 8192;
inline constexpr unsigned chunk_lanes = 256;
///@}
static_assert(chunk_elements % chunk_lanes == 0 && (chunk_lanes & (chunk_lanes - 1)) == 0);

/// The part of tensor `tensor` in one chunk: its elements [begin, begin +
/// count), at positions [position, position + count) of the chunk.
struct piece {
  std::uint32_t tensor = 0;    ///< the tensor's index in the list
  std::uint32_t position = 0;  ///< where its elements start in the chunk
  std::size_t begin = 0;       ///< its first element in the chunk, counted from the tensor's start
  std::size_t count = 0;       ///< how many of its elements the chunk holds
};

/// A chunk table as a pass reads it (host or device memory): chunk c's
/// pieces are pieces[first[c]] .. pieces[first[c + 1] - 1].
struct chunk_view {
  const piece* pieces = nullptr;         ///< every chunk's pieces, chunk by chunk
  const std::uint32_t* first = nullptr;  ///< chunk c's first piece; first[chunks] ends the last chunk's
  std::size_t chunks = 0;                ///< the number of chunks
  std::size_t elements = 0;              ///< the number of elements over all tensors
};

/// The pieces of a list of tensors of the given sizes. Empty tensors have
/// none. Built on the host; a device pass uses a copy in device memory
/// (tensor/tensor_list.hpp).
class chunk_table {
 public:
  chunk_table() { first_.push_back(0); }
  /// The chunks of tensors of these sizes, in list order.
  explicit chunk_table(std::span<const std::size_t> sizes) {
    first_.push_back(0);
    std::size_t position = 0;  // in the current chunk
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::size_t begin = 0;
      while (begin < sizes[k]) {
        const std::size_t left = sizes[k] - begin, room = chunk_elements - position;
        const std::size_t count = left < room ? left : room;
        pieces_.push_back({static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(position), begin, count});
        begin += count;
        position += count;
        elements_ += count;
        if (position == chunk_elements) {
          first_.push_back(static_cast<std::uint32_t>(pieces_.size()));
          position = 0;
        }
      }
    }
    if (position > 0) first_.push_back(static_cast<std::uint32_t>(pieces_.size()));
  }

  ///@{
  /// The number of chunks and of elements; the pieces and each chunk's first piece (host
  /// memory); all of it as a chunk_view.
  std::size_t chunks() const { return first_.size() - 1; }
  std::size_t elements() const { return elements_; }
  const std::vector<piece>& pieces() const { return pieces_; }
  const std::vector<std::uint32_t>& first() const { return first_; }
  chunk_view view() const { return {pieces_.data(), first_.data(), chunks(), elements_}; }
  ///@}

 private:
  std::vector<piece> pieces_;
  std::vector<std::uint32_t> first_;
  std::size_t elements_ = 0;
};

/// The functor a multi-tensor pass M gives for one tensor (m.bind(k)).
template <class M>
using bound_t = decltype(std::declval<const M&>().bind(std::size_t{0}));
/// What a multi-tensor reduction sums for functor M: as double when tensor
/// k's functor returns a number, else as that functor's own type (a struct
/// of sums with += and a zero default).
template <class M>
using chunk_sum_t = std::conditional_t<std::is_arithmetic_v<std::invoke_result_t<const bound_t<M>&, std::size_t>>,
                                       double, std::invoke_result_t<const bound_t<M>&, std::size_t>>;

// ------------------------------------------------------ per-thread work
// What thread `lane` of the block of chunk c does, on the GPU and in the
// host tests' replay.

/// Element-wise: the lane's share of every piece, 4 elements at a time where
/// the bound functor has a 4-wide path and its pointers allow it (a scalar
/// head up to the first element whose index is a multiple of 4, groups of 4,
/// a scalar tail).
template <class M>
DILOCO_HD DILOCO_FORCEINLINE void chunk_for_each_lane(const M& m, const chunk_view& t, std::size_t c, unsigned lane) {
  for (std::uint32_t p = t.first[c]; p < t.first[c + 1]; ++p) {
    const piece pc = t.pieces[p];
    const auto f = m.bind(pc.tensor);
    std::size_t i = pc.begin, end = pc.begin + pc.count;
    if constexpr (requires { f.vec4(std::size_t{0}); f.vec4_aligned(); }) {
      if (f.vec4_aligned()) {
        const std::size_t aligned = (i + kernels::vec_width - 1) / kernels::vec_width * kernels::vec_width;
        const std::size_t head_end = aligned < end ? aligned : end;
        for (std::size_t j = i + lane; j < head_end; j += chunk_lanes) f(j);
        const std::size_t groups = (end - head_end) / kernels::vec_width;
        for (std::size_t g = lane; g < groups; g += chunk_lanes) f.vec4(head_end + g * kernels::vec_width);
        i = head_end + groups * kernels::vec_width;
      }
    }
    for (std::size_t j = i + lane; j < end; j += chunk_lanes) f(j);
  }
}

/// Reduction: the sum of the lane's elements of chunk c, in position order.
template <class M>
DILOCO_HD DILOCO_FORCEINLINE chunk_sum_t<M> chunk_reduce_lane(const M& m, const chunk_view& t, std::size_t c,
                                                              unsigned lane) {
  using R = chunk_sum_t<M>;
  R sum{};
  for (std::uint32_t p = t.first[c]; p < t.first[c + 1]; ++p) {
    const piece pc = t.pieces[p];
    const auto f = m.bind(pc.tensor);
    // The first element at a position congruent to `lane`.
    const std::size_t skip = (lane + chunk_lanes - pc.position % chunk_lanes) % chunk_lanes;
    for (std::size_t j = skip; j < pc.count; j += chunk_lanes) sum += static_cast<R>(f(pc.begin + j));
  }
  return sum;
}

/// One level of the lanes' pairwise sum over s[0, 2w): lane t < w adds
/// s[t + w] into s[t]. Levels w = chunk_lanes/2, ..., 1 (a barrier after
/// each on the GPU); s[0] is the chunk's sum.
template <class R>
DILOCO_HD DILOCO_FORCEINLINE void chunk_tree_step(R* s, unsigned lane, unsigned width) {
  if (lane < width) s[lane] += s[lane + width];
}

}  // namespace diloco::exec

DILOCO_EXACT_FP_END
