// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/kernels/vec4.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

// Reducing functors (run by transform_reduce) return the value to sum; their
// 4-wide path returns the 4 values, summed by the executor.

/// Pass 1 of a round (world > 1, fp32 wire): the pseudo-gradient
///   delta_i = global_i - local_i
/// written straight into the communication buffer; returns delta_i^2 so the
/// same pass yields the worker's pseudo-gradient norm.
/// Bytes per element: read 8 (global, local), write 4 (wire) = 12.
struct pseudo_gradient {
  const float* DILOCO_RESTRICT global;  ///< theta_global
  const float* DILOCO_RESTRICT local;   ///< the replica
  float* DILOCO_RESTRICT out;           ///< the wire: delta

  /// Element i: writes delta_i, returns delta_i^2.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const {
    const float d = sub_rn(global[i], local[i]);
    out[i] = d;
    return mul_rn(d, d);
  }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp); returns the 4 squares.
  DILOCO_HD DILOCO_FORCEINLINE vec4f vec4(std::size_t i) const {
    const vec4f g = load4_readonly(global + i);
    const vec4f x = load4_readonly(local + i);
    vec4f d, sq;
    for (std::size_t l = 0; l < vec_width; ++l) {
      d[l] = sub_rn(g[l], x[l]);
      sq[l] = mul_rn(d[l], d[l]);
    }
    store4(out + i, d);
    return sq;
  }
  /// Whether every pointer allows 16-byte accesses.
  DILOCO_HD bool vec4_aligned() const { return aligned16(global, local, out); }
};

/// The norm alone, for a world of one where nothing travels: read 8 bytes.
struct pseudo_gradient_sq {
  const float* DILOCO_RESTRICT global;  ///< theta_global
  const float* DILOCO_RESTRICT local;   ///< the replica

  /// Element i: returns delta_i^2.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const {
    const float d = sub_rn(global[i], local[i]);
    return mul_rn(d, d);
  }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp); returns the 4 squares.
  DILOCO_HD DILOCO_FORCEINLINE vec4f vec4(std::size_t i) const {
    const vec4f g = load4_readonly(global + i);
    const vec4f x = load4_readonly(local + i);
    vec4f sq;
    for (std::size_t l = 0; l < vec_width; ++l) {
      const float d = sub_rn(g[l], x[l]);
      sq[l] = mul_rn(d, d);
    }
    return sq;
  }
  /// Whether every pointer allows 16-byte accesses.
  DILOCO_HD bool vec4_aligned() const { return aligned16(global, local); }
};

/// Sum of squares of a tensor (gradient clipping): read 4 bytes.
struct squares {
  const float* DILOCO_RESTRICT x;  ///< the tensor
  /// Element i: returns x_i^2.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const { return mul_rn(x[i], x[i]); }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp); returns the 4 squares.
  DILOCO_HD DILOCO_FORCEINLINE vec4f vec4(std::size_t i) const {
    const vec4f v = load4_readonly(x + i);
    vec4f sq;
    for (std::size_t l = 0; l < vec_width; ++l) sq[l] = mul_rn(v[l], v[l]);
    return sq;
  }
  /// Whether the pointer allows 16-byte accesses.
  DILOCO_HD bool vec4_aligned() const { return aligned16(x); }
};

/// dst_i = value (resetting a schedule's buffers): write 4.
struct fill {
  float* DILOCO_RESTRICT dst;  ///< the buffer written
  float value;                 ///< the value written
  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const { dst[i] = value; }
};

/// 1 for each element that is NaN or infinite (x − x is 0 exactly when x is
/// finite), summed by transform_reduce: read 4.
struct count_non_finite {
  const float* DILOCO_RESTRICT x;  ///< the values checked
  /// Element i: returns 1 if it is NaN or infinite, else 0.
  DILOCO_HD DILOCO_FORCEINLINE float operator()(std::size_t i) const {
    const float v = x[i];
    return v - v == 0.0f ? 0.0f : 1.0f;
  }
  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp); returns the 4 counts.
  DILOCO_HD DILOCO_FORCEINLINE vec4f vec4(std::size_t i) const {
    const vec4f v = load4_readonly(x + i);
    vec4f bad;
    for (std::size_t l = 0; l < vec_width; ++l) bad[l] = v[l] - v[l] == 0.0f ? 0.0f : 1.0f;
    return bad;
  }
  /// Whether the pointer allows 16-byte accesses.
  DILOCO_HD bool vec4_aligned() const { return aligned16(x); }
};

/// dst_i += src_i, src_i = 0 (adaptive compression hands a residual to the
/// next rung): read 8, write 8.
struct absorb {
  float* DILOCO_RESTRICT src;  ///< the residual handed over, zeroed
  float* DILOCO_RESTRICT dst;  ///< the residual that takes it
  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const {
    dst[i] = add_rn(dst[i], src[i]);
    src[i] = 0.0f;
  }
};

/// dst_i = src_i (restoring replicas, initial copies): read 4, write 4.
struct copy {
  const float* DILOCO_RESTRICT src;  ///< the source
  float* DILOCO_RESTRICT dst;        ///< the destination
  /// Element i.
  DILOCO_HD DILOCO_FORCEINLINE void operator()(std::size_t i) const { dst[i] = src[i]; }

  /// Elements [i, i + 4) with 16-byte accesses (see vec4.hpp).
  DILOCO_HD DILOCO_FORCEINLINE void vec4(std::size_t i) const { store4(dst + i, load4_readonly(src + i)); }
  /// Whether both pointers allow 16-byte accesses.
  DILOCO_HD bool vec4_aligned() const { return aligned16(src, dst); }
};

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
