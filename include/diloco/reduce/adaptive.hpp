// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "diloco/comm/detail/transport.hpp"
#include "diloco/compress/adaptive.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/state.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/reduce/select.hpp"
#include "diloco/reduce/verdict.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::reduce {

namespace detail_adaptive {
template <class Ladder, class Comm, class Space, class Exec>
struct rung_reducers;
template <class... C, class Comm, class Space, class Exec>
struct rung_reducers<std::tuple<C...>, Comm, Space, Exec> {
  using type = std::tuple<std::unique_ptr<lossy_reducer_t<C, Comm, Space, Exec>>...>;
};
}  // namespace detail_adaptive

/// The reducer of compress::adaptive<C...>: one reducer per rung (each its
/// compressor's own: compressed, gathered or factored), built at construction
/// so no round allocates, and one of them runs each round. Around it:
///   begin: notes the compute time since the fragment's previous round
///          (outside this reducer's calls) and starts the active rung;
///   poll/wait: the rung's; the first moment it is found complete ends the
///          round's link time;
///   wait:  on an accepted round, one all-reduce (sum) of {link seconds,
///          relative error, compute seconds} gives every rank the means, and
///          compress::adaptive_rule picks the next rung from them: the same
///          rung on every rank, since the inputs and the rule are the same;
///   apply: the rung's decode-apply; then, if the next rung differs, its
///          residual absorbs the one just committed (error feedback loses
///          nothing on a switch).
/// A refused or aborted round changes nothing (the choice is not updated).
template <class Compressor, class Comm, class Space, class Exec>
class adaptive {
  using ladder = typename Compressor::ladder;
  static constexpr std::size_t rungs = Compressor::rungs;
  using clock = std::chrono::steady_clock;

 public:
  /// How the rungs' collectives reach the communicator (direct, or staged through host memory).
  using transport = diloco::detail::wire_transport<Comm, Space, Exec>;

  /// One reducer per rung, built now so that no round allocates.
  adaptive(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
           std::uint32_t fragment, Exec& exec)
      : settings_(opts.rule), world_(world) {
    build(params, world, rank, opts, fragment, exec, std::make_index_sequence<rungs>{});
    memory_.reset(rungs, settings_);
    link_bytes_.assign(rungs, 0);
    if (world > 1)
      for (std::size_t j = 0; j < rungs; ++j) link_bytes_[j] = on(j, [](auto& r) { return r.link_bytes(); });
    agreed_ = buffer<float, Space>(3);
  }

  /// The largest slot of any rung (what the transport must be able to stage per rank).
  std::size_t slot_bytes() const {
    std::size_t most = 0;
    for (std::size_t j = 0; j < rungs; ++j) most = std::max(most, on(j, [](const auto& r) { return r.slot_bytes(); }));
    return most;
  }
  /// The active rung's residual: it holds all of it (a switch moves it).
  auto residual() const { return active_residual(); }

  /// Each rung's state under "<prefix>.rung<j>", then the rule's memory
  /// under "<prefix>.adaptive." (the same on every rank).
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    const std::string p(prefix);
    for (std::size_t j = 0; j < rungs; ++j) on(j, [&](auto& r) { r.visit_state(v, diloco::detail::concat(p, ".rung", j)); });
    const std::string a = p + ".adaptive.";
    v.scalar(a + "active", memory_.active);
    v.scalar(a + "reason", memory_.reason);
    v.scalar(a + "samples", memory_.samples);
    v.scalar(a + "compute_seconds", memory_.compute_seconds);
    for (std::size_t j = 0; j < rungs; ++j) {
      v.scalar(diloco::detail::concat(a, "error.", j), memory_.error[j]);
      v.scalar(diloco::detail::concat(a, "age.", j), memory_.age[j]);
    }
    for (std::size_t w = 0; w < memory_.seconds_per_byte.size(); ++w)
      v.scalar(diloco::detail::concat(a, "seconds_per_byte.", w), memory_.seconds_per_byte[w]);
  }

  /// A completed round's result for apply(), under `prefix` (checkpoints of
  /// a reduction in flight): the rung it used, then every rung's ready
  /// buffers (the same entries whichever rung ran; the rule's memory,
  /// already updated by wait(), is visited state).
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    std::uint64_t used = used_;
    v.scalar(prefix + "adaptive.used", used);
    if (used >= rungs)
      diloco::detail::raise<state_error>("adaptive: a ready round names rung ", used, " of ", rungs,
                                         ": a corrupt or foreign state was loaded");
    used_ = static_cast<std::size_t>(used);
    for (std::size_t j = 0; j < rungs; ++j)
      on(j, [&](auto& r) { r.visit_ready(v, diloco::detail::concat(prefix, "rung", j, ".")); });
  }

  /// Notes the compute time since the fragment's previous round and starts the active rung's
  /// reduction (reduce::staged::begin).
  void begin(Exec& exec, Comm& comm, transport& link, const float* ref, std::uint64_t round, bool overlap) {
    if (memory_.active >= rungs || memory_.reason > static_cast<std::uint64_t>(compress::adaptive_reason::error_bound) ||
        memory_.samples > (std::uint64_t{1} << 62))
      diloco::detail::raise<state_error>("adaptive: the rule's state names rung ", memory_.active, " of ", rungs,
                                         " (reason ", memory_.reason, "): a corrupt or foreign state was loaded");
    const auto t0 = clock::now();
    compute_ = begun_before_ ? seconds(last_begin_, t0) - blocked_ : 0.0;
    last_begin_ = t0;
    begun_before_ = true;
    blocked_ = 0.0;
    done_ = false;
    used_ = static_cast<std::size_t>(memory_.active);
    on(used_, [&](auto& r) { r.begin(exec, comm, link, ref, round, overlap); });
    note(t0);
  }

  /// Drops the active rung's reduction in flight (elastic recovery).
  void abort() {
    on(used_, [](auto& r) { r.abort(); });
    begun_before_ = false;  // the next interval is not one phase of compute
  }

  /// Lets the active rung's reduction progress; true once it has completed.
  bool poll(Exec& exec, Comm& comm, transport& link) {
    const auto t0 = clock::now();
    const bool complete = on(used_, [&](auto& r) { return r.poll(exec, comm, link); });
    note(t0);
    done_ = done_ || complete;
    return complete;
  }

  /// Completes the active rung's reduction; on an accepted round, agrees the round's measurements
  /// across ranks and picks the next rung (compress::adaptive_rule).
  verdict wait(Exec& exec, Comm& comm, transport& link) {
    const auto t0 = clock::now();
    verdict v = on(used_, [&](auto& r) { return r.wait(exec, comm, link); });
    note(t0);
    done_ = true;
    if (!v.accepted) return v;
    const auto t1 = clock::now();
    // This rank's numbers, then their means over the ranks.
    float mine[3] = {static_cast<float>(link_seconds_),
                     static_cast<float>(v.delta_norm > 0.0 ? v.error_norm / v.delta_norm : 0.0),
                     static_cast<float>(compute_)};
    if (world_ > 1) {
      exec.from_host(agreed_.data(), mine, 3);
      link.all_reduce(comm, exec, agreed_.data(), 3, reduce_op::sum);
      exec.to_host(mine, agreed_.data(), 3);
      for (float& x : mine) x /= static_cast<float>(world_);
    }
    const compress::adaptive_measurement m{mine[0], mine[1], mine[2]};
    compress::adaptive_rule(memory_, settings_, link_bytes_, used_, m);
    choice_.used = used_;
    choice_.next = static_cast<std::size_t>(memory_.active);
    choice_.next_name = Compressor::rung_names[choice_.next];
    choice_.reason = compress::to_string(memory_.why());
    choice_.link_seconds = m.link_seconds;
    choice_.relative_error = m.relative_error;
    choice_.budget_seconds = memory_.budget(settings_);
    choice_.predicted_seconds = memory_.mean_seconds_per_byte() * static_cast<double>(link_bytes_[choice_.next]);
    blocked_ += seconds(t1, clock::now());
    return v;
  }

  /// The active rung's decode-apply; then, if the next rung differs, its residual absorbs the one
  /// just committed.
  template <class Update, class Merge>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t stride, const Merge& merge) {
    on(used_, [&](auto& r) { r.apply(exec, update, global, state, stride, merge); });
    const auto next = static_cast<std::size_t>(memory_.active);
    if constexpr (Compressor::has_error_feedback) {
      if (next != used_) {
        const auto from = residual_of(used_), to = residual_of(next);
        if (from.second != to.second)
          diloco::detail::raise<state_error>("adaptive: rung ", used_, "'s residual has ", from.second,
                                             " elements, rung ", next, "'s ", to.second, "; expected the same");
        exec.for_each(from.second, kernels::absorb{from.first, to.first});
      }
    }
  }

  /// The last applied round and the next round's rung, for stats().
  const compression_choice& choice() const { return choice_; }
  /// The rung the next round uses.
  std::size_t active() const { return static_cast<std::size_t>(memory_.active); }
  /// Each rung's link bytes per round (reduce::staged::link_bytes), which the rule's prediction scales.
  std::span<const std::size_t> link_bytes() const { return link_bytes_; }

 private:
  template <std::size_t... I>
  void build(const parameter_set<float, Space>& params, int world, int rank, const typename Compressor::options& opts,
             std::uint32_t fragment, Exec& exec, std::index_sequence<I...>) {
    ((std::get<I>(rungs_) = std::make_unique<lossy_reducer_t<std::tuple_element_t<I, ladder>, Comm, Space, Exec>>(
          params, world, rank, std::get<I>(opts.codecs), fragment, exec)),
     ...);
  }

  /// f(rung j's reducer), for a j known only at run time.
  template <class F>
  decltype(auto) on(std::size_t j, F&& f) {
    return dispatch<0>(*this, j, f);
  }
  template <class F>
  decltype(auto) on(std::size_t j, F&& f) const {
    return dispatch<0>(*this, j, f);
  }
  template <std::size_t I, class Self, class F>
  static decltype(auto) dispatch(Self& self, std::size_t j, F& f) {
    if constexpr (I + 1 == rungs)
      return f(*std::get<I>(self.rungs_));
    else
      return j == I ? f(*std::get<I>(self.rungs_)) : dispatch<I + 1>(self, j, f);
  }

  auto active_residual() const {
    return on(static_cast<std::size_t>(memory_.active), [](const auto& r) { return r.residual(); });
  }

  /// Rung j's residual buffer, found by its visited name.
  std::pair<float*, std::size_t> residual_of(std::size_t j) {
    struct find final : state_visitor {
      std::pair<float*, std::size_t> out{nullptr, 0};
      void buffer(std::string_view name, float* data, std::size_t size, bool) override {
        if (name.ends_with(".residual")) out = {data, size};
      }
      void scalar(std::string_view, std::uint64_t&) override {}
    } f;
    on(j, [&](auto& r) { r.visit_state(f, "rung"); });
    return f.out;
  }

  /// A call of this reducer ran from t0 to now: it counts as blocked time,
  /// and ends the link time the first time the rung is complete.
  void note(clock::time_point t0) {
    const auto now = clock::now();
    blocked_ += seconds(t0, now);
    if (!done_) link_seconds_ = seconds(last_begin_, now);
  }
  static double seconds(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  typename detail_adaptive::rung_reducers<ladder, Comm, Space, Exec>::type rungs_;
  compress::adaptive_settings settings_;
  compress::adaptive_memory memory_;
  std::vector<std::size_t> link_bytes_;
  buffer<float, Space> agreed_;
  int world_;
  std::size_t used_ = 0;
  /// Timing of the round in flight.
  clock::time_point last_begin_{};
  bool begun_before_ = false;
  bool done_ = false;
  double blocked_ = 0.0;       ///< seconds inside this reducer's calls this round
  double compute_ = 0.0;       ///< seconds between the previous round's begin and this one's, outside it
  double link_seconds_ = 0.0;  ///< begin to the first call that found the rung complete
  compression_choice choice_;
};

}  // namespace diloco::reduce
