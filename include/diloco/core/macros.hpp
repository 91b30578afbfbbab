#pragma once

// DILOCO_HD marks the per-element math that both the host executor and the
// CUDA executor run. Under nvcc it expands to __host__ __device__; in a plain
// C++ build it is empty, so the same functor is ordinary host code.
#if defined(__CUDACC__)
#define DILOCO_HD __host__ __device__
#define DILOCO_FORCEINLINE __forceinline__
#else
#define DILOCO_HD
#if defined(__GNUC__) || defined(__clang__)
#define DILOCO_FORCEINLINE inline __attribute__((always_inline))
#else
#define DILOCO_FORCEINLINE inline
#endif
#endif

// Restrict-qualified pointers let the host compiler vectorize the fused
// passes (the user's tensors and our buffers never alias).
#if defined(__CUDACC__) || defined(__GNUC__) || defined(__clang__)
#define DILOCO_RESTRICT __restrict__
#else
#define DILOCO_RESTRICT
#endif
