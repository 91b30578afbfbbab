// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// One codec block: up to B consecutive elements of one tensor.
struct block_ref {
  std::uint32_t tensor;  ///< index in the parameter list
  std::uint32_t len;     ///< elements, <= B
  std::uint64_t start;   ///< first element within the tensor
};

/// The blocks of a parameter list (each tensor cut into blocks of B, the last
/// one partial) and their partition into M shards of nearly equal element
/// counts, on block boundaries. Shard k is reduced by rank k.
class block_layout {
 public:
  block_layout() = default;
  /// The blocks of tensors of these sizes (blocks of `block` elements, each tensor's last one
  /// partial), split into `shards` shards.
  block_layout(const std::vector<std::size_t>& tensor_sizes, std::size_t block, int shards) : shards_(shards) {
    if (block == 0 || shards < 1) diloco::detail::raise<config_error>("block_layout: block and shard count must be >= 1");
    for (std::size_t t = 0; t < tensor_sizes.size(); ++t) {
      for (std::size_t s = 0; s < tensor_sizes[t]; s += block) {
        const std::size_t len = std::min(block, tensor_sizes[t] - s);
        blocks_.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(len), s});
      }
      total_ += tensor_sizes[t];
    }
    // Block b goes to the shard where its first element falls in an even
    // split of the element range: contiguous, balanced within one block.
    first_.assign(static_cast<std::size_t>(shards) + 1, blocks_.size());
    elements_.assign(static_cast<std::size_t>(shards), 0);
    std::size_t before = 0;
    std::size_t shard = 0;
    first_[0] = 0;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const std::size_t owner = total_ ? before * static_cast<std::size_t>(shards) / total_ : 0;
      while (shard < owner) first_[++shard] = b;
      elements_[shard] += blocks_[b].len;
      before += blocks_[b].len;
    }
    while (shard + 1 < first_.size()) first_[++shard] = blocks_.size();
  }

  ///@{
  /// The number of shards, of elements over all tensors, and of blocks; the blocks in order;
  /// shard s's first block, block count and element count.
  int shards() const { return shards_; }
  std::size_t total() const { return total_; }
  std::size_t block_count() const { return blocks_.size(); }
  const block_ref* blocks() const { return blocks_.data(); }
  std::size_t first_block(int shard) const { return first_[static_cast<std::size_t>(shard)]; }
  std::size_t blocks_in(int shard) const {
    return first_[static_cast<std::size_t>(shard) + 1] - first_[static_cast<std::size_t>(shard)];
  }
  std::size_t elements_in(int shard) const { return elements_[static_cast<std::size_t>(shard)]; }
  ///@}

 private:
  int shards_ = 1;
  std::size_t total_ = 0;
  std::vector<block_ref> blocks_;
  std::vector<std::size_t> first_;     ///< shards + 1 entries
  std::vector<std::size_t> elements_;  ///< per shard
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
