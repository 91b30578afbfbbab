// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which wider instruction set the host passes may use, chosen at run time:
// the library is header-only and users compile it without -march, so a
// loop that gains from AVX2 is compiled a second time with
// __attribute__((target("avx2"))) (no FMA: the same IEEE operations, the
// same bits) and called when enabled() says the CPU runs it. Used by the
// wire and checkpoint checksum (core/checksum.hpp, which also asks
// avx512()), the codecs' host loops (codec/blockwise.hpp's structure check,
// codec/chunk_topk.hpp's selection) and kernels/host_simd.hpp (the
// compressed round's block passes), which includes it; tensor/low_precision.hpp's mirror loops ask the same.

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(DILOCO_NO_HOST_SIMD)
/// Defined where the hand-vectorised host passes are compiled in (x86-64,
/// GCC or Clang, not nvcc, DILOCO_NO_HOST_SIMD not defined).
#define DILOCO_HOST_SIMD_X86 1
/// The target of the AVX-512 forms (`__attribute__((target(...)))`): the
/// features host_simd::avx512() asks the CPU for.
#define DILOCO_HOST_AVX512_TARGET "avx512f,avx512dq,avx512bw,avx512vl,bmi2"
#include <immintrin.h>
#endif

namespace diloco::kernels::host_simd {

/// Whether the hand-vectorised passes run: compiled in, the CPU has AVX2,
/// and DILOCO_HOST_SIMD is not 0 (read once).
inline bool enabled() {
#if defined(DILOCO_HOST_SIMD_X86)
  static const bool on = [] {
    const char* env = std::getenv("DILOCO_HOST_SIMD");
    if (env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0)) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return on;
#else
  return false;
#endif
}

/// Whether the passes that have an AVX-512 form (the checksum's 64-bit
/// multiplies, core/checksum.hpp; the block codecs' passes,
/// kernels/host_simd512.hpp; chunk_topk's encode, kernels/compressed_passes.hpp)
/// run it: enabled(), the CPU has AVX-512 F, DQ,
/// BW and VL and BMI2 (every AVX-512 server CPU since Skylake-SP), and
/// DILOCO_HOST_SIMD is not "avx2" (which keeps every pass at AVX2; read
/// once).
inline bool avx512() {
#if defined(DILOCO_HOST_SIMD_X86)
  static const bool on = [] {
    if (!enabled()) return false;
    const char* env = std::getenv("DILOCO_HOST_SIMD");
    if (env && std::strcmp(env, "avx2") == 0) return false;
    return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512dq") != 0 &&
           __builtin_cpu_supports("avx512bw") != 0 && __builtin_cpu_supports("avx512vl") != 0 &&
           __builtin_cpu_supports("bmi2") != 0;
  }();
  return on;
#else
  return false;
#endif
}

}  // namespace diloco::kernels::host_simd
