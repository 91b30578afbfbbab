// Instantiates the generic element-wise kernel for each fused functor, so
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
