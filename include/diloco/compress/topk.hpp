// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/compress/blockwise.hpp"
#include "diloco/compress/codec.hpp"
#include "diloco/core/validate.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// Top-k sparsification per block of B elements: the k = ceil(fraction * len)
/// largest magnitudes of each block travel as (uint16 index, fp32 value)
/// pairs sorted by index; the rest are dropped (error feedback carries them
/// to the next round). Block-local selection keeps blocks independent (and
/// parallel); with B = 1024 it selects among many candidates. Bytes per
/// parameter: about 6 * fraction. Ties between equal magnitudes go to the
/// lower index; NaN counts as the largest magnitude so it is never hidden.
/// Encoding is host code (selection by partial sort).
template <std::size_t B = 1024>
struct topk_codec {
  static_assert(B >= 1 && B <= 65535, "topk: block size B must be in [1, 65535] (uint16 indices)");
  static constexpr std::size_t block = B;
  static constexpr codec_id id = codec_id::topk;
  static constexpr std::uint16_t unused = 0xffff;

  std::uint32_t k_full = 1;  ///< entries per full block
  float fraction = 0.01f;

  std::size_t stride() const { return 6 * static_cast<std::size_t>(k_full); }
  std::size_t entries(std::size_t len) const {
    if (len == B) return k_full;
    const auto k = static_cast<std::size_t>(std::ceil(static_cast<double>(fraction) * static_cast<double>(len)));
    return std::max<std::size_t>(std::min(k, len), len ? 1 : 0);
  }

  void encode(const float* v, std::size_t len, std::byte* out, float* dq, std::uint64_t, std::uint64_t) const {
    const std::size_t k = entries(len);
    // At least 16 entries: GCC 12 warns (-Warray-bounds, falsely) that
    // std::sort's insertion-sort stage, whose threshold is 16, reads past a
    // smaller array once the optimizer specialises it for B < 16.
    std::uint16_t idx[B < 16 ? 16 : B];
    for (std::size_t j = 0; j < len; ++j) idx[j] = static_cast<std::uint16_t>(j);
    auto mag = [&](std::uint16_t j) { return std::isnan(v[j]) ? INFINITY : std::fabs(v[j]); };
    std::nth_element(idx, idx + k, idx + len, [&](std::uint16_t a, std::uint16_t b) {
      const float ma = mag(a), mb = mag(b);
      return ma > mb || (ma == mb && a < b);
    });
    std::sort(idx, idx + k);
    std::fill(dq, dq + len, 0.0f);
    std::byte* values = out + 2 * static_cast<std::size_t>(k_full);
    for (std::size_t e = 0; e < k_full; ++e) {
      const std::uint16_t i = e < k ? idx[e] : unused;
      const float x = e < k ? v[i] : 0.0f;
      std::memcpy(out + 2 * e, &i, 2);
      std::memcpy(values + 4 * e, &x, 4);
      if (e < k) dq[i] = x;
    }
  }

  void decode(const std::byte* in, std::size_t len, float* dq) const {
    std::fill(dq, dq + len, 0.0f);
    const std::byte* values = in + 2 * static_cast<std::size_t>(k_full);
    const std::size_t k = entries(len);
    for (std::size_t e = 0; e < k; ++e) {
      std::uint16_t i;
      std::memcpy(&i, in + 2 * e, 2);
      if (i < len) std::memcpy(dq + i, values + 4 * e, 4);  // check() rejects i >= len before decode runs
    }
  }

  const char* check(const std::byte* in, std::size_t len) const {
    const std::size_t k = entries(len);
    const std::byte* values = in + 2 * static_cast<std::size_t>(k_full);
    std::uint32_t previous = 0;
    for (std::size_t e = 0; e < k_full; ++e) {
      std::uint16_t i;
      std::memcpy(&i, in + 2 * e, 2);
      if (e < k) {
        if (i >= len) return "top-k index beyond its block";
        if (e > 0 && i <= previous) return "top-k indices not strictly increasing";
        previous = i;
      } else {
        float x;
        std::memcpy(&x, values + 4 * e, 4);
        if (i != unused || x != 0.0f) return "top-k entry beyond the block's count is not empty";
      }
    }
    return nullptr;
  }
};

struct topk_options {
  float fraction = 0.01f;  ///< share of each block's elements that travel, in (0, 1]
  template <class F>
  friend void visit_options(const topk_options& o, F&& f) {
    f("fraction", o.fraction);
  }
};

template <std::size_t B = 1024>
struct topk {
  using options = topk_options;
  using codec = topk_codec<B>;
  static constexpr const char* name = "top-k";
  static constexpr bool lossless = false;
  static constexpr bool has_error_feedback = false;
  static constexpr bool stochastic = false;
  static void validate(const options& o) {
    if (!(o.fraction > 0.0f && o.fraction <= 1.0f))
      detail::raise<config_error>("topk: fraction must lie in (0, 1], got ", o.fraction);
  }
  static codec make_codec(const options& o) {
    validate(o);
    codec c;
    c.fraction = o.fraction;
    c.k_full = static_cast<std::uint32_t>(
        std::max(1.0, std::ceil(static_cast<double>(o.fraction) * static_cast<double>(B))));
    return c;
  }
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
