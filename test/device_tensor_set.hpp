// SPDX-License-Identifier: Apache-2.0
#pragma once

// The replica tensors of a device-pass test: each tensor's values in a
// thrust::device_vector of its own, and the kernels::device_tensor records
// (data pointer, offset in the flat buffers, index in the packed order)
// that the team programs read. Used by test/cuda/test_cuda_kernels.cu on a
// GPU and by test_device_tensor_set.cpp over Thrust's CPP backend (g++, no
// GPU), which checks that the saved pointers stay valid.

#include <cstddef>
#include <thrust/device_vector.h>
#include <vector>

#include <diloco/kernels/compressed_blocks.hpp>

namespace test_support {

struct device_tensor_set {
  std::vector<thrust::device_vector<float>> storage;   // tensor t's values
  std::vector<diloco::kernels::device_tensor> tensors;  // tensor t's record, local == storage[t]'s data

  device_tensor_set() = default;
  // values[t] into storage[t]; record t = {its data, offsets[t], index0[t]}.
  device_tensor_set(const std::vector<std::vector<float>>& values, const std::vector<std::size_t>& offsets,
                    const std::vector<std::size_t>& index0) {
    // Every device vector first, then their addresses: growing `storage`
    // copies its device_vectors (their move constructor is not noexcept, so
    // std::vector copies on reallocation) and frees the old storage, so an
    // address taken during the growth would dangle.
    for (const auto& v : values) storage.emplace_back(v.begin(), v.end());
    for (std::size_t t = 0; t < values.size(); ++t)
      tensors.push_back({thrust::raw_pointer_cast(storage[t].data()), offsets[t], index0[t]});
  }
};

}  // namespace test_support
