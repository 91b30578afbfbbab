#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "diloco/compress/codec.hpp"
#include "diloco/compress/formats.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/kernels/quantize.hpp"
#include "diloco/kernels/random.hpp"

namespace diloco::compress {

// Block-wise symmetric integer quantization: per block of B elements one
// fp32 factor (the block's largest magnitude) and B values of Format::bits
// bits (int4: two per byte, element 2i in the low nibble). Bytes per
// parameter: (4 + B * bits / 8) / B, e.g. 1.03 for int8 and 0.53 for int4
// at B = 128.
template <class Format, std::size_t B, class Rounding>
struct blockwise_codec {
  static_assert(Format::bits == 8 || Format::bits == 4, "blockwise: Format must be diloco::int8 or diloco::int4");
  static_assert(B >= 2 && B % 2 == 0 && B <= 4096, "blockwise: block size B must be even and in [2, 4096]");
  static constexpr std::size_t block = B;
  static constexpr codec_id id = Format::bits == 8 ? codec_id::int8 : codec_id::int4;
  static constexpr std::size_t value_bytes = Format::bits == 8 ? B : B / 2;

  DILOCO_HD static constexpr std::size_t stride() { return 4 + value_bytes; }

  DILOCO_HD void encode(const float* v, std::size_t len, std::byte* out, float* dq, std::uint64_t stream,
                        std::uint64_t index0) const {
    len = len < B ? len : B;  // blocks never exceed B; saying so bounds the padding loops for the compiler
    const float amax = kernels::block_amax(v, len);
    std::memcpy(out, &amax, 4);
    float q[B];
    if constexpr (Rounding::stochastic)
      kernels::quantize_block<true>(v, len, amax, Format::levels, q, dq,
                                    [&](std::size_t j) { return kernels::random_unit(stream, index0 + j); });
    else
      kernels::quantize_block<false>(v, len, amax, Format::levels, q, dq, [](std::size_t) { return 0.0f; });
    auto* bytes = reinterpret_cast<unsigned char*>(out + 4);
    if constexpr (Format::bits == 8) {
      for (std::size_t j = 0; j < len; ++j) bytes[j] = static_cast<unsigned char>(static_cast<int>(q[j]));
      if (len < value_bytes) std::memset(bytes + len, 0, value_bytes - len);  // padding of a partial block
    } else {
      const std::size_t pairs = len / 2;
      for (std::size_t p = 0; p < pairs; ++p)
        bytes[p] = static_cast<unsigned char>((static_cast<unsigned>(static_cast<int>(q[2 * p])) & 0xfu) |
                                              ((static_cast<unsigned>(static_cast<int>(q[2 * p + 1])) & 0xfu) << 4));
      std::size_t used = pairs;
      if (len % 2) bytes[used++] = static_cast<unsigned char>(static_cast<unsigned>(static_cast<int>(q[len - 1])) & 0xfu);
      if (used < value_bytes) std::memset(bytes + used, 0, value_bytes - used);
    }
  }

  DILOCO_HD void decode(const std::byte* in, std::size_t len, float* dq) const {
    len = len < B ? len : B;
    float amax;
    std::memcpy(&amax, in, 4);
    const auto* q = reinterpret_cast<const unsigned char*>(in + 4);
    // Normal scales (and NaN/inf factors, which must stay visibly
    // non-finite) multiply; tiny blocks take dequantize()'s exact path.
    if (kernels::scale_is_normal(amax, Format::levels) || !(amax - amax == 0.0f)) {
      const float scale = amax / Format::levels;
      if constexpr (Format::bits == 8) {
        for (std::size_t j = 0; j < len; ++j) dq[j] = static_cast<float>(static_cast<std::int8_t>(q[j])) * scale;
      } else {
        const std::size_t pairs = len / 2;
        for (std::size_t p = 0; p < pairs; ++p) {
          dq[2 * p] = static_cast<float>(static_cast<int>((q[p] & 0xfu) ^ 8u) - 8) * scale;
          dq[2 * p + 1] = static_cast<float>(static_cast<int>((q[p] >> 4) ^ 8u) - 8) * scale;
        }
        if (len % 2) dq[len - 1] = static_cast<float>(static_cast<int>((q[pairs] & 0xfu) ^ 8u) - 8) * scale;
      }
    } else {
      for (std::size_t j = 0; j < len; ++j) dq[j] = kernels::dequantize(value(in + 4, j), amax, Format::levels);
    }
  }

  // Values outside [-L, L] (int8's -128, int4's -8) are never written, and
  // padding beyond a partial block is zero.
  DILOCO_HD const char* check(const std::byte* in, std::size_t len) const {
    const std::byte* q = in + 4;
    for (std::size_t j = 0; j < len; ++j)
      if (value(q, j) < -static_cast<int>(Format::levels)) return "quantized value out of range";
    if constexpr (Format::bits == 4)
      if (len % 2 == 1 && (static_cast<unsigned>(q[len / 2]) >> 4) != 0) return "non-zero int4 padding nibble";
    for (std::size_t b = (Format::bits == 8 ? len : (len + 1) / 2); b < value_bytes; ++b)
      if (q[b] != std::byte{0}) return "non-zero padding after a partial block";
    return nullptr;
  }

 private:
  DILOCO_HD static int value(const std::byte* q, std::size_t j) {
    if constexpr (Format::bits == 8) {
      return static_cast<std::int8_t>(q[j]);
    } else {
      const unsigned nibble = (static_cast<unsigned>(q[j / 2]) >> ((j % 2) * 4)) & 0xfu;
      return static_cast<int>(nibble ^ 8u) - 8;  // sign-extend 4 bits
    }
  }
};

struct codec_options {
  std::uint64_t seed = 0;  // stochastic rounding stream
  template <class F>
  friend void visit_options(const codec_options& o, F&& f) {
    f("seed", o.seed);
  }
};

// What a lossy compressor without state of its own declares: its codec,
// no error feedback, rounding from the codec's policy, options that need
// no validation. blockwise and cast derive from it and add their name.
template <class Codec, class Rounding>
struct stateless_codec_policy {
  using options = codec_options;
  using codec = Codec;
  static constexpr bool lossless = false;
  static constexpr bool has_error_feedback = false;
  static constexpr bool stochastic = Rounding::stochastic;
  static void validate(const options&) {}
  static codec make_codec(const options&) { return {}; }
};

// The compressor policy: blockwise<int8, 128> or blockwise<int4, 64, stochastic_rounding>.
template <class Format, std::size_t B = 128, class Rounding = round_nearest>
struct blockwise : stateless_codec_policy<blockwise_codec<Format, B, Rounding>, Rounding> {
  static constexpr const char* name = Format::bits == 8 ? "blockwise int8" : "blockwise int4";
};

}  // namespace diloco::compress
