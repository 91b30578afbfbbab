#pragma once

// Float operations rounded one at a time, never fused into a multiply-add.
// nvcc contracts a * b + c into one FMA (one rounding) by default, while the
// host (x86-64 without FMA) rounds the product and the sum separately. The
// compression passes must put the same bytes on the wire on both, so where a
// product can meet a sum (a quantization scale, an accumulated decode) they
// spell the operation with these; the CUDA intrinsics are documented never
// to be contracted. On the host they are the plain operators.

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

DILOCO_HD DILOCO_FORCEINLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

DILOCO_HD DILOCO_FORCEINLINE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DILOCO_HD DILOCO_FORCEINLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace diloco::kernels
