// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/kernels/tensor_passes.hpp"
#include "diloco/reduce/verdict.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/tensor/tensor_list.hpp"

namespace diloco::reduce {

/// The reducer for lossless pseudo-gradients: the mean travels as fp32
/// through the communicator's all-reduce (sum).
///   begin: one pass writes Δ = ref − local into the wire and its squares
///          into this rank's norm slot (M slots behind the values: every rank
///          learns every norm, so all refuse a bad round together), then the
///          all-reduce starts (non-blocking when the schedule overlaps);
///   wait:  completes it and checks the norms;
///   apply: one pass of outer step + merge over all the fragment's tensors.
/// Both passes run over the fragment's tensor list (exec/chunks.hpp): one
/// parallel region on the host, one launch on the GPU, whatever the number of
/// tensors.
/// A world of one with nothing to overlap keeps no wire: the norm is taken
/// at begin and the apply pass computes Δ itself (outer_apply_local).
template <class Comm, class Space, class Exec>
class fp32_mean {
 public:
  /// How the all-reduce reaches the communicator (direct, or staged through host memory).
  using transport = detail::wire_transport<Comm, Space, Exec>;

  /// `params`: the fragment's tensors, offsets from the fragment's start;
  /// `list`: the same as a tensor list of the engine's executor.
  /// `snapshot`: the pseudo-gradient must be kept from begin to apply
  /// (inner steps run in between), so even a world of one needs a wire.
  fp32_mean(const parameter_set<float, Space>& params, const tensor_list<Space>& list, int world, int rank,
            bool snapshot)
      : params_(&params), list_(&list), world_(world), rank_(rank), local_only_(world == 1 && !snapshot) {
    if (!local_only_) wire_ = buffer<float, Space>(params.total() + static_cast<std::size_t>(world));
    norms_.assign(static_cast<std::size_t>(world), 0.0f);
  }

  /// Floats the transport must be able to stage.
  std::size_t wire_floats() const { return wire_.size(); }

  /// Starts a reduction: Δ = ref − local and its norm into the wire, then the all-reduce
  /// (non-blocking when `overlap` and the transport allows it). `ref` is the point the
  /// pseudo-gradient is taken from.
  void begin(Exec& exec, Comm& comm, transport& link, const float* ref, bool overlap) {
    out_ = {};
    if (local_only_) {
      out_.delta_norm =
          std::sqrt(exec.transform_reduce_chunked(list_->chunks(), kernels::pseudo_gradients_sq{ref, list_->ptrs()}));
      return;
    }
    out_.delta_norm = std::sqrt(
        exec.transform_reduce_chunked(list_->chunks(), kernels::pseudo_gradients{ref, list_->ptrs(), wire_.data()}));
    std::fill(norms_.begin(), norms_.end(), 0.0f);
    norms_[static_cast<std::size_t>(rank_)] = static_cast<float>(out_.delta_norm);
    exec.from_host(wire_.data() + params_->total(), norms_.data(), norms_.size());
    if (world_ == 1) return;
    if constexpr (transport::async) {
      if (overlap) {
        pending_ = link.iall_reduce(comm, exec, wire_.data(), wire_.size(), reduce_op::sum);
        return;
      }
    }
    (void)overlap;
    link.all_reduce(comm, exec, wire_.data(), wire_.size(), reduce_op::sum);
  }

  /// Drops the reduction in flight (elastic recovery): its collective is
  /// waited for (a failed group fails it at once) and its result ignored.
  void abort() { pending_ = {}; }

  /// True once the reduction has completed (it makes progress here).
  bool poll() { return pending_.test(); }

  /// Completes the all-reduce and checks every rank's norm: the verdict, the same on every rank.
  verdict wait(Exec& exec) {
    pending_.wait();
    verdict out = out_;
    if (local_only_) {
      if (!std::isfinite(out.delta_norm)) {
        out.accepted = false;
        out.problem = detail::concat("non-finite pseudo-gradient from rank 0 (norm ", detail::norm_text(out.delta_norm), ")");
      }
      return out;
    }
    exec.to_host(norms_.data(), wire_.data() + params_->total(), norms_.size());
    check_norms(norms_, out);
    return out;
  }

  /// A completed reduction's result for apply(), under `prefix` (checkpoints
  /// of a reduction in flight): the wire, the sum of the pseudo-gradients
  /// and every rank's norm. Empty when the world of one keeps no wire
  /// (nothing is in flight then).
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.floats(prefix + "wire", wire_.data(), wire_.size(), !std::is_same_v<Space, host_space>);
  }

  /// Outer step on `global` (the fragment's theta_global) with the mean,
  /// then the merge into the replica.
  template <class Update, class Merge>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t stride, const Merge& merge) {
    if (local_only_)
      exec.for_each_chunked(list_->chunks(), kernels::outer_applies_local<Update, Merge>{update, global, state, stride,
                                                                                         list_->ptrs(), merge});
    else
      exec.for_each_chunked(list_->chunks(),
                            kernels::outer_applies<Update, Merge>{update, wire_.data(), 1.0f / static_cast<float>(world_),
                                                                  global, state, stride, list_->ptrs(), merge});
  }

 private:
  const parameter_set<float, Space>* params_;
  const tensor_list<Space>* list_;
  int world_;
  int rank_;
  bool local_only_;
  buffer<float, Space> wire_;
  std::vector<float> norms_;
  verdict out_;
  typename transport::request pending_;
};

}  // namespace diloco::reduce
