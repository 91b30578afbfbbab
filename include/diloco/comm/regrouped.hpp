// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diloco/comm/detail/id_record.hpp"
#include "diloco/comm/gloo.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco::comm {

/// What a factory is told when it makes the data communicator of a
/// generation. `timeout` (the membership's) must bound the creation and
/// every operation: recovery admits the live members that fail within it.
struct data_group {
  std::uint64_t generation = 0;  ///< the generation the communicator is for
  ///@{
  /// This member's rank in the generation, and the generation's size.
  int rank = 0;
  int size = 1;
  ///@}
  std::string member{};  ///< the membership's id of this worker ("r2", "j0")
  std::chrono::milliseconds timeout{};  ///< bounds the creation and every operation
};

/// Makes the data communicator of each generation. `name` names it in keys
/// and messages; make_id() (rank 0 of a generation only) returns the id the
/// others receive; create(id, group) makes this member's communicator
/// (collective over the generation's members; a member that does not come
/// is a comm_error within group.timeout). The communicator takes device
/// memory, non-blocking too, and may have abort(reason) (drop it without
/// waiting for peers).
template <class F>
concept data_factory = requires(F& f, std::span<const char> id, const data_group& g) {
  typename F::communicator;
  { F::name } -> std::convertible_to<std::string_view>;
  { f.make_id() } -> std::convertible_to<std::vector<char>>;
  { f.create(id, g) } -> std::same_as<typename F::communicator>;
} && async_device_communicator<typename F::communicator> && std::move_constructible<typename F::communicator>;

namespace detail_regroup {

// The store key of generation g's id, under the run's scope of the store
// ("diloco/<run id>/elastic/"): the run and the generation are in it.
inline std::string id_key(std::uint64_t generation, std::string_view name) {
  return diloco::detail::concat("g", generation, "/data/", name);
}

// Generation g's id record: rank 0 of g makes it and publishes it under g's
// key, the others wait for that key up to g.timeout. Throws comm_error
// naming the generation when it does not appear in time (rank 0 of g is
// missing: the caller recovers) or rank 0 cannot publish it.
template <unique_id_store Store, class MakeId>
std::vector<char> group_id_record(Store& store, const data_group& g, std::string_view name, MakeId&& make_id) {
  return detail_id::exchange_record(store, g.rank, id_key(g.generation, name), g.timeout, make_id,
                                    diloco::detail::concat(name, " (generation ", g.generation, ")"),
                                    diloco::detail::concat("the id of generation ", g.generation));
}

// The id a record carries. A corrupt or foreign record is a format_error;
// rank 0's failure to make the id is a comm_error with its reason (every
// member of the generation gets it: a retry would fail the same way).
inline std::vector<char> decode_group_id(std::span<const char> record, const data_group& g, std::string_view name) {
  const std::string key = id_key(g.generation, name);
  const detail_id::record_view id =
      detail_id::decode_record(record, diloco::detail::concat(name, " id of generation ", g.generation),
                               diloco::detail::concat("store key '", key, "'"));
  if (id.failed)
    diloco::detail::raise<comm_error>(name, " (generation ", g.generation, "): rank 0 could not make the id of the "
                                      "generation's communicator: ", id.failure());
  return {id.payload.begin(), id.payload.end()};
}

}  // namespace detail_regroup

/// An elastic device communicator made of two: comm::gloo (options.elastic)
/// keeps the group's membership (generations in the rendezvous store,
/// at_boundary, recover, join), and a data communicator that a factory makes
/// for each generation carries the collectives (NCCL in production:
/// comm/elastic_nccl.hpp). Whenever the group re-forms (a membership check
/// that changed it, recover(), join()) the old data communicator is aborted
/// (its abort(), when it has one: ncclCommAbort) and a new one is made for
/// the new generation: rank 0 of the generation makes an id and publishes it
/// under a key naming the run and the generation, the others read it
/// (bounded by the membership's timeout), and every member creates its data
/// communicator with its new rank and size. A member of a stale generation
/// reads only its own generation's key, so it never picks up another
/// generation's id. Link diloco::gloo (and what the factory needs).
///
/// ```
/// diloco::comm::regrouped<F> comm(gloo_options, F{...});
/// algorithm<..., diloco::comm::regrouped<F>, ...> t(device_params, comm, opts);
/// ```
///
/// A collective that fails (the data communicator's comm_error: a dead
/// peer, a timeout) leads the algorithm to recover(), as with comm::gloo.
template <data_factory Factory>
class regrouped {
 public:
  using data_communicator = typename Factory::communicator;  ///< what the factory makes for each generation
  using request = typename data_communicator::request;  ///< its request type, returned by the non-blocking operations

  /// Joins the membership (comm::gloo's constructor: the first generation,
  /// or a joiner when this rank ran before in the run), then, as a member,
  /// makes generation 0's data communicator.
  explicit regrouped(gloo::options membership, Factory factory = {})
      : factory_(std::move(factory)),
        membership_(std::move(membership)),
        store_(membership_.settings(), "elastic",
               diloco::detail::concat("comm::regrouped<", Factory::name, "> on rank ", membership_.rank())) {
    if (!membership_.joining()) regroup();
  }
  /// Membership options from the environment (comm::gloo::options_from_env).
  static regrouped from_env(Factory factory = {}) { return regrouped(gloo::options_from_env(), std::move(factory)); }

  regrouped(const regrouped&) = delete;
  regrouped& operator=(const regrouped&) = delete;

  ///@{
  /// This worker's rank and the group's size (the membership's), and the ranks sharing this
  /// host's cores.
  int rank() const { return membership_.rank(); }
  int size() const { return membership_.size(); }
  int workers_on_host() const { return membership_.workers_on_host(); }
  ///@}
  /// The bytes of every data communicator this member has had.
  traffic_counters traffic() const {
    traffic_counters t = retired_;
    if (data_) add(t, data_->traffic());
    return t;
  }
  /// The membership communicator (comm::gloo).
  const gloo& membership() const { return membership_; }
  /// The current generation's data communicator (null while joining, after
  /// leaving, or when making it failed).
  data_communicator* data() { return data_ ? &*data_ : nullptr; }

  // ------------------------------------------------ elastic_communicator
  ///@{
  /// elastic_communicator, through the membership (comm::gloo): whether the group may change,
  /// its generation, and whether this worker still waits to join.
  bool elastic() const { return membership_.elastic(); }
  std::uint64_t generation() const { return membership_.generation(); }
  bool joining() const { return membership_.joining(); }
  ///@}
  /// Joins the group (comm::gloo::join), then makes this generation's data communicator.
  void join() {
    membership_.join();
    regroup();
  }
  /// The membership check (comm::gloo::at_boundary); when the group changed, the old data
  /// communicator is retired and, unless this worker left, the new generation's is made. True
  /// when the group changed.
  bool at_boundary(bool leave, boundary_kind kind) {
    const bool changed = membership_.at_boundary(leave, kind);
    if (!changed) return false;
    if (leave) {
      left_ = true;
      retire("this worker left the group");
    } else {
      regroup();
    }
    return true;
  }
  /// After a failure: retires the data communicator (without waiting for peers), re-forms the
  /// group through the membership and makes the new generation's data communicator.
  void recover() {
    retire("a collective failed; the group re-forms");
    try {
      membership_.recover();
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw;
    }
    regroup();
  }

  // ----------------------------------------------------- collectives
  ///@{
  /// The collectives, run by the current generation's data communicator (state_error before
  /// joining or after leaving, comm_error when making it failed).
  void all_reduce(device_view<float> buf, reduce_op op) { current("all_reduce").all_reduce(buf, op); }
  void broadcast(device_view<float> buf, int root) { current("broadcast").broadcast(buf, root); }
  void broadcast(device_view<std::byte> buf, int root) { current("broadcast").broadcast(buf, root); }
  void all_to_all(device_view<const std::byte> send, device_view<std::byte> recv) {
    current("all_to_all").all_to_all(send, recv);
  }
  void all_gather(device_view<const std::byte> send, device_view<std::byte> recv) {
    current("all_gather").all_gather(send, recv);
  }
  request iall_reduce(device_view<float> buf, reduce_op op) { return current("all_reduce").iall_reduce(buf, op); }
  request iall_to_all(device_view<const std::byte> send, device_view<std::byte> recv) {
    return current("all_to_all").iall_to_all(send, recv);
  }
  request iall_gather(device_view<const std::byte> send, device_view<std::byte> recv) {
    return current("all_gather").iall_gather(send, recv);
  }
  ///@}

 private:
  data_communicator& current(const char* op) {
    using diloco::detail::raise;
    if (data_) return *data_;
    if (left_) raise<state_error>("comm::regrouped ", op, ": this worker has left the group");
    if (membership_.joining()) raise<state_error>("comm::regrouped ", op, ": this worker has not joined the group yet");
    raise<comm_error>("comm::regrouped<", Factory::name, "> ", op, " on rank ", rank(), ": generation ", generation(),
                      " has no data communicator (", failure_.empty() ? "the group failed to re-form" : failure_, ")");
  }

  static void add(traffic_counters& to, const traffic_counters& from) {
    to.bytes_sent += from.bytes_sent;
    to.bytes_received += from.bytes_received;
  }

  data_group group() const {
    return {membership_.generation(), membership_.rank(), membership_.size(), membership_.member_id(),
            membership_.settings().timeout};
  }

  /// Drops the data communicator without waiting for its peers (one may be
  /// dead), keeping its traffic in the totals.
  void retire(const std::string& reason) noexcept {
    if (!data_) return;
    add(retired_, data_->traffic());
    if constexpr (requires { data_->abort(reason); }) data_->abort(reason);
    data_.reset();
  }

  /// The data communicator of the current generation. A member that does
  /// not come (a death while the group re-formed) makes it fail with
  /// comm_error: the survivors form the next generation and try again. Two
  /// failures in a row with nobody dropped in between are not a missing
  /// peer: the last one is raised.
  void regroup() {
    using diloco::detail::raise;
    retire("the group re-formed");
    int failed_size = 0;
    for (;;) {
      const data_group g = group();
      if (auto made = make(g)) {
        data_.emplace(std::move(*made));
        failure_.clear();
        return;
      }
      if (!membership_.elastic())
        raise<comm_error>("comm::regrouped<", Factory::name, ">: making the data communicator failed and the "
                          "membership is not elastic: ", failure_);
      if (g.size == failed_size)
        raise<comm_error>("comm::regrouped<", Factory::name, ">: making the data communicator failed in two "
                          "generations in a row with all ", g.size, " members alive (last, generation ",
                          g.generation, "): ", failure_);
      failed_size = g.size;
      membership_.recover();
    }
  }

  /// This member's data communicator for generation g, or nothing (and
  /// failure_ says why) when a member was missing.
  std::optional<data_communicator> make(const data_group& g) {
    std::vector<char> record;
    try {
      record = detail_regroup::group_id_record(store_.store(), g, Factory::name, [&] { return factory_.make_id(); });
    } catch (const comm_error& e) {
      failure_ = e.what();
      return std::nullopt;
    }
    const std::vector<char> id = detail_regroup::decode_group_id(record, g, Factory::name);
    try {
      return factory_.create(std::span<const char>(id), g);
    } catch (const comm_error& e) {
      failure_ = e.what();
      return std::nullopt;
    }
  }

  Factory factory_;
  gloo membership_;
  detail_gloo::rendezvous_store store_;
  std::optional<data_communicator> data_;
  traffic_counters retired_{};
  std::string failure_;  ///< why the last data communicator could not be made
  bool left_ = false;
};

}  // namespace diloco::comm
