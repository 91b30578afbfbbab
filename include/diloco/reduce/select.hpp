// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which reducer a compressor's pseudo-gradients travel through: the one the
// compressor names (its member alias template `reducer<Comm, Space, Exec>`:
// low_rank's factor exchanges, adaptive's switch over its rungs' reducers),
// else the one of its kind: the fp32 all-reduce for a lossless compressor,
// all-gather and sum for a block codec that says `gathered` (sparse:
// chunk_topk), the compressed mean's shard reduction for any other block
// codec (compress/concepts.hpp). The library's reducers are included here,
// so that the reducers its compressors name are complete where an engine
// is built.

#include <type_traits>

#include "diloco/compress/concepts.hpp"
#include "diloco/reduce/compressed.hpp"
#include "diloco/reduce/factored.hpp"
#include "diloco/reduce/fp32_mean.hpp"
#include "diloco/reduce/gathered.hpp"

namespace diloco::reduce {

namespace detail_select {
template <class Compressor, class Comm, class Space, class Exec>
consteval auto reducer_of() {
  if constexpr (compress::names_reducer<Compressor>)
    return std::type_identity<typename Compressor::template reducer<Comm, Space, Exec>>{};
  else if constexpr (Compressor::lossless)
    return std::type_identity<fp32_mean<Comm, Space, Exec>>{};
  else if constexpr (compress::gathered_v<Compressor>)
    return std::type_identity<gathered<Compressor, Comm, Space, Exec>>{};
  else
    return std::type_identity<compressed<Compressor, Comm, Space, Exec>>{};
}
}  // namespace detail_select

/// The reducer a compressor's pseudo-gradients travel through: the one it
/// names, else fp32_mean (lossless), gathered (a block codec that says
/// `gathered`) or compressed (any other block codec).
template <class Compressor, class Comm, class Space, class Exec>
using reducer_t = typename decltype(detail_select::reducer_of<Compressor, Comm, Space, Exec>())::type;

/// A lossy compressor's own reducer (adaptive's rungs are these): reducer_t.
template <class Compressor, class Comm, class Space, class Exec>
using lossy_reducer_t = reducer_t<Compressor, Comm, Space, Exec>;

}  // namespace diloco::reduce

#include "diloco/reduce/adaptive.hpp"
