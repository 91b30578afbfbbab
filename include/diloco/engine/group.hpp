// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::engine_group<Comm, Space>: the part of an engine that speaks to
// the group and depends only on the communicator and the memory space, not
// on the policies: the communicator, rank and size, the executor and wire
// transport, the statistics, the gathers of host bytes and texts, the
// start-up agreement, the position check, and the user's event hook. An
// engine (engine.hpp) derives from it through engine_membership
// (engine/membership.hpp), so a program that instantiates many engines over
// one communicator (the demo: 14 compressors x 2 outer steps) compiles this
// once rather than once per engine.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/core/agreement.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/engine/base.hpp"
#include "diloco/exec/executor_for.hpp"
#include "diloco/memory/buffer.hpp"

namespace diloco::detail {

template <class Comm>
int workers_on_host(const Comm& c) {
  if constexpr (requires { c.workers_on_host(); })
    return c.workers_on_host();
  else
    return 1;
}

template <class Comm, class Space>
class engine_group : public engine_base {
 public:
  using executor = typename executor_for<Space>::type;
  using clock = std::chrono::steady_clock;
  using transport_type = wire_transport<Comm, Space, executor>;
  static constexpr bool device = !std::is_same_v<Space, host_space>;

  space_id space() const override { return space_id_v<Space>; }
  const std::vector<per_rank_option>& per_rank_options() const override { return per_rank_; }
  const diloco::stats& statistics() const override { return stats_; }
  bool left() const override { return left_; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::vector<std::string> exchange_text(const std::string& mine) override {
    if (world_ == 1) return {mine};
    return gather_text(mine);
  }

 protected:
  // `flat`: the floats of the flat layout (the transport's fp32 staging);
  // `hook`: the user's event hook (algorithm_options::on_event).
  engine_group(Comm& comm, void* device_stream, std::size_t flat, event_hook hook)
      : comm_(comm),
        world_(comm.size()),
        rank_(comm.rank()),
        exec_(make_executor<executor>(device_stream)),
        transport_(world_ > 1 ? flat + static_cast<std::size_t>(world_) : 0),
        hook_(std::move(hook)) {}

  // The host threads of the fused passes: `host_threads`, or the cores
  // divided among the workers that share this process.
  void set_host_threads(int host_threads) {
    if constexpr (requires { exec_.set_threads(1); }) {
      const int cores = executor{}.threads();
      exec_.set_threads(host_threads > 0 ? host_threads : std::max(1, cores / std::max(1, workers_on_host(comm_))));
    }
  }

  void check_member(const char* what) const {
    if (left_)
      raise<state_error>(what, "(): this worker has left the group (leave()); its algorithm instance keeps "
                               "theta_global as it was, but takes no part in rounds");
  }

  // The start-up agreement (core/agreement.hpp): every rank's records are
  // gathered (their lengths first, then the records padded to the longest)
  // and every rank compares the same bytes, so all raise or none does. Its
  // traffic is counted in stats().setup_bytes, apart from the rounds'.
  void agree(std::vector<agreement_record> records) {
    const auto t0 = clock::now();
    const std::vector<std::string> texts = gather_text(agreement_text(records));  // counts setup_bytes
    std::vector<std::vector<agreement_record>> ranks;
    for (std::size_t r = 0; r < texts.size(); ++r) ranks.push_back(parse_agreement_text(texts[r], static_cast<int>(r)));
    agreement_outcome outcome = compare_agreement(ranks);
    stats_.comm_seconds += seconds_since(t0);
    if (outcome.mismatch) raise<config_error>(*outcome.mismatch);
    if (outcome.initial_check) raise<numeric_error>(*outcome.initial_check);
    per_rank_ = std::move(outcome.per_rank);
  }

  // Every rank's position record (one all-gather of 40 bytes, counted in
  // setup_bytes); raises state_error on every rank when the ranks stand at
  // different steps. The caller judges the non-finite counts.
  std::vector<position_record> exchange_positions(const position_record& mine) {
    std::vector<position_record> all{mine};
    if (world_ > 1) {
      const auto traffic0 = comm_.traffic();
      const auto t0 = clock::now();
      std::vector<std::byte> bytes(sizeof mine);
      std::memcpy(bytes.data(), &mine, sizeof mine);
      const std::vector<std::byte> gathered = gather_bytes(bytes);
      all.resize(static_cast<std::size_t>(world_));
      std::memcpy(all.data(), gathered.data(), gathered.size());
      stats_.setup_bytes += comm_.traffic().bytes_sent - traffic0.bytes_sent;
      stats_.comm_seconds += seconds_since(t0);
    }
    if (const std::string wrong = compare_positions(all); !wrong.empty()) {
      round_open_ = false;
      raise<state_error>(wrong);
    }
    return all;
  }

  // Every rank's text, in rank order (core/agreement.hpp's gather_texts
  // over gather_bytes; counted in setup_bytes).
  std::vector<std::string> gather_text(const std::string& text) {
    const auto traffic0 = comm_.traffic();
    std::vector<std::string> out = gather_texts(text, static_cast<std::size_t>(world_),
                                                [this](const std::vector<std::byte>& mine) { return gather_bytes(mine); });
    stats_.setup_bytes += comm_.traffic().bytes_sent - traffic0.bytes_sent;
    return out;
  }

  // An all-gather of host bytes through the transport (staged through the
  // executor's memory for device tensors).
  std::vector<std::byte> gather_bytes(const std::vector<std::byte>& mine) {
    const std::size_t n = mine.size(), total = n * static_cast<std::size_t>(world_);
    std::vector<std::byte> all(total);
    if (n == 0) return all;
    if constexpr (device) {
      buffer<std::byte, Space> send(n), recv(total);
      exec_.from_host(send.data(), mine.data(), n);
      if (total > reserved_bytes_) transport_.reserve_bytes(reserved_bytes_ = total);
      transport_.all_gather(comm_, exec_, send.data(), n, recv.data());
      exec_.to_host(all.data(), recv.data(), total);
    } else {
      transport_.all_gather(comm_, exec_, mine.data(), n, all.data());
    }
    return all;
  }

  // ------------------------------------------------------------- events
  // The user's hook (core/event.hpp): the event is built only when one is
  // set; what the hook throws is kept, and guarded() rethrows it once the
  // public call has done its work.
  template <class Make>
  void notify(Make&& make) {
    if (!hook_) return;
    const event e = make();
    try {
      hook_(e);
    } catch (...) {
      if (!hook_error_) hook_error_ = std::current_exception();
    }
  }

  event make_event(event_kind k) const {
    event e;
    e.kind = k;
    e.rank = rank_;
    e.world = world_;
    e.inner_step = position_;
    return e;
  }

  // Runs a public call's body; a hook's exception kept meanwhile is
  // rethrown once the body returned, and dropped if the body raised.
  template <class Body>
  auto guarded(Body&& body) {
    try {
      if constexpr (std::is_void_v<decltype(body())>) {
        body();
        deliver_hook_error();
      } else {
        auto result = body();
        deliver_hook_error();
        return result;
      }
    } catch (...) {
      hook_error_ = nullptr;
      throw;
    }
  }

  void deliver_hook_error() {
    if (hook_error_) std::rethrow_exception(std::exchange(hook_error_, nullptr));
  }

  static double seconds_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  static double seconds_since(clock::time_point t0) { return seconds_between(t0, clock::now()); }

  Comm& comm_;
  int world_;
  int rank_;
  executor exec_;
  transport_type transport_;
  std::size_t reserved_bytes_ = 0;  // the transport's byte staging (device tensors)
  diloco::stats stats_;
  std::vector<per_rank_option> per_rank_;  // per-rank options that differ between ranks
  std::uint64_t steps_in_round_ = 0;
  std::uint64_t position_ = 0;  // inner steps taken: the schedule's clock
  bool left_ = false;           // this worker left the group
  bool round_open_ = false;     // a reduction began and was not applied yet
  event_hook hook_;
  std::exception_ptr hook_error_;  // the first exception the hook threw in the current call
};

}  // namespace diloco::detail
