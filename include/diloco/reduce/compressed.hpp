// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "diloco/compress/compressed_mean.hpp"
#include "diloco/reduce/staged.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

/// The reducer for lossy codecs: the compressed mean's protocol (encode,
/// all-to-all, reduce the shard, all-gather, vote; compress/compressed_mean.hpp
/// says why) on reduce::staged's state machine, over the per-space operations
/// of compress::compressed_mean<C, host_space> (fused host passes) and
/// <C, device_space> (team programs, device checksums).
template <class Compressor, class Comm, class Space, class Exec>
class compressed
    : public staged<compressed<Compressor, Comm, Space, Exec>, compress::compressed_mean<Compressor, Space>, Comm, Space,
                    Exec> {
  using engine_type = compress::compressed_mean<Compressor, Space>;
  using base = staged<compressed, engine_type, Comm, Space, Exec>;
  friend base;

 public:
  /// The fragment id goes into every segment header and seeds the
  /// fragment's stochastic-rounding streams (diloco::detail::stream_seed).
  compressed(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
             std::uint32_t fragment, Exec& exec)
      : base(base::make_engine(params, world, rank, opts, fragment, exec), world) {}

 private:

  /// all-to-all of the encoded shards, then reduce; all-gather of the
  /// reduced shards, then check them.
  static constexpr std::size_t exchanges = 2;
  collective exchange(std::size_t i) {
    engine_type& e = *this->engine_;
    if (i == 0) return {collective::kind::all_to_all, e.send_data(), e.recv_data(), e.exchange_bytes()};
    return {collective::kind::all_gather, e.reduced_data(), e.gathered_data(), e.slot_bytes()};
  }
  void alone(std::size_t i, Exec& exec) {
    if (i == 0)
      this->engine_->self_all_to_all(exec);
    else
      this->engine_->self_all_gather(exec);
  }
  void after(std::size_t i, Exec& exec) {
    if (i == 0)
      this->engine_->reduce(exec);
    else
      this->engine_->check_gathered(exec);
  }
};

}  // namespace diloco::reduce
