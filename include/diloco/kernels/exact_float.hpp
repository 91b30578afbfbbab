#pragma once

// Float operations rounded one at a time, never fused into a multiply-add.
// nvcc contracts a * b + c into one FMA (one rounding) by default, while the
// host (x86-64 without FMA) rounds the product and the sum separately. The
// compression passes must put the same bytes on the wire on both, so where a
// product can meet a sum (a quantization scale, an accumulated decode) they
// spell the operation with these; the CUDA intrinsics are documented never
// to be contracted. On the host they are the plain operators. The double
// forms serve low_rank's orthonormalisation (kernels/low_rank_passes.hpp),
// whose products of doubles are not exact; division and square root are
// correctly rounded on both (IEEE 754), spelt out so no flag can change it.

#include <cmath>

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

DILOCO_HD DILOCO_FORCEINLINE double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

DILOCO_HD DILOCO_FORCEINLINE double sub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

DILOCO_HD DILOCO_FORCEINLINE double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

DILOCO_HD DILOCO_FORCEINLINE double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

DILOCO_HD DILOCO_FORCEINLINE double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace diloco::kernels
