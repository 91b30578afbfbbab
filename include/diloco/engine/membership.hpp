// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::engine_membership<Comm, Space>: elastic membership, the part of
// an engine that re-forms the group (docs/internals.md, "Elastic
// membership"). It depends only on the communicator and the memory space;
// what it needs of the engine above it is four hooks: replan() (everything
// that depends on the group's size, after it changed), reset_replica() (the
// replica and the schedule's buffers from theta_global), abort_in_flight()
// (drop the reductions in flight) and the state walk of engine_base
// (visit_state, flat_size) from which broadcast_global() sends the state
// every member holds alike.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "diloco/core/state.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/engine/group.hpp"

namespace diloco::detail {

template <class Comm, class Space>
class engine_membership : public engine_group<Comm, Space> {
  using group = engine_group<Comm, Space>;

 protected:
  using group::group;
  using group::comm_;
  using group::exec_;
  using group::notify;
  using group::position_;
  using group::rank_;
  using group::round_open_;
  using group::stats_;
  using group::transport_;
  using group::world_;

  // Where this worker is when a membership check or a recovery happens;
  // the digest every member sends in resync() carries it.
  enum class where : std::uint8_t { before_round, in_round, after_round, phase_end };

  // The hooks into the engine.
  virtual void replan() = 0;
  virtual void reset_replica() = 0;
  virtual void abort_in_flight() = 0;

  // resync() until it succeeds, forming the next generation (another
  // member failed meanwhile) in between.
  bool resync_loop(where at) {
    for (;;) {
      try {
        const bool retry = resync(at);
        report_membership();
        return retry;
      } catch (const comm_error&) {
        recover_comm();  // throws when this worker was dropped or too few remain
        replan();
      }
    }
  }

  // After the group re-formed: every member agrees on the policies and
  // options (a joiner must run the same program), then sends a digest
  // (rounds applied, schedule position, where it stands, whether it is
  // fresh). When they differ, the state every rank holds identically
  // (theta_global, outer slots and step counts, rounds, the schedule's
  // clock) goes from the lowest rank among those furthest along to all;
  // the ranks that were behind or fresh restart their replica from it.
  // Returns whether the round interrupted here is to be run again now: all
  // members were inside it (or before it) with the same round count at the
  // same inner step. Members that stand at different steps of the same
  // round take the root's clock (a replica with fewer local steps lacks
  // nothing), and none runs the rest of the interrupted step's schedule.
  bool resync(where at) {
    this->agree(agreed_);
    // previous_rank: the member's rank in the group it last reported (-1:
    // joining now), from which the membership event names who left and
    // who joined.
    struct digest {
      std::uint64_t rounds, position;
      std::uint8_t at, fresh, pad[2];
      std::int32_t previous_rank;
    };
    digest mine{stats_.rounds, position_, static_cast<std::uint8_t>(at), static_cast<std::uint8_t>(fresh_ ? 1 : 0), {},
                static_cast<std::int32_t>(previous_rank_)};
    std::vector<std::byte> bytes(sizeof mine);
    std::memcpy(bytes.data(), &mine, sizeof mine);
    const std::vector<std::byte> all = this->gather_bytes(bytes);
    std::vector<digest> d(static_cast<std::size_t>(world_));
    std::memcpy(d.data(), all.data(), all.size());
    members_previous_.clear();
    for (const digest& x : d) members_previous_.push_back(x.previous_rank);
    // The root is the member furthest along: most rounds applied, then
    // latest position (members that failed at different steps of the same
    // round: a collective that completed on some ranks before a peer died
    // lets them go on a step or two further before they notice).
    auto further = [&](const digest& x, const digest& y) {
      return x.rounds != y.rounds ? x.rounds > y.rounds : x.position > y.position;
    };
    int root = -1;
    for (int r = 0; r < world_; ++r) {
      const digest& x = d[static_cast<std::size_t>(r)];
      if (x.fresh) continue;
      if (root < 0 || further(x, d[static_cast<std::size_t>(root)])) root = r;
    }
    bool retry = root >= 0;
    bool differ = root < 0;
    for (int r = 0; r < world_; ++r) {
      const digest& x = d[static_cast<std::size_t>(r)];
      if (x.fresh) {
        differ = true;
        retry = false;
        continue;
      }
      const digest& top = d[static_cast<std::size_t>(root)];
      // Same rounds, an earlier position: the replica holds fewer local
      // steps but nothing it lacks; the schedule's clock is the root's.
      const bool level = x.rounds == top.rounds && x.position == top.position;
      if (!level) differ = true;
      if (!level || x.at == static_cast<std::uint8_t>(where::after_round)) retry = false;
    }
    if (root < 0) root = 0;
    if (differ) {
      const bool behind = fresh_ || mine.rounds != d[static_cast<std::size_t>(root)].rounds;
      broadcast_global(root);
      if (behind) reset_replica();
    }
    fresh_ = false;
    round_open_ = false;
    return retry;
  }

  // The state every rank holds identically, from `root` to all.
  void broadcast_global(int root) {
    if (world_ == 1) return;
    struct collect final : state_visitor {
      std::vector<std::pair<float*, std::size_t>> buffers;
      std::vector<std::uint64_t*> scalars;
      void buffer(std::string_view name, float* data, std::size_t size, bool) override {
        if (checkpoint::is_global_entry(name)) buffers.push_back({data, size});
      }
      void scalar(std::string_view name, std::uint64_t& value) override {
        if (checkpoint::is_global_entry(name)) scalars.push_back(&value);
      }
    } c;
    this->visit_state(c);
    const std::size_t chunk = std::max<std::size_t>(1, this->flat_size());
    for (auto [data, size] : c.buffers)
      for (std::size_t at = 0; at < size; at += chunk)
        transport_.broadcast(comm_, exec_, data + at, std::min(chunk, size - at), root);
    // The counters travel as the bits of pairs of floats.
    std::vector<float> packed(2 * c.scalars.size());
    for (std::size_t i = 0; i < c.scalars.size(); ++i) std::memcpy(&packed[2 * i], c.scalars[i], sizeof(std::uint64_t));
    diloco::buffer<float, Space> wire(packed.size());
    exec_.from_host(wire.data(), packed.data(), packed.size());
    transport_.broadcast(comm_, exec_, wire.data(), wire.size(), root);
    exec_.to_host(packed.data(), wire.data(), packed.size());
    for (std::size_t i = 0; i < c.scalars.size(); ++i) std::memcpy(c.scalars[i], &packed[2 * i], sizeof(std::uint64_t));
  }

  // What survive() saw: the body finished; or a collective failed and the
  // group re-formed, with the interrupted round to be run again now
  // (run_again: every member was inside it or before it) or not
  // (recovered).
  enum class survived : std::uint8_t { done, run_again, recovered };

  // The one way the engine and the schedules meet a failed collective: runs
  // body; a comm_error propagates unchanged from a fixed group, and in an
  // elastic group aborts what is in flight and re-forms the group at `at`
  // (recover_after_failure). The caller goes on by the outcome.
  template <class Body>
  survived survive(where at, Body&& body) {
    try {
      body();
      return survived::done;
    } catch (const comm_error&) {
      if (!elastic_) throw;
      return recover_after_failure(at) ? survived::run_again : survived::recovered;
    }
  }

  // A collective failed (a peer died or stalled): abort what is in flight,
  // form the next generation with the survivors and resync. Returns whether
  // the interrupted round is to be run again now (see resync).
  bool recover_after_failure(where at) {
    abort_in_flight();
    ++recoveries_;
    recover_comm();  // throws when this worker was dropped or too few remain
    replan();
    return resync_loop(at);
  }

  // A membership check at a point where nothing is in flight. Returns
  // whether the interrupted round is to be run (only a failed check can
  // say no).
  bool membership_check(where at) {
    if (!elastic_) return true;
    bool changed = false;
    try {
      if constexpr (elastic_communicator<Comm>)
        changed = comm_.at_boundary(false, at == where::before_round ? boundary_kind::round_start
                                                                      : boundary_kind::round_end);
    } catch (const comm_error&) {
      return recover_after_failure(at);
    }
    if (changed) {
      ++stats_.membership_changes;
      replan();
      return resync_loop(at);
    }
    return true;
  }

  // Every re-forming of the group passes here or through a membership
  // check that changed the group: both count.
  void recover_comm() {
    ++stats_.membership_changes;
    failure_since_report_ = true;
    if constexpr (elastic_communicator<Comm>)
      comm_.recover();
    else
      raise<state_error>("internal: a recovery was attempted on a communicator that is not elastic");
  }

  // This worker leaves at a boundary of kind `kind` (nothing in flight):
  // the members' next check sees it go, and a membership event says so.
  void leave_at(boundary_kind kind) {
    if constexpr (elastic_communicator<Comm>) {
      try {
        comm_.at_boundary(true, kind);
      } catch (const comm_error&) {
        // The group failed as this worker left: the survivors recover
        // without it, which is what leaving asks for.
      }
    } else {
      (void)kind;
    }
    this->left_ = true;
    stats_.workers = 0;
    notify([&] {
      event e = this->make_event(event_kind::membership);
      e.rank = -1;
      e.world = 0;
      if constexpr (elastic_communicator<Comm>) e.generation = comm_.generation();
      e.previous_rank = rank_;
      e.previous_world = world_;
      e.left = {rank_};
      return e;
    });
  }

  // After a resync: a membership event when the group re-formed since the
  // last one (or this worker was just admitted), from every member's
  // previous rank (resync's digests).
  void report_membership() {
    if (stats_.membership_changes == reported_changes_ && previous_rank_ >= 0) return;
    notify([&] {
      event e = this->make_event(event_kind::membership);
      if constexpr (elastic_communicator<Comm>) e.generation = comm_.generation();
      e.previous_rank = previous_rank_;
      e.previous_world = previous_world_;
      e.after_failure = failure_since_report_;
      std::vector<bool> stayed(static_cast<std::size_t>(std::max(previous_world_, 0)), false);
      for (std::size_t r = 0; r < members_previous_.size(); ++r) {
        const int before = members_previous_[r];
        if (before < 0)
          e.joined.push_back(static_cast<int>(r));
        else if (static_cast<std::size_t>(before) < stayed.size())
          stayed[static_cast<std::size_t>(before)] = true;
      }
      for (std::size_t r = 0; r < stayed.size(); ++r)
        if (!stayed[r]) e.left.push_back(static_cast<int>(r));
      return e;
    });
    reported_changes_ = stats_.membership_changes;
    previous_rank_ = rank_;
    previous_world_ = world_;
    failure_since_report_ = false;
  }

  // Elastic membership (elastic_communicator with elastic() true).
  bool elastic_ = false;
  bool joiner_ = false;  // constructed by a worker joining a running group
  bool fresh_ = false;   // holds no state of the group yet (start-up, joiner)
  std::uint64_t recoveries_ = 0;          // recoveries from a failed collective
  std::vector<agreement_record> agreed_;  // the start-up agreement, repeated at each re-forming
  // Membership events: this worker's rank and group size when it last
  // reported one (-1, 0: joining), the changes counted then, whether a
  // failure forced a change since, and every member's previous rank as the
  // last resync gathered them.
  int previous_rank_ = 0;
  int previous_world_ = 0;
  std::uint64_t reported_changes_ = 0;
  bool failure_since_report_ = false;
  std::vector<int> members_previous_;
};

}  // namespace diloco::detail
