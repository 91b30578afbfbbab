// SPDX-License-Identifier: Apache-2.0
#pragma once

// Sharded groups (docs/concepts.md, "Groups of ranks"): a worker of DiLoCo
// is a group of G ranks (a mesh, comm/mesh.hpp) that holds one model cut
// into G shards, one per rank, as FSDP and tensor parallelism do. The
// group's own framework trains it (gathers the parameters for its forward
// pass, reduces the gradients to their shards inside the group); DiLoCo
// runs per shard across the groups: rank g of every group runs an ordinary
// diloco::algorithm over its shard's tensors with the mesh's inter
// communicator (the R ranks at position g). No traffic inside the group
// comes from here but the checks below.
//
// What this class adds to that algorithm:
// - At construction, the G ranks of each group agree on the policies and
//   every option that must agree (H, the outer, compressor and schedule
//   options, ...), as the R ranks at one position already do: a group
//   whose shards ran with different H would apply rounds to parts of one
//   model at different steps. A mismatch in any group is the same
//   config_error on every rank of the world (the verdict travels over intra,
//   then inter), naming the field, both values and the positions. The
//   algorithm's own agreement over inter follows (shard sizes, ...); a
//   failure there, which every rank of that position sees, reaches the
//   other positions over intra.
// - Checkpoints per shard: save_round(dir) writes
//   `<dir>/position-<g>/rank-<r>/round-<n>.ckpt` (r: the group, as inter
//   ranks it); load_latest_common(dir) loads the newest round that every
//   rank of the world saved, so that no group resumes with its shards from
//   different rounds, and when a position cannot restore its file, the
//   others put their state back (into a new instance of the algorithm,
//   since the round they restored may hold a reduction in flight): every
//   rank raises, none changed.
//
// Not flat DiLoCo's: the outer step, its verdict on non-finite values and
// the compressors run per shard. A non-finite pseudo-gradient refuses the
// round only at the position that holds it (every group's rank there raises
// numeric_error); inner clipping with the library's inner optimizer would
// use the shard's norm and is refused (clip the whole model's gradients
// yourself, under inner::external); compressors and whole-tensor optimizers
// see the shard's tensors as the model (cut on whole tensors for low_rank
// and inner::muon). With shards of whole tensors, block codecs and
// element-wise optimizers, the shards' theta_global are flat DiLoCo's bits
// over the whole model (test_mesh).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/algorithm.hpp"
#include "diloco/checkpoint/file.hpp"
#include "diloco/comm/mesh.hpp"
#include "diloco/compress/fingerprint.hpp"
#include "diloco/core/agreement.hpp"

namespace diloco {

namespace detail_sharded {

/// Every rank's text over `c`, in its rank order (core/agreement.hpp's
/// gather_texts over the communicator's all-gather of bytes).
template <class Comm>
std::vector<std::string> gather_texts(Comm& c, const std::string& text) {
  const auto n = static_cast<std::size_t>(c.size());
  return diloco::detail::gather_texts(text, n, [&c, n](const std::vector<std::byte>& mine) {
    std::vector<std::byte> all(mine.size() * n);
    c.all_gather(std::span<const std::byte>(mine), std::span<std::byte>(all));
    return all;
  });
}

/// The failures named in `verdicts` (empty: fine), as "what r: message; ...".
inline std::string failures(const std::vector<std::string>& verdicts, const char* what) {
  std::string out;
  for (std::size_t r = 0; r < verdicts.size(); ++r)
    if (!verdicts[r].empty()) out += diloco::detail::concat(out.empty() ? "" : "; ", what, " ", r, ": ", verdicts[r]);
  return out;
}

}  // namespace detail_sharded

/// DiLoCo over a sharded model: rank g of every group of the mesh runs
/// algorithm<Inner, Outer, Compressor, Comm, Sync> over its shard's tensors
/// with the mesh's inter communicator. The G ranks of each group agree on
/// the policies and options; checkpoints are per shard, resumed from a round
/// every rank holds. See the header's comment.
template <inner_optimizer Inner, outer_optimizer Outer, compressor Compressor, any_communicator Comm,
          sync::sync_policy Sync = sync::blocking>
class sharded {
 public:
  using algorithm_type = algorithm<Inner, Outer, Compressor, Comm, Sync>;  ///< the per-shard algorithm
  using options = typename algorithm_type::options;                        ///< its options, the same on every rank

  /// This rank's shard of the model (a tensor or a list of them, as
  /// algorithm takes them) on mesh `m`; collective over the whole mesh.
  /// Raises config_error on every rank when the group's ranks disagree on
  /// the policies or options, or inner clipping is asked of the library's
  /// inner optimizer; the algorithm's own errors (shard sizes differing
  /// between groups, ...) reach every rank as well.
  template <class Params>
  sharded(Params&& shard, mesh<Comm>& m, options opts = {}) : mesh_(&m) {
    if constexpr (!external_inner<Inner>) diloco::detail::refuse_shard_clipping(opts, "diloco::sharded");
    agree_in_group(opts);
    // How to build the shard's algorithm again (a roll-back of
    // load_latest_common): the same tensors, communicator and options.
    make_ = [held = hold(std::forward<Params>(shard)), &m, opts]() mutable {
      return std::make_unique<algorithm_type>(unwrap(held), m.inter(), opts);
    };
    std::string problem;
    try {
      algo_ = make_();
    } catch (const std::exception& e) {
      problem = diloco::detail::unprefixed(e.what());
      // The other positions of this group learn of it below; this rank
      // raises its own error.
      (void)detail_sharded::gather_texts(m.intra(), problem);
      throw;
    }
    const std::string failed = detail_sharded::failures(detail_sharded::gather_texts(m.intra(), problem), "position");
    if (!failed.empty())
      diloco::detail::raise<config_error>("diloco::sharded: the shard's algorithm could not be built at every position of "
                                          "the group (",
                                          failed, "); every rank raises this");
  }

  sharded(const sharded&) = delete;
  sharded& operator=(const sharded&) = delete;

  /// The inner step with the shard's gradients (the library's inner
  /// optimizer), or after your own optimizer's (inner::external): as
  /// algorithm::step. Every rank of the world steps in lockstep.
  template <class Grads>
  bool step(Grads&& grads) {
    return algo_->step(std::forward<Grads>(grads));
  }
  /// algorithm::step() under inner::external.
  bool step() { return algo_->step(); }
  /// algorithm::outer_round (sync::blocking).
  void outer_round()
    requires std::same_as<Sync, sync::blocking>
  {
    algo_->outer_round();
  }
  /// algorithm::finish.
  void finish() { algo_->finish(); }

  /// Saves this rank's shard (algorithm::save_round, collective over the
  /// whole mesh as every rank saves) under `<dir>/position-<g>`; returns the
  /// path written.
  std::string save_round(const std::string& dir, std::size_t keep = 2) {
    return algo_->save_round(position_dir(dir), keep);
  }

  /// Resumes every shard from the newest round that every rank of the world
  /// saved with save_round (collective over the whole mesh); returns it.
  /// No common round: state_error on every rank naming each group's
  /// rounds. A position whose file cannot be restored raises its error
  /// there (as algorithm::load does) and state_error at the other
  /// positions, which put back the state they had (in a new instance of
  /// the shard's algorithm, built as the constructor built it: references
  /// to shard_algorithm() do not survive that): every rank's state is as
  /// it was.
  std::uint64_t load_latest_common(const std::string& dir) {
    const std::filesystem::path folder =
        std::filesystem::path(position_dir(dir)) / diloco::detail::concat("rank-", mesh_->group());
    const std::string mine = checkpoint::detail::rounds_text(checkpoint::saved_rounds(folder));
    // The rounds every rank of this group has, then every group.
    const std::string group_common =
        checkpoint::detail::rounds_text(checkpoint::detail::common_rounds(detail_sharded::gather_texts(mesh_->intra(), mine)));
    const std::vector<std::string> groups = detail_sharded::gather_texts(mesh_->inter(), group_common);
    const std::vector<std::uint64_t> common = checkpoint::detail::common_rounds(groups);
    if (common.empty()) {
      std::string each;
      for (std::size_t r = 0; r < groups.size(); ++r)
        each += diloco::detail::concat(r ? "; " : "", "group ", r, ": ", groups[r].empty() ? "none" : groups[r]);
      diloco::detail::raise<state_error>("diloco::sharded::load_latest_common: no round has a checkpoint on every "
                                         "rank under ",
                                         dir, " (rounds that all positions of each group saved: ", each,
                                         "); every rank raises this");
    }
    const std::uint64_t round = common.back();
    // What this rank has now, to put back if another position fails.
    const std::vector<std::byte> before = algo_->save_bytes();
    std::string problem;
    std::exception_ptr failure;
    try {
      algo_->load((folder / diloco::detail::concat("round-", round, ".ckpt")).string());
    } catch (const std::exception& e) {
      failure = std::current_exception();
      problem = diloco::detail::unprefixed(e.what());
    }
    const std::string failed = detail_sharded::failures(detail_sharded::gather_texts(mesh_->intra(), problem), "position");
    if (failed.empty()) return round;
    if (failure) std::rethrow_exception(failure);
    // Every group's rank at this position restored it: they put back what
    // they had, together, in a new instance (the restored round may have a
    // reduction in flight, which a load refuses; `before` has none).
    algo_.reset();
    algo_ = make_();
    algo_->load(std::span<const std::byte>(before));
    diloco::detail::raise<state_error>("diloco::sharded::load_latest_common: round ", round,
                                       " could not be restored at every position of the group (", failed,
                                       "); this rank's state is as it was before the call");
  }

  ///@{
  /// The shard's algorithm (statistics, global_parameters, save, ...).
  algorithm_type& shard_algorithm() { return *algo_; }
  const algorithm_type& shard_algorithm() const { return *algo_; }
  ///@}
  /// The mesh it runs on.
  mesh<Comm>& mesh_of() { return *mesh_; }

 private:
  /// The shard's tensors as the constructor got them: a reference to the
  /// caller's (an lvalue), or the views themselves (an rvalue list of views).
  template <class P>
  static auto hold(P&& p) {
    if constexpr (std::is_lvalue_reference_v<P>)
      return std::ref(p);
    else
      return std::decay_t<P>(std::forward<P>(p));
  }
  /// What hold() kept, as the algorithm's constructor takes it.
  template <class H>
  static decltype(auto) unwrap(H& h) {
    if constexpr (requires { h.get(); typename H::type; })
      return h.get();
    else
      return (h);
  }

  std::string position_dir(const std::string& dir) const {
    return (std::filesystem::path(dir) / diloco::detail::concat("position-", mesh_->position())).string();
  }

  // The group's ranks compare their policies and must-agree options
  // (core/agreement.hpp, over intra); then each group's verdict goes to
  // every group (over inter), so every rank of the world raises the same.
  void agree_in_group(const options& opts) {
    std::vector<diloco::detail::agreement_record> records;
    records.push_back({'A', "policy.inner", Inner::name});
    records.push_back({'A', "policy.outer", Outer::name});
    records.push_back({'A', "policy.compressor", compress::fingerprint<Compressor>()});
    records.push_back({'A', "policy.sync", Sync::name});
    for (const option_field& f : option_fields(opts))
      if (f.agree == agreement::across_ranks) records.push_back({'A', "options." + f.name, f.value.to_string()});
    std::vector<std::vector<diloco::detail::agreement_record>> ranks;
    const std::vector<std::string> texts =
        detail_sharded::gather_texts(mesh_->intra(), diloco::detail::agreement_text(records));
    for (std::size_t r = 0; r < texts.size(); ++r)
      ranks.push_back(diloco::detail::parse_agreement_text(texts[r], static_cast<int>(r)));
    const auto outcome = diloco::detail::compare_agreement(ranks);
    const std::string verdict = outcome.mismatch ? *outcome.mismatch : std::string();
    const std::string failed = detail_sharded::failures(detail_sharded::gather_texts(mesh_->inter(), verdict), "group");
    if (!failed.empty())
      diloco::detail::raise<config_error>("diloco::sharded: the ranks of a group must run the same policies and "
                                          "options (rank r below is position r in its group): ",
                                          failed);
  }

  mesh<Comm>* mesh_;
  std::function<std::unique_ptr<algorithm_type>()> make_;
  std::unique_ptr<algorithm_type> algo_;
};

}  // namespace diloco
