// SPDX-License-Identifier: Apache-2.0
#pragma once

// A list of tensors as the multi-tensor passes read it (exec/chunks.hpp,
// kernels/tensor_passes.hpp): the chunk table of their elements and every
// tensor's data pointer and offset in the flat buffers, in the memory of the
// executor that runs the passes. A parameter set's pointers and sizes never
// change, so a device list is uploaded once, when it is made.
//
// gradient_list keeps the per-step pointers (the gradients a step is given)
// in the same memory, uploading them only when they differ from the last
// step's (a training loop usually hands the same buffers every step).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "diloco/core/memory_space.hpp"
#include "diloco/exec/chunks.hpp"
#include "diloco/kernels/tensor_passes.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco {

/// A list of tensors as the multi-tensor passes read it (exec/chunks.hpp,
/// kernels/tensor_passes.hpp): the chunk table of their elements and every tensor's data
/// pointer and offset in the flat buffers, in the memory of the executor that runs the passes.
/// Uploaded once, when it is made.
template <class Space>
class tensor_list {
  static constexpr bool host = std::is_same_v<Space, host_space>;

 public:
  tensor_list() = default;

  /// Tensor k of `set` at offsets[k] of the flat buffers (the set's own
  /// offsets when `offsets` is empty).
  template <class Exec>
  tensor_list(const parameter_set<float, Space>& set, Exec& exec, std::span<const std::size_t> offsets = {}) {
    std::vector<std::size_t> sizes;
    for (std::size_t k = 0; k < set.count(); ++k) {
      sizes.push_back(set[k].size());
      data_.push_back(set[k].data());
      offsets_.push_back(offsets.empty() ? set.offset(k) : offsets[k]);
    }
    table_ = exec::chunk_table(sizes);
    if constexpr (!host) {
      device_pieces_ = buffer<exec::piece, Space>(table_.pieces().size());
      device_first_ = buffer<std::uint32_t, Space>(table_.first().size());
      device_data_ = buffer<float*, Space>(data_.size());
      device_offsets_ = buffer<std::size_t, Space>(offsets_.size());
      exec.from_host(device_pieces_.data(), table_.pieces().data(), table_.pieces().size());
      exec.from_host(device_first_.data(), table_.first().data(), table_.first().size());
      exec.from_host(device_data_.data(), data_.data(), data_.size());
      exec.from_host(device_offsets_.data(), offsets_.data(), offsets_.size());
    } else {
      (void)exec;
    }
  }

  ///@{
  /// The number of tensors, and of their elements.
  std::size_t count() const { return data_.size(); }
  std::size_t elements() const { return table_.elements(); }
  ///@}
  /// The chunk table in the executor's memory.
  exec::chunk_view chunks() const {
    if constexpr (host)
      return table_.view();
    else
      return {device_pieces_.data(), device_first_.data(), table_.chunks(), table_.elements()};
  }
  /// Every tensor's data pointer and offset, in the executor's memory.
  kernels::tensor_ptrs ptrs() const {
    if constexpr (host)
      return {data_.data(), offsets_.data()};
    else
      return {device_data_.data(), device_offsets_.data()};
  }
  /// The host's copy of the table (the same pieces).
  const exec::chunk_table& table() const { return table_; }

 private:
  exec::chunk_table table_;
  std::vector<float*> data_;
  std::vector<std::size_t> offsets_;
  buffer<exec::piece, Space> device_pieces_;
  buffer<std::uint32_t, Space> device_first_;
  buffer<float*, Space> device_data_;
  buffer<std::size_t, Space> device_offsets_;
};

/// The gradients of a step as a pointer array in the executor's memory.
template <class Space>
class gradient_list {
  static constexpr bool host = std::is_same_v<Space, host_space>;

 public:
  gradient_list() = default;
  /// `count` gradients; nothing is uploaded until the first update().
  explicit gradient_list(std::size_t count) : host_(count, nullptr) {
    if constexpr (!host) device_ = buffer<const float*, Space>(count);
  }

  /// Takes this step's pointers (data(k) for k < count()); returns the array
  /// the passes read.
  template <class Exec, class Data>
  const float* const* update(Exec& exec, Data&& data) {
    bool changed = !uploaded_;
    for (std::size_t k = 0; k < host_.size(); ++k) {
      const float* p = data(k);
      changed = changed || p != host_[k];
      host_[k] = p;
    }
    if constexpr (host) {
      (void)exec;
      return host_.data();
    } else {
      if (changed) exec.from_host(device_.data(), host_.data(), host_.size());
      uploaded_ = true;
      return device_.data();
    }
  }

 private:
  std::vector<const float*> host_;
  buffer<const float*, Space> device_;
  bool uploaded_ = false;
};

}  // namespace diloco
