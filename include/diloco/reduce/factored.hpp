#pragma once

// The reducer for low-rank compression (compress/low_rank.hpp): encode P,
// all-gather, orthonormalise and compute Q, all-gather, validate and vote,
// all-reduce the votes; a state machine like reduce::gathered's (each
// collective non-blocking when overlapping with an async host
// communicator, else all at once). Host memory only for now.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/compress/low_rank.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/reduce/verdict.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

template <class Compressor, class Comm, class Space, class Exec>
class factored {
  using engine_type = compress::low_rank_mean<Space>;
  static constexpr bool staged_async = async_host_communicator<Comm> && std::is_same_v<Space, host_space>;

 public:
  using transport = detail::wire_transport<Comm, Space, Exec>;

  factored(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
           std::uint32_t fragment, Exec& /*exec*/)
      : engine_(std::make_unique<engine_type>(params, world, rank, opts, fragment)) {}

  std::size_t slot_bytes() const { return engine_->slot_bytes(); }
  auto residual() const { return engine_->residual(); }
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    engine_->visit_state(v, prefix);
  }

  void begin(Exec& exec, Comm& comm, transport& link, const float* ref, std::uint64_t round, bool overlap) {
    async_ = staged_async && overlap;
    engine_->encode(exec, ref, round);
    stage_ = stage::gather_p;
    start(exec, comm, link);
  }

  // Drops the exchange in flight (elastic recovery): the pending collective
  // is waited for and its result ignored; the residual was not committed.
  void abort() {
    pending_ = {};
    stage_ = stage::done;
  }

  // Runs every stage whose collective has completed; true when the whole
  // exchange has.
  bool poll(Exec& exec, Comm& comm, transport& link) {
    while (stage_ != stage::done) {
      if (!pending_.test()) return false;
      advance(exec, comm, link);
    }
    return true;
  }

  verdict wait(Exec& exec, Comm& comm, transport& link) {
    while (stage_ != stage::done) {
      pending_.wait();
      advance(exec, comm, link);
    }
    return out_;
  }

  template <class Update, class Merge>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t stride, const Merge& merge) {
    engine_->apply(exec, update, global, state, stride, merge);
  }

 private:
  // The protocol: stage_ names the collective in flight (or just done).
  enum class stage { gather_p, gather_q, vote, done };

  // Starts the current stage's collective: non-blocking when overlapping
  // (poll/wait finish it), else blocking through the transport (staged for
  // device buffers and a host communicator); a world of one copies.
  void start(Exec& exec, Comm& comm, transport& link) {
    engine_type& e = *engine_;
    const bool alone = comm.size() == 1;
    if constexpr (staged_async) {
      if (async_ && !alone) {
        switch (stage_) {
          case stage::gather_p:
            pending_.req = comm.iall_gather(std::span<const std::byte>(e.send1(), e.slot1()),
                                            std::span<std::byte>(e.gathered1(), e.slot1() * static_cast<std::size_t>(comm.size())));
            return;
          case stage::gather_q:
            pending_.req = comm.iall_gather(std::span<const std::byte>(e.send2(), e.slot2()),
                                            std::span<std::byte>(e.gathered2(), e.slot2() * static_cast<std::size_t>(comm.size())));
            return;
          case stage::vote:
            pending_.req = comm.iall_reduce(std::span<float>(e.vote_data(), e.vote_count()), reduce_op::sum);
            return;
          case stage::done:
            return;
        }
      }
    }
    switch (stage_) {
      case stage::gather_p:
        if (alone)
          e.self_gather1(exec);
        else
          link.all_gather(comm, exec, e.send1(), e.slot1(), e.gathered1());
        break;
      case stage::gather_q:
        if (alone)
          e.self_gather2(exec);
        else
          link.all_gather(comm, exec, e.send2(), e.slot2(), e.gathered2());
        break;
      case stage::vote:
        if (!alone) link.all_reduce(comm, exec, e.vote_data(), e.vote_count(), reduce_op::sum);
        break;
      case stage::done:
        return;
    }
    // Blocking: the collective is complete, go on at once.
    advance(exec, comm, link);
  }

  // The current stage's collective has completed: run the operations after
  // it and start the next collective.
  void advance(Exec& exec, Comm& comm, transport& link) {
    switch (stage_) {
      case stage::gather_p:
        engine_->second(exec);
        stage_ = stage::gather_q;
        break;
      case stage::gather_q:
        engine_->check_gathered(exec);
        stage_ = stage::vote;
        break;
      case stage::vote:
        out_ = engine_->result(exec);
        stage_ = stage::done;
        return;
      case stage::done:
        return;
    }
    start(exec, comm, link);
  }

  std::unique_ptr<engine_type> engine_;
  stage stage_ = stage::done;
  bool async_ = false;
  verdict out_;
  pending<Comm> pending_;
};

}  // namespace diloco::reduce
