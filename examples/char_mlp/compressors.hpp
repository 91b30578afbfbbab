// SPDX-License-Identifier: Apache-2.0
#pragma once

// The compressors the examples compare, by the short names of the demo's
// --compress list, as types (the demo picks one at run time, the sweep and
// the GPT example list them at compile time), with the options each runs
// with (compressor_options).

#include <diloco/diloco.hpp>
#include <type_traits>

namespace char_mlp::compressors {

namespace cp = diloco::compress;

using none = cp::none;
using bf16 = cp::cast<diloco::bf16>;
using int8 = cp::error_feedback<cp::blockwise<diloco::int8>>;
using int4 = cp::error_feedback<cp::blockwise<diloco::int4>>;
using fp8 = cp::error_feedback<cp::blockwise<diloco::fp8_e4m3>>;
using fp8e5m2 = cp::error_feedback<cp::blockwise<diloco::fp8_e5m2>>;
using fp4 = cp::error_feedback<cp::blockwise<diloco::fp4_e3m0>>;
using int2 = cp::error_feedback<cp::blockwise<diloco::int2>>;
// SparseLoCo: 64 of every 4096 values, as int2, error feedback with decay.
using sparseloco = cp::error_feedback<cp::chunk_topk<4096, 64, diloco::int2>>;
// int8, int4 or int2 per round: the most accurate whose link time fits the inner phase.
using adaptive = cp::adaptive<int8, int4, int2>;
using topk = cp::error_feedback<cp::topk<>>;
// PowerSGD-style rank-4 factors of every matrix (vectors travel exactly).
using low_rank = cp::low_rank;

// The options a compressor runs with: its defaults, SparseLoCo's error
// feedback decay (`feedback_decay`, SparseLoCo's 0.95) and top-k's 10%.
template <class C>
typename C::options compressor_options(float feedback_decay) {
  if constexpr (std::is_same_v<C, sparseloco>)
    return {.decay = feedback_decay};
  else if constexpr (std::is_same_v<C, topk>)
    return {.fraction = 0.1f};
  else
    return {};
}

}  // namespace char_mlp::compressors
