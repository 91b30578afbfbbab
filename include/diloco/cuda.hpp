// SPDX-License-Identifier: Apache-2.0
#pragma once

// Umbrella header of the CUDA backend: everything in <diloco/diloco.hpp>,
// plus the device executor, device and pinned buffers, and the
// thrust::device_vector adapter. Compile with nvcc (link diloco::cuda).
// With it, diloco::algorithm and diloco::optimizer<Opt, exec::cuda> run over
// device tensors (tensor_view<float, device_space>, thrust::device_vector).

#include "diloco/core/require_cxx20.hpp"

#include "diloco/diloco.hpp"
#include "diloco/exec/cuda.hpp"
#include "diloco/exec/cuda/launch_plan.hpp"
#include "diloco/core/cuda_error.hpp"
#include "diloco/kernels/vec4.hpp"
#include "diloco/memory/device_buffer.hpp"
#include "diloco/tensor/thrust.hpp"
