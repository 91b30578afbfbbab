// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which reducer a compressor's pseudo-gradients travel through: the fp32
// all-reduce for lossless compressors, the factor exchanges for low_rank,
// all-gather and sum for sparse ones (chunk_topk), adaptive's switch over
// its rungs' reducers, else the compressed mean's shard reduction.

#include <type_traits>

#include "diloco/compress/codec.hpp"
#include "diloco/reduce/compressed.hpp"
#include "diloco/reduce/factored.hpp"
#include "diloco/reduce/fp32_mean.hpp"
#include "diloco/reduce/gathered.hpp"

namespace diloco::reduce {

/// A lossy compressor's own reducer (adaptive's rungs are these).
template <class Compressor, class Comm, class Space, class Exec>
using lossy_reducer_t = std::conditional_t<
    compress::factored_compressor<Compressor>, factored<Compressor, Comm, Space, Exec>,
    std::conditional_t<compress::gathered_v<Compressor>, gathered<Compressor, Comm, Space, Exec>,
                       compressed<Compressor, Comm, Space, Exec>>>;

template <class Compressor, class Comm, class Space, class Exec>
class adaptive;

/// The reducer a compressor's pseudo-gradients travel through: fp32_mean for lossless
/// compressors, adaptive for switching ones, else the compressor's own (lossy_reducer_t).
template <class Compressor, class Comm, class Space, class Exec>
using reducer_t = std::conditional_t<
    Compressor::lossless, fp32_mean<Comm, Space, Exec>,
    std::conditional_t<compress::switching_compressor<Compressor>, adaptive<Compressor, Comm, Space, Exec>,
                       lossy_reducer_t<Compressor, Comm, Space, Exec>>>;

}  // namespace diloco::reduce

#include "diloco/reduce/adaptive.hpp"
