// SPDX-License-Identifier: Apache-2.0
// Instantiates the generic element-wise kernel for each fused functor, and
// the team kernel for the compression passes that move fp32 arrays (encode
// with error feedback: global, replica, residual in, residual out;
// decode-apply: global and momentum in, global, momentum, replica out), so
// `nvcc -ptx` shows the code the GPU will run. check_ptx.cmake requires
// 128-bit global loads (ld.global.v4 or ld.global.nc.v4) and stores
// (st.global.v4) in every one of them.
#include <diloco/cuda.hpp>

namespace dc = diloco;
namespace k = dc::kernels;
using dc::exec::grid::plan;

template __global__ void dc::exec::kernel::for_each<k::inner_step<k::adamw_update>>(k::inner_step<k::adamw_update>,
                                                                                     plan);
template __global__ void dc::exec::kernel::for_each<k::inner_step<k::sgd_update>>(k::inner_step<k::sgd_update>, plan);
template __global__ void dc::exec::kernel::for_each<k::outer_apply<k::sgd_update>>(k::outer_apply<k::sgd_update>,
                                                                                    plan);
template __global__ void dc::exec::kernel::for_each<k::outer_apply_local<k::sgd_update>>(
    k::outer_apply_local<k::sgd_update>, plan);
template __global__ void dc::exec::kernel::for_each<k::copy>(k::copy, plan);
template __global__ void dc::exec::kernel::reduce<k::pseudo_gradient>(k::pseudo_gradient, plan, double*);

// The compression passes (kernels/compressed_blocks.hpp).
namespace cp = dc::compress;
using int8_elements = k::codec_elements<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>;
using int4_elements = k::codec_elements<cp::blockwise_codec<dc::int4, 128, cp::stochastic_rounding>>;
using bf16_elements = k::codec_elements<cp::cast_codec<dc::bf16, cp::round_nearest>>;
template __global__ void dc::exec::kernel::run_teams<k::encode_blocks<int8_elements>>(k::encode_blocks<int8_elements>,
                                                                                       std::size_t);
template __global__ void dc::exec::kernel::run_teams<k::encode_blocks<int4_elements>>(k::encode_blocks<int4_elements>,
                                                                                       std::size_t);
template __global__ void dc::exec::kernel::run_teams<k::encode_blocks<bf16_elements>>(k::encode_blocks<bf16_elements>,
                                                                                       std::size_t);
template __global__ void dc::exec::kernel::run_teams<k::decode_apply_blocks<int8_elements, k::sgd_update>>(
    k::decode_apply_blocks<int8_elements, k::sgd_update>, std::size_t);
template __global__ void dc::exec::kernel::run_teams<k::decode_apply_blocks<bf16_elements, k::sgd_update>>(
    k::decode_apply_blocks<bf16_elements, k::sgd_update>, std::size_t);
