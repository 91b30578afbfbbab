// SPDX-License-Identifier: Apache-2.0
#pragma once

// The merges (how a finished outer step reaches the replica) are element
// math fused into the apply passes, so they live with the kernels; the
// schedules name them as sync::merge::overwrite, mix, rebase and eager.

#include "diloco/kernels/merge.hpp"

namespace diloco::sync {
namespace merge = kernels::merge;
}  // namespace diloco::sync
