// SPDX-License-Identifier: Apache-2.0
#pragma once

// The launch geometry of the compression passes, as plain C++ (like
// launch_plan.hpp for the element-wise launcher): how team programs
// (kernels/compressed_blocks.hpp) map onto CUDA blocks, and how the payload
// checksum covers its segments. exec/cuda/team_kernels.cuh launches these;
// the host tests replay the same grids (test/cuda_grid_sim.hpp).

#include <algorithm>
#include <cstddef>

#include "diloco/exec/cuda/launch_plan.hpp"

namespace diloco::exec::grid {

/// Teams of at most a warp share a 256-thread block (several codec blocks
/// per CUDA block, the team max a warp reduction); a larger team is the
/// whole block (a block reduction).
template <class P>
struct team_plan {
  static constexpr unsigned team = P::team;  ///< threads per team (P::team): a power of two from 8 to 256
  static_assert(team >= 8 && team <= block_size && (team & (team - 1)) == 0,
                "a team is a power of two of 8 to 256 threads");
  /// Teams sharing one CUDA block (1 for a team larger than a warp).
  static constexpr unsigned teams_per_block = team <= 32 ? block_size / team : 1;
  static constexpr unsigned threads = team * teams_per_block;  ///< threads per CUDA block
  /// CUDA blocks for n codec blocks.
  static constexpr std::size_t blocks(std::size_t n) { return (n + teams_per_block - 1) / teams_per_block; }
};

/// A team program's phases between its load and its store (0 unless it
/// says P::phases): each runs after a barrier, p.phase(s, b, t, shared,
/// regs) for s = 0, 1, ... (the chunk_topk encode's selection,
/// kernels/topk_blocks.hpp).
template <class P>
inline constexpr unsigned team_phases = 0;
/// The phases a program declares.
template <class P>
  requires requires { P::phases; }
inline constexpr unsigned team_phases<P> = P::phases;

/// The checksum of several payloads at once: grid.y = segment, grid.x
/// blocks of 256 threads striding over its 8-byte words.
inline constexpr unsigned checksum_block = 256;
inline constexpr unsigned max_checksum_blocks = 1024;  ///< the grid.x cap of a checksum launch
/// The grid.x of a checksum launch: enough 256-thread blocks for the largest payload's words,
/// at most max_checksum_blocks.
constexpr unsigned checksum_blocks(std::size_t max_payload_bytes) {
  const std::size_t words = (max_payload_bytes + 7) / 8;
  const std::size_t blocks = (words + checksum_block - 1) / checksum_block;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, max_checksum_blocks));
}
/// The largest grid.y: the most segments one checksum launch covers.
inline constexpr std::size_t max_checksum_segments = 65535;

}  // namespace diloco::exec::grid
