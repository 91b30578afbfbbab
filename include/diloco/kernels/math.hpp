#pragma once

#include <cmath>

#include "diloco/core/macros.hpp"

namespace diloco::kernels {

// Single-precision square root callable from host and device code alike.
DILOCO_HD DILOCO_FORCEINLINE float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

}  // namespace diloco::kernels
