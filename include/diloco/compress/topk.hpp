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
  static constexpr std::size_t block = B;          ///< elements per block
  static constexpr codec_id id = codec_id::topk;   ///< the codec's id in segment headers
  static constexpr std::uint16_t unused = 0xffff;  ///< the index of an entry a partial block does not use

  std::uint32_t k_full = 1;  ///< entries per full block
  float fraction = 0.01f;    ///< as options.fraction

  /// Bytes of an encoded block: k_full (uint16 index, fp32 value) entries, a partial block's
  /// unused ones padded.
  std::size_t stride() const { return 6 * static_cast<std::size_t>(k_full); }
  /// The entries a block of len elements sends: k_full for a full block, else
  /// ceil(fraction * len), at least one.
  std::size_t entries(std::size_t len) const {
    if (len == B) return k_full;
    const auto k = static_cast<std::size_t>(std::ceil(static_cast<double>(fraction) * static_cast<double>(len)));
    return std::max<std::size_t>(std::min(k, len), len ? 1 : 0);
  }

  /// Encodes the block's k largest magnitudes (ties to the lower index, NaN first) as
  /// (index, value) entries in index order; dq receives decode(out). Deterministic: the seeds
  /// are unused.
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

  /// Decodes a block into dq[0, len): the sent values, zeros elsewhere.
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

  /// nullptr when the block's bytes are well formed (indices in range and increasing, unused
  /// entries marked), else what is wrong.
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

/// The options of topk.
struct topk_options {
  float fraction = 0.01f;  ///< share of each block's elements that travel, in (0, 1]
  /// Every field by name (core/options.hpp's visit_options customisation point).
  template <class F>
  friend void visit_options(const topk_options& o, F&& f) {
    f("fraction", o.fraction);
  }
};

/// The compressor policy: `topk<B>` (blocks of B elements); `error_feedback<topk<>>` keeps
/// what it drops.
template <std::size_t B = 1024>
struct topk {
  using options = topk_options;  ///< what fraction of each block travels
  using codec = topk_codec<B>;  ///< the codec, built from the options
  static constexpr const char* name = "top-k";  ///< the compressor's name in checkpoint headers, messages and reports
  static constexpr bool lossless = false;  ///< values change on the way
  static constexpr bool has_error_feedback = false;  ///< no residual: wrap it in error_feedback
  static constexpr bool stochastic = false;  ///< deterministic selection
  /// Throws config_error unless fraction is in (0, 1].
  static void validate(const options& o) {
    if (!(o.fraction > 0.0f && o.fraction <= 1.0f))
      detail::raise<config_error>("topk: fraction must lie in (0, 1], got ", o.fraction);
  }
  /// The codec for these options (k_full = the entries of a full block).
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
