// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/core/host_cpu.hpp"
#include "diloco/core/mix64.hpp"

namespace diloco {

namespace detail {

inline constexpr std::uint64_t checksum_golden = 0x9e3779b97f4a7c15ULL;

/// The sum of mix64(w_i + (first + i + 1) * golden) over the `words` whole
/// 64-bit words at data, at the baseline ISA (four independent lanes, so the
/// loop pipelines).
inline std::uint64_t checksum_whole_words_baseline(const std::byte* data, std::size_t words, std::uint64_t first) {
  std::uint64_t acc[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, data + 8 * i, 8);
    acc[i & 3] += mix64(w + (first + i + 1) * checksum_golden);
  }
  return acc[0] + acc[1] + acc[2] + acc[3];
}

#if defined(DILOCO_HOST_SIMD_X86)
/// x * c modulo 2^64 in each 64-bit lane, from AVX2's 32 x 32 -> 64-bit
/// products: xl cl + ((xh cl + xl ch) << 32), the terms that survive the
/// modulus.
__attribute__((target("avx2"), always_inline)) inline __m256i mul64_avx2(__m256i x, __m256i c_lo, __m256i c_hi) {
  const __m256i lo = _mm256_mul_epu32(x, c_lo);
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), c_lo), _mm256_mul_epu32(x, c_hi));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

/// mix64 of each 64-bit lane (core/mix64.hpp), AVX2.
__attribute__((target("avx2"), always_inline)) inline __m256i mix64_avx2(__m256i x) {
  const __m256i c1_lo = _mm256_set1_epi64x(0x1ce4e5b9LL), c1_hi = _mm256_set1_epi64x(0xbf58476dLL);
  const __m256i c2_lo = _mm256_set1_epi64x(0x133111ebLL), c2_hi = _mm256_set1_epi64x(0x94d049bbLL);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
  x = mul64_avx2(x, c1_lo, c1_hi);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
  x = mul64_avx2(x, c2_lo, c2_hi);
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

/// checksum_whole_words_baseline with AVX2: words 8k .. 8k + 7 in two
/// registers of four lanes, each lane's (first + i + 1) * golden advanced by
/// 8 * golden a step (the same number modulo 2^64); the wrapping sum is the
/// same in any order.
__attribute__((target("avx2"))) inline std::uint64_t checksum_whole_words_avx2(const std::byte* data, std::size_t words,
                                                                               std::uint64_t first) {
  const std::uint64_t g = checksum_golden;
  __m256i t0 = _mm256_setr_epi64x(static_cast<long long>((first + 1) * g), static_cast<long long>((first + 2) * g),
                                  static_cast<long long>((first + 3) * g), static_cast<long long>((first + 4) * g));
  __m256i t1 = _mm256_add_epi64(t0, _mm256_set1_epi64x(static_cast<long long>(4 * g)));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(8 * g));
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= words; i += 8) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + 8 * i));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + 8 * i + 32));
    acc0 = _mm256_add_epi64(acc0, mix64_avx2(_mm256_add_epi64(w0, t0)));
    acc1 = _mm256_add_epi64(acc1, mix64_avx2(_mm256_add_epi64(w1, t1)));
    t0 = _mm256_add_epi64(t0, step);
    t1 = _mm256_add_epi64(t1, step);
  }
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(acc0, acc1));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] +
         checksum_whole_words_baseline(data + 8 * i, words - i, first + i);
}

/// mix64 of each 64-bit lane (core/mix64.hpp), AVX-512 (its 64-bit multiply
/// is AVX-512DQ's). The shifts are the zero-masked forms with every lane
/// kept: GCC 12's unmasked ones pass an undefined vector that its
/// -Wuninitialized reports (GCC bug 105593).
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __m512i mix64_avx512(__m512i x) {
  const __mmask8 all = 0xff;
  x = _mm512_xor_si512(x, _mm512_maskz_srli_epi64(all, x, 30));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(static_cast<long long>(0xbf58476d1ce4e5b9ULL)));
  x = _mm512_xor_si512(x, _mm512_maskz_srli_epi64(all, x, 27));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(static_cast<long long>(0x94d049bb133111ebULL)));
  return _mm512_xor_si512(x, _mm512_maskz_srli_epi64(all, x, 31));
}

/// checksum_whole_words_avx2 with AVX-512: sixteen words a step in two registers of eight lanes.
__attribute__((target("avx512f,avx512dq"))) inline std::uint64_t checksum_whole_words_avx512(const std::byte* data,
                                                                                            std::size_t words,
                                                                                            std::uint64_t first) {
  const std::uint64_t g = checksum_golden;
  __m512i t0 = _mm512_mullo_epi64(_mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 8), _mm512_set1_epi64(static_cast<long long>(g)));
  t0 = _mm512_add_epi64(t0, _mm512_set1_epi64(static_cast<long long>(first * g)));
  __m512i t1 = _mm512_add_epi64(t0, _mm512_set1_epi64(static_cast<long long>(8 * g)));
  const __m512i step = _mm512_set1_epi64(static_cast<long long>(16 * g));
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 16 <= words; i += 16) {
    const __m512i w0 = _mm512_loadu_si512(data + 8 * i);
    const __m512i w1 = _mm512_loadu_si512(data + 8 * i + 64);
    acc0 = _mm512_add_epi64(acc0, mix64_avx512(_mm512_add_epi64(w0, t0)));
    acc1 = _mm512_add_epi64(acc1, mix64_avx512(_mm512_add_epi64(w1, t1)));
    t0 = _mm512_add_epi64(t0, step);
    t1 = _mm512_add_epi64(t1, step);
  }
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(acc0, acc1));
  std::uint64_t sum = 0;
  for (const std::uint64_t lane : lanes) sum += lane;
  return sum + checksum_whole_words_baseline(data + 8 * i, words - i, first + i);
}
#endif

/// checksum_whole_words_baseline by the widest form the CPU runs
/// (kernels::host_simd::avx512(), enabled()): the same sum.
inline std::uint64_t checksum_whole_words(const std::byte* data, std::size_t words, std::uint64_t first) {
#if defined(DILOCO_HOST_SIMD_X86)
  if (kernels::host_simd::avx512()) return checksum_whole_words_avx512(data, words, first);
  if (kernels::host_simd::enabled()) return checksum_whole_words_avx2(data, words, first);
#endif
  return checksum_whole_words_baseline(data, words, first);
}

}  // namespace detail

/// The checksum of wire buffers: the wrapping sum over 64-bit little-endian
/// words w_i (the tail zero-padded) of mix64(w_i + (i + 1) * golden), mixed
/// once more with the length. Every term is a bijection of its word, so any
/// change to a single word changes the sum; the position in the term catches
/// reordered words. Being a sum, it is computed in any order: by OpenMP
/// threads or GPU blocks alike, and on the host by AVX2 or AVX-512 where the
/// CPU has them (detail::checksum_whole_words). Not cryptographic: it detects
/// accidents, not attackers.
inline std::uint64_t checksum_words(const std::byte* data, std::size_t bytes, std::uint64_t first_word_index = 0) {
  const std::size_t whole = bytes / 8;
  std::uint64_t sum = detail::checksum_whole_words(data, whole, first_word_index);
  if (const std::size_t tail = bytes % 8; tail != 0) {
    std::uint64_t w = 0;
    std::memcpy(&w, data + 8 * whole, tail);
    sum += detail::mix64(w + (first_word_index + whole + 1) * detail::checksum_golden);
  }
  return sum;
}

/// Finishes a checksum: the sum of checksum_words over a whole buffer, mixed with its length in bytes.
inline std::uint64_t checksum_finish(std::uint64_t sum, std::uint64_t total_bytes) {
  return detail::mix64(sum ^ detail::mix64(total_bytes));
}

}  // namespace diloco
