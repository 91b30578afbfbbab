#pragma once

#include <cstdint>

namespace diloco {

// Number formats a pseudo-gradient can travel in, named by what they are.
// Integer formats are symmetric: `levels` is the largest |q|.
struct int8 {
  static constexpr const char* name = "int8";
  static constexpr int bits = 8;
  static constexpr float levels = 127.0f;
};
struct int4 {
  static constexpr const char* name = "int4";
  static constexpr int bits = 4;
  static constexpr float levels = 7.0f;
};
struct bf16 {
  static constexpr const char* name = "bf16";
};
struct fp16 {
  static constexpr const char* name = "fp16";
};

namespace compress {

// Rounding policies for the lossy codecs.
struct round_nearest {
  static constexpr bool stochastic = false;
  static constexpr const char* name = "nearest";
};
// Unbiased stochastic rounding from a counter-based hash of (options.seed,
// round, rank, element): reproducible, and the same on any thread count.
struct stochastic_rounding {
  static constexpr bool stochastic = true;
  static constexpr const char* name = "stochastic";
};

// Codec ids on the wire.
enum class codec_id : std::uint8_t { none = 0, bf16 = 1, fp16 = 2, int8 = 3, int4 = 4, topk = 5 };

}  // namespace compress
}  // namespace diloco
