// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "diloco/compress/gathered_mean.hpp"
#include "diloco/reduce/staged.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

/// The reducer for sparse codecs (chunk_topk): the gathered mean's protocol
/// (encode, all-gather, validate and vote; compress/gathered_mean.hpp says
/// why) on reduce::staged's state machine, over compress::gathered_mean<C,
/// host_space> (fused host passes) or <C, device_space> (team programs).
template <class Compressor, class Comm, class Space, class Exec>
class gathered
    : public staged<gathered<Compressor, Comm, Space, Exec>, compress::gathered_mean<Compressor, Space>, Comm, Space,
                    Exec> {
  using engine_type = compress::gathered_mean<Compressor, Space>;
  using base = staged<gathered, engine_type, Comm, Space, Exec>;
  friend base;

 public:
  /// The reducer of one fragment (`fragment`, carried in its headers) over `params`, rank `rank`
  /// of `world`; `exec` uploads a device engine's tables.
  gathered(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
           std::uint32_t fragment, Exec& exec)
      : base(base::make_engine(params, world, rank, opts, fragment, exec), world) {}

 private:

  /// One all-gather of every rank's segment, then validate them all.
  static constexpr std::size_t exchanges = 1;
  collective exchange(std::size_t) {
    engine_type& e = *this->engine_;
    return {collective::kind::all_gather, e.send_data(), e.gathered_data(), e.slot_bytes()};
  }
  void alone(std::size_t, Exec& exec) { this->engine_->self_all_gather(exec); }
  void after(std::size_t, Exec& exec) { this->engine_->check_gathered(exec); }
};

}  // namespace diloco::reduce
