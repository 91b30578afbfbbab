// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "diloco/compress/low_rank.hpp"
#include "diloco/reduce/staged.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

/// The reducer for low-rank compression (compress/low_rank.hpp) on
/// reduce::staged's state machine: encode P, all-gather, orthonormalise and
/// compute Q, all-gather, validate and vote, over compress::low_rank_mean<Space>
/// (host or device memory: the passes are DILOCO_HD functors,
/// kernels/low_rank_passes.hpp, run by the executor).
template <class Compressor, class Comm, class Space, class Exec>
class factored : public staged<factored<Compressor, Comm, Space, Exec>, compress::low_rank_mean<Space>, Comm, Space, Exec> {
  using engine_type = compress::low_rank_mean<Space>;
  using base = staged<factored, engine_type, Comm, Space, Exec>;
  friend base;

 public:
  /// The reducer of one fragment (`fragment`, carried in its headers) over `params`, rank `rank`
  /// of `world`; `exec` uploads a device engine's tables.
  factored(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
           std::uint32_t fragment, Exec& exec)
      : base(base::make_engine(params, world, rank, opts, fragment, exec), world) {}

 private:
  /// The P segments, then the Q segments.
  static constexpr std::size_t exchanges = 2;
  collective exchange(std::size_t i) {
    engine_type& e = *this->engine_;
    if (i == 0) return {collective::kind::all_gather, e.send1(), e.gathered1(), e.slot1()};
    return {collective::kind::all_gather, e.send2(), e.gathered2(), e.slot2()};
  }
  void alone(std::size_t i, Exec& exec) {
    if (i == 0)
      this->engine_->self_gather1(exec);
    else
      this->engine_->self_gather2(exec);
  }
  void after(std::size_t i, Exec& exec) {
    if (i == 0)
      this->engine_->second(exec);
    else
      this->engine_->check_gathered(exec);
  }
};

}  // namespace diloco::reduce
