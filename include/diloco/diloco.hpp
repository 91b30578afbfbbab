#pragma once

// Umbrella header: everything that needs no optional dependency. The MPI,
// Gloo and NCCL communicators and the CUDA backend have headers of their own.

#include "diloco/version.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_traits.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/inner/adamw.hpp"
#include "diloco/inner/sgd.hpp"
#include "diloco/outer/nesterov.hpp"
#include "diloco/outer/sgd.hpp"
#include "diloco/compress/none.hpp"
#include "diloco/comm/local.hpp"
#include "diloco/comm/threads.hpp"
#include "diloco/optimizer.hpp"
#include "diloco/algorithm.hpp"
