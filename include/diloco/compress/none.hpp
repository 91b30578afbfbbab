// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The pseudo-gradient travels as fp32, reduced by the communicator's own
/// all-reduce: 4 bytes per parameter, no error.
struct none {
  struct options {};
  static constexpr const char* name = "none";  ///< the compressor's name in checkpoint headers, messages and reports
  static constexpr bool lossless = true;             ///< values travel unchanged
  static constexpr bool has_error_feedback = false;  ///< nothing to feed back
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
