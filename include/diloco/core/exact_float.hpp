// SPDX-License-Identifier: Apache-2.0
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
// correctly rounded (IEEE 754) on both, spelt out so that no compiler flag
// (-prec-div, -use_fast_math) changes them. Both operands have one type.

#include <cmath>
#include <type_traits>

#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// float or double: the types these operations are spelt for.
template <class T>
concept rounded_float = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// a + b, rounded once (never fused with a product).
template <rounded_float T>
DILOCO_HD DILOCO_FORCEINLINE T add_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    return __fadd_rn(a, b);
  else
    return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

/// a - b, rounded once (never fused with a product).
template <rounded_float T>
DILOCO_HD DILOCO_FORCEINLINE T sub_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    return __fsub_rn(a, b);
  else
    return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

/// a * b, rounded once (never fused into a multiply-add).
template <rounded_float T>
DILOCO_HD DILOCO_FORCEINLINE T mul_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a / b, correctly rounded whatever the compiler's flags.
template <rounded_float T>
DILOCO_HD DILOCO_FORCEINLINE T div_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    return __fdiv_rn(a, b);
  else
    return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

/// sqrt(a), correctly rounded whatever the compiler's flags.
template <rounded_float T>
DILOCO_HD DILOCO_FORCEINLINE T sqrt_rn(T a) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    return __fsqrt_rn(a);
  else
    return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
