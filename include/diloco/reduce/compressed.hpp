#pragma once

// The reducer for lossy codecs: compress::compressed_mean's protocol
// (encode, all-to-all, reduce the shard, all-gather, vote) as a state
// machine. With an async communicator and an overlapping schedule each
// collective is started non-blocking and the next stage runs when poll()
// finds it complete, between inner steps; otherwise begin() runs every
// stage at once. Device tensors run the device engine's exchange through
// the transport in begin() (their collectives are staged or NCCL-blocking),
// so they overlap nothing yet.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/compress/compressed_mean.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/kernels/random.hpp"
#include "diloco/reduce/verdict.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

template <class Compressor, class Comm, class Space, class Exec>
class compressed {
  using engine_type = compress::compressed_mean<Compressor, Space>;
  static constexpr bool staged_async = async_host_communicator<Comm> && std::is_same_v<Space, host_space>;

 public:
  using transport = detail::wire_transport<Comm, Space, Exec>;

  compressed(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
             std::uint64_t fragment, Exec& exec) {
    auto o = opts;
    // Each fragment draws its own stochastic-rounding stream; fragment 0
    // keeps the compressor's seed, so one fragment gives wave 1's bits.
    if constexpr (requires { o.seed; })
      if (fragment != 0) o.seed = kernels::mix64(o.seed ^ (0x667261676d656e74ULL + fragment));
    if constexpr (std::is_same_v<Space, host_space>) {
      (void)exec;
      engine_ = std::make_unique<engine_type>(params, world, rank, o, static_cast<std::uint32_t>(fragment));
    } else {
      engine_ = std::make_unique<engine_type>(params, world, rank, o, exec, static_cast<std::uint32_t>(fragment));
    }
  }

  std::size_t slot_bytes() const { return engine_->slot_bytes(); }
  const engine_type& engine() const { return *engine_; }
  auto residual() const { return engine_->residual(); }
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    engine_->visit_state(v, prefix);
  }

  void begin(Exec& exec, Comm& comm, transport& link, const float* ref, std::uint64_t round, bool overlap) {
    if constexpr (staged_async) {
      if (overlap) {
        engine_->encode(exec, ref, round);
        stage_ = stage::all_to_all;
        pending_.req = comm.iall_to_all(engine_->send_bytes(), engine_->recv_bytes());
        return;
      }
    }
    (void)overlap;
    if constexpr (std::is_same_v<Space, host_space>) {
      (void)link;
      out_ = engine_->exchange(exec, comm, ref, round);
    } else {
      out_ = engine_->exchange(exec, comm, link, ref, round);
    }
    stage_ = stage::done;
  }

  // Runs every stage whose collective has completed; true when the whole
  // exchange has.
  bool poll(Exec& exec, Comm& comm) {
    while (stage_ != stage::done) {
      if (!pending_.test()) return false;
      advance(exec, comm);
    }
    return true;
  }

  verdict wait(Exec& exec, Comm& comm) {
    while (stage_ != stage::done) {
      pending_.wait();
      advance(exec, comm);
    }
    return out_;
  }

  template <class Update, class Merge>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t stride, const Merge& merge) {
    engine_->apply(exec, update, global, state, stride, merge);
  }

 private:
  enum class stage { all_to_all, all_gather, vote, done };

  // The collective of the current stage has completed: run the next stage.
  void advance(Exec& exec, Comm& comm) {
    if constexpr (staged_async) {
      switch (stage_) {
        case stage::all_to_all:
          engine_->reduce(exec);
          stage_ = stage::all_gather;
          pending_.req = comm.iall_gather(engine_->reduced_bytes(), engine_->gathered_bytes());
          return;
        case stage::all_gather:
          engine_->check_gathered();
          stage_ = stage::vote;
          pending_.req = comm.iall_reduce(engine_->verdict(), reduce_op::sum);
          return;
        case stage::vote:
          out_ = engine_->result();
          stage_ = stage::done;
          return;
        case stage::done:
          return;
      }
    } else {
      (void)exec;
      (void)comm;
      stage_ = stage::done;
    }
  }

  std::unique_ptr<engine_type> engine_;
  stage stage_ = stage::done;
  verdict out_;
  pending<Comm> pending_;
};

}  // namespace diloco::reduce
