// SPDX-License-Identifier: Apache-2.0
#pragma once

// Four consecutive floats moved as one 16-byte access. A fused functor may
// offer a 4-wide path next to its scalar operator(): the CUDA launcher runs it
// over every group of 4 elements when all the functor's pointers are 16-byte
// aligned (one 128-bit load or store per array instead of four 32-bit ones),
// and the scalar operator() over the tail. On the host the same code runs
// with ordinary element accesses, so host tests execute the 4-wide bodies the
// GPU runs.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels {

/// Width of the vector path in elements.
inline constexpr std::size_t vec_width = 4;

/// Four floats, 16-byte aligned: one vector load or store on the GPU.
struct alignas(16) vec4f {
  float lane[vec_width];  ///< lane l
  ///@{
  /// Lane l.
  DILOCO_HD DILOCO_FORCEINLINE float& operator[](std::size_t l) { return lane[l]; }
  DILOCO_HD DILOCO_FORCEINLINE const float& operator[](std::size_t l) const { return lane[l]; }
  ///@}
};

/// p must be 16-byte aligned on the device.
DILOCO_HD DILOCO_FORCEINLINE vec4f load4(const float* p) {
#if defined(__CUDA_ARCH__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  return {{v.x, v.y, v.z, v.w}};
#else
  return {{p[0], p[1], p[2], p[3]}};
#endif
}

/// For arrays no thread writes during the kernel: the read-only data cache
/// path (ld.global.nc).
DILOCO_HD DILOCO_FORCEINLINE vec4f load4_readonly(const float* p) {
#if defined(__CUDA_ARCH__)
  const float4 v = __ldg(reinterpret_cast<const float4*>(p));
  return {{v.x, v.y, v.z, v.w}};
#else
  return load4(p);
#endif
}

/// Writes v to p[0, 4) (one 16-byte store on the device; p must be aligned there).
DILOCO_HD DILOCO_FORCEINLINE void store4(float* p, const vec4f& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
#else
  p[0] = v[0];
  p[1] = v[1];
  p[2] = v[2];
  p[3] = v[3];
#endif
}

/// True when every pointer may be used for 16-byte accesses (a null pointer
/// is never dereferenced, so it does not stand in the way).
template <class... T>
DILOCO_HD DILOCO_FORCEINLINE bool aligned16(const T*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && ...);
}

/// An optimizer update (update_functor) whose state slots can be gathered 4
/// at a time: `vector_state_slots` is the number of slots it reads and writes
/// whenever its state pointer is not null. Updates without it run scalar.
template <class U>
concept vectorizable_update = requires {
  { U::vector_state_slots } -> std::convertible_to<std::size_t>;
};

/// The state of 4 consecutive elements, slot k lane l at v[k * 4 + l]: the
/// update sees it through (v + l, stride 4), the layout it expects in memory.
template <std::size_t Slots>
struct state4 {
  float v[Slots * vec_width];  ///< slot k lane l at v[k * 4 + l]

  ///@{
  /// Gathers the 4 elements' slots from s (slot k at s + k * stride) with 16-byte loads, and
  /// scatters them back.
  DILOCO_HD DILOCO_FORCEINLINE void load(const float* s, std::size_t stride) {
    for (std::size_t k = 0; k < Slots; ++k) {
      const vec4f x = load4(s + k * stride);
      for (std::size_t l = 0; l < vec_width; ++l) v[k * vec_width + l] = x[l];
    }
  }
  DILOCO_HD DILOCO_FORCEINLINE void store(float* s, std::size_t stride) const {
    for (std::size_t k = 0; k < Slots; ++k) {
      vec4f x;
      for (std::size_t l = 0; l < vec_width; ++l) x[l] = v[k * vec_width + l];
      store4(s + k * stride, x);
    }
  }
  ///@}
};

/// Applies `update` to 4 elements whose values are in `x` and gradients in
/// `g`; the state, if any, lives at s (slot stride `stride`) and is moved with
/// 16-byte accesses. Each lane performs exactly the scalar path's operations.
template <class Update>
  requires vectorizable_update<Update>
DILOCO_HD DILOCO_FORCEINLINE void update4(const Update& update, vec4f& x, const vec4f& g, float* s,
                                          std::size_t stride) {
  constexpr std::size_t slots = Update::vector_state_slots;
  if constexpr (slots > 0) {
    if (s != nullptr) {
      state4<slots> st;
      st.load(s, stride);
      for (std::size_t l = 0; l < vec_width; ++l) update(x[l], g[l], st.v + l, vec_width);
      st.store(s, stride);
      return;
    }
  }
  for (std::size_t l = 0; l < vec_width; ++l) update(x[l], g[l], nullptr, 0);
}

/// Whether a state block of `stride` elements per slot keeps every slot
/// 16-byte aligned once its base is.
DILOCO_HD DILOCO_FORCEINLINE bool stride_keeps_alignment(const float* state, std::size_t stride) {
  return state == nullptr || stride % vec_width == 0;
}

}  // namespace diloco::kernels

DILOCO_EXACT_FP_END
