// SPDX-License-Identifier: Apache-2.0
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

// Float arithmetic rounded operation by operation, whatever the compiler's
// contraction flags. The host and the GPU promise the same bits for the
// same pass (workers of both kinds may share a round, and the host tests
// replay the device code), so a product followed by a sum must round twice
// on both:
//   - on the GPU the functors spell their operations (core/exact_float.hpp:
//     __fmul_rn, __fadd_rn, ..., which nvcc never fuses);
//   - on the host, where those are the plain operators, the library's
//     arithmetic headers sit between DILOCO_EXACT_FP_BEGIN and
//     DILOCO_EXACT_FP_END, which compile their functions with contraction
//     off (GCC: optimize("fp-contract=off"), which GCC's default
//     -ffp-contract=fast and -mfma / -march=native would otherwise turn into
//     FMAs; Clang: fp contract(off)). The executor loops are inside, so the
//     functors inlined into them are too; vectorization is unaffected.
//     Clang's -ffp-contract=fast is the one exception: by Clang's own
//     definition it fuses "disregarding pragmas", so under Clang leave
//     contraction at its default (on, which the pragma governs) or off. Your
//     own policies' arithmetic compiles with your flags: spell it with
//     core/exact_float.hpp, or build with -ffp-contract=off, where bits
//     must match across machines.
#if defined(__CUDA_ARCH__)
#define DILOCO_EXACT_FP_BEGIN
#define DILOCO_EXACT_FP_END
#elif defined(__clang__)
#define DILOCO_EXACT_FP_BEGIN _Pragma("float_control(push)") _Pragma("clang fp contract(off)")
#define DILOCO_EXACT_FP_END _Pragma("float_control(pop)")
#elif defined(__GNUC__) && defined(__NVCC__)
// nvcc's front end does not know GCC's pragmas (warning 1675) but hands
// them to the host compiler.
#define DILOCO_EXACT_FP_BEGIN                                                                                      \
  _Pragma("nv_diagnostic push") _Pragma("nv_diag_suppress 1675") _Pragma("GCC push_options")                      \
      _Pragma("GCC optimize(\"fp-contract=off\")") _Pragma("nv_diagnostic pop")
#define DILOCO_EXACT_FP_END \
  _Pragma("nv_diagnostic push") _Pragma("nv_diag_suppress 1675") _Pragma("GCC pop_options") _Pragma("nv_diagnostic pop")
#elif defined(__GNUC__)
#define DILOCO_EXACT_FP_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define DILOCO_EXACT_FP_END _Pragma("GCC pop_options")
#else
#define DILOCO_EXACT_FP_BEGIN
#define DILOCO_EXACT_FP_END
#endif
