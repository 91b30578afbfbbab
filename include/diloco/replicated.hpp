// SPDX-License-Identifier: Apache-2.0
#pragma once

// Replicated groups with sharded outer state (docs/concepts.md, "Groups of
// ranks"). A worker of DiLoCo is a group of G ranks (a mesh, comm/mesh.hpp)
// that keeps one replica, identical on its G ranks: the user averages the
// gradients inside the group (all_reduce_gradients over intra) before every
// inner step. Rank g of the group owns shard g of the flattened parameters:
// theta_global, the outer optimizer's state, the error-feedback residual
// (and, with the library's inner optimizer, the inner optimizer's state)
// exist for that shard only, 1/G of the model.
//
// The cut. The parameters are cut into G shards balanced within one codec
// block, and only at codec block boundaries of the tensor being cut
// (compress::block_layout's rule over the tensors with the compressor's
// block size, computed without listing the blocks): a codec lays its blocks
// from each tensor's first element, so the shard's slices, starting at
// multiples of the block inside their tensor, give every codec exactly the
// blocks it sees unsharded. A shard is a list
// of pieces (tensor k, elements [start, start + size)).
//
// How. replicated<...> builds an ordinary diloco::algorithm over views of
// this rank's pieces of the user's tensors (slices, no copy) with the
// mesh's inter communicator: the shard's pseudo-gradient is reduced across
// the R groups with every compressor as in flat DiLoCo, and the outer step
// and the schedule's merge run on the shard, in the user's tensors. Then an
// all_gather over intra (fp32) copies every rank's shard of the replica into
// the others' replicas. With identical data per group, an R x G mesh gives
// the bits of flat DiLoCo with R workers: every pass is element-wise or per
// codec block, and the blocks are the same.
//
// When the gather runs: after construction (broadcast_initial writes the
// replica's shard), after every step with the library's inner optimizer
// (it steps the shard only: the gather is ZeRO-1's parameter all-gather),
// after finish() and outer_round(), and under inner::external after every
// step that wrote the shard's replica (algorithm::replica_writes() moved: a
// merge, the delayed schedules' restart at a phase end even when no round
// is applied, a refused round's reset, after which the error is rethrown).
//
// Checkpoints per shard, as sharded.hpp's: save_round(dir) writes this
// rank's shard of the state (theta_global, the outer and inner optimizers'
// state, the residual, the replica's shard) to
// `<dir>/position-<g>/rank-<r>/round-<n>.ckpt` and beside it the manifest
// `round-<n>.mesh` naming the mesh (R, G, group, position) and the cut (the
// model's tensor sizes, the codec block, every position's element count,
// this shard's pieces); load_latest_common(dir) resumes from the newest
// round every rank saved and gathers the replica: bitwise on the mesh that
// saved. Another G (or R, or cut) is refused with the same state_error on
// every rank, naming the saved mesh and this one: there is no re-sharding
// (it would need each new shard's state read from the old shards' files,
// which the per-position checkpoint format does not allow yet).
//
// Elastic meshes (comm::gloo split from an elastic world, mesh::elastic()):
// the gathers over intra raise the comm_error that says this group leaves
// (mesh::in_group), each position's world re-forms on its own, and under
// inner::external the replica is gathered at every phase end (gathered()).
// Checkpoints of an elastic mesh are a config_error.
//
// Not yet flat DiLoCo's: a non-finite pseudo-gradient refuses the round
// only for the shard that holds it. Its owners (one position, every group)
// raise numeric_error and reset that shard to theta_global; the other
// positions apply theirs and do not raise (measured: a NaN in tensor 2 of
// group 0 made world ranks 1 and 3 raise, ranks 0 and 2 went on). Agreeing
// needs the verdict reduced over intra as well as inter, inside the round,
// before anything is applied: an engine hook (a second verdict
// communicator), not something a wrapper can do after the call.
//
// Refused for now (static_assert): sync::streaming (its fragment plan is
// made from the tensor list, which a shard changes), low_rank (a factored
// compressor needs whole matrices), adaptive (it switches codecs, and block
// sizes, per round), inner::muon (a whole-tensor step), stochastic rounding
// is accepted but draws from the shard's element indices, so its bits differ
// from the flat run's. Inner clipping (max_grad_norm > 0) with the library's
// inner optimizer is a config_error: the norm would be the shard's.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/algorithm.hpp"
#include "diloco/comm/mesh.hpp"
#include "diloco/sharded.hpp"

namespace diloco {

namespace detail_replicated {

/// The codec block of a compressor (1: element-wise, any cut is exact).
template <class C>
constexpr std::size_t codec_block() {
  if constexpr (requires(const typename C::options& o) { decltype(C::make_codec(o))::block; })
    return decltype(C::make_codec(std::declval<const typename C::options&>()))::block;
  else
    return 1;
}

/// Whether a compressor sees the same bits over shards cut at codec_block():
/// lossless ones (element-wise means) and block codecs.
template <class C>
constexpr bool shardable() {
  if constexpr (C::lossless)
    return true;
  else
    return requires(const typename C::options& o) { decltype(C::make_codec(o))::block; };
}

}  // namespace detail_replicated

/// One piece of a shard: elements [start, start + size) of parameter tensor k.
struct shard_piece {
  std::size_t tensor = 0;  ///< index in the parameter list
  std::size_t start = 0;   ///< first element within the tensor
  std::size_t size = 0;    ///< elements
};

namespace detail_replicated {

/// The cut of tensors of these sizes into g shards, by
/// compress::block_layout's rule (a codec block of `block` elements belongs
/// to the shard its first element falls in under an even split of the
/// tensors' concatenation) without listing the blocks, which under
/// compress::none (block 1) would take 16 bytes a parameter: shard s begins
/// at the first block that starts at or after ceil(s x total / g). Each
/// shard's run of one tensor is one piece; an empty shard is a config_error.
inline std::vector<std::vector<shard_piece>> cut(const std::vector<std::size_t>& sizes, std::size_t block,
                                                 std::size_t g) {
  std::size_t total = 0, blocks = 0;
  for (const std::size_t n : sizes) {
    total += n;
    blocks += (n + block - 1) / block;
  }
  std::vector<std::size_t> bound(g + 1, total);
  bound[0] = 0;
  for (std::size_t s = 1; s < g; ++s) {
    const std::size_t target = (s * total + g - 1) / g;
    std::size_t offset = 0;
    for (const std::size_t n : sizes) {
      if (target < offset + n) {
        const std::size_t at = (target - offset + block - 1) / block * block;  // offset <= target here
        bound[s] = offset + std::min(at, n);
        break;
      }
      offset += n;
    }
  }
  std::vector<std::vector<shard_piece>> shards(g);
  for (std::size_t s = 0; s < g; ++s) {
    std::size_t offset = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t lo = std::max(bound[s], offset), hi = std::min(bound[s + 1], offset + sizes[k]);
      if (lo < hi) shards[s].push_back({k, lo - offset, hi - lo});
      offset += sizes[k];
    }
    if (shards[s].empty())
      diloco::detail::raise<config_error>("diloco::replicated: shard ", s, " of ", g, " is empty: the ", total,
                                          " parameters make ", blocks, " codec blocks of ", block,
                                          " elements, expected at least G = ", g);
  }
  return shards;
}

}  // namespace detail_replicated

/// DiLoCo across the groups of a mesh, each group one replicated worker
/// whose G ranks own one shard each of the outer state (see the top of
/// replicated.hpp). Construction, step(), outer_round() and finish() are
/// collective over the whole mesh. Host fp32 parameters.
template <inner_optimizer Inner, outer_optimizer Outer, compressor Compressor, any_communicator Comm,
          sync::sync_policy Sync = sync::blocking>
class replicated {
  static_assert(!std::same_as<Sync, sync::streaming>,
                "diloco::replicated: sync::streaming is not supported yet (its fragment plan is made from the "
                "tensor list, which sharding changes); use sync::blocking, one_step_delay, eager or delayed");
  static_assert(detail_replicated::shardable<Compressor>(),
                "diloco::replicated: the compressor must be lossless (compress::none) or a block codec (make_codec "
                "giving a codec with a fixed block: blockwise, cast, topk, chunk_topk, error_feedback of one); "
                "low_rank (whole matrices) and adaptive (per-round codec switches) are not supported with sharded "
                "outer state yet");
  static_assert(!tensor_optimizer_policy<Inner>,
                "diloco::replicated: a whole-tensor inner optimizer (inner::muon) cannot step a shard; use "
                "inner::external with your own optimizer on the full replica");

 public:
  /// The algorithm each rank runs over its shard, with the inter communicator.
  using algorithm_type = algorithm<Inner, Outer, Compressor, Comm, Sync>;
  /// The algorithm's options (the same fields as flat DiLoCo's).
  using options = typename algorithm_type::options;
  /// Elements per codec block: shards are cut at multiples of it inside a tensor.
  static constexpr std::size_t block = detail_replicated::codec_block<Compressor>();
  /// The default of set_gather_chunk: 2^20 elements of each shard per
  /// all_gather of the replica (a staging of 20 MiB at G = 4).
  static constexpr std::size_t default_gather_chunk = std::size_t{1} << 20;

  /// `params`: this rank's replica (writable fp32 host tensors, identical on
  /// the G ranks of its group); `m`: the mesh, which must outlive this.
  template <class Params>
  replicated(Params&& params, mesh<Comm>& m, options opts = {}) : mesh_(&m) {
    if constexpr (float_tensor<std::remove_cvref_t<Params>>)
      add_tensor(params);
    else
      for (auto&& t : params) add_tensor(t);
    if constexpr (!external_inner<Inner>) diloco::detail::refuse_shard_clipping(opts, "diloco::replicated");
    plan();
    opts_ = opts;
    algo_ = make_algorithm();
    gather_replica();  // broadcast_initial may have written this rank's shard
    // The manifest of this rank's checkpoints: the mesh and the cut.
    std::string tensors, cut, pieces;
    for (const auto& t : tensors_) tensors += diloco::detail::concat(tensors.empty() ? "" : " ", t.size());
    for (int g = 0; g < m.group_size(); ++g) cut += diloco::detail::concat(g ? " " : "", shard_elements(g));
    for (const shard_piece& p : own())
      pieces += diloco::detail::concat(pieces.empty() ? "" : " ", p.tensor, ':', p.start, '+', p.size);
    manifest_ = {{"kind", "replicated"},
                 {"groups", std::to_string(m.groups())},
                 {"group_size", std::to_string(m.group_size())},
                 {"group", std::to_string(m.group())},
                 {"position", std::to_string(m.position())},
                 {"model_elements", std::to_string(parameter_count())},
                 {"model_tensors", tensors},
                 {"codec_block", std::to_string(block)},
                 {"group_cut", cut},
                 {"shard_elements", std::to_string(shard_elements(m.position()))},
                 {"shard_pieces", pieces}};
  }

  replicated(const replicated&) = delete;
  replicated& operator=(const replicated&) = delete;

  /// The library's inner optimizer: one inner step on this rank's shard with
  /// the group's averaged gradients (full tensors, as the parameters), then
  /// what the schedule asks for; the replica is gathered over intra after
  /// it. Returns true when an outer step was applied.
  template <class Grads>
  bool step(Grads&& grads) {
    static_assert(!external_inner<Inner>, "diloco::replicated::step(grads): with inner::external call step()");
    std::vector<tensor_view<float>> views;
    std::vector<tensor_view<float>> full;
    if constexpr (float_tensor<std::remove_cvref_t<Grads>>)
      full.emplace_back(tensor_data(grads), tensor_size(grads));
    else
      for (auto&& g : grads) full.emplace_back(tensor_data(g), tensor_size(g));
    if (full.size() != tensors_.size())
      diloco::detail::raise<config_error>("diloco::replicated::step: got ", full.size(), " gradient tensors, expected ",
                                          tensors_.size(), " (one per parameter tensor)");
    for (std::size_t k = 0; k < full.size(); ++k)
      if (full[k].size() != tensors_[k].size())
        diloco::detail::raise<config_error>("diloco::replicated::step: gradient ", k, " has ", full[k].size(),
                                            " elements, parameter ", k, " has ", tensors_[k].size());
    for (const shard_piece& p : own()) views.emplace_back(full[p.tensor].data() + p.start, p.size);
    return gathered([&] { return algo_->step(views); }, true);
  }

  /// inner::external: your optimizer has stepped the full replica (with
  /// the group's averaged gradients); counts the step and runs what the
  /// schedule asks for. Returns true when an outer step was applied.
  bool step() {
    static_assert(external_inner<Inner>, "diloco::replicated::step(): pass the gradients, step(grads)");
    ++external_steps_;
    return gathered([&] { return algo_->step(); }, false);
  }

  /// An outer round now (sync::blocking), as algorithm::outer_round.
  void outer_round()
    requires std::same_as<Sync, sync::blocking>
  {
    gathered([&] { algo_->outer_round(); return true; }, true);
  }

  /// Completes what is in flight, as algorithm::finish.
  void finish() {
    gathered([&] { algo_->finish(); return true; }, true);
  }

  /// Copies the full theta_global into `targets` (fp32 host tensors with the
  /// parameters' sizes): each rank's shard gathered over intra. Collective
  /// over intra; call finish() first under an overlapping schedule.
  template <class Targets>
  void copy_global_to(Targets&& targets) {
    std::vector<tensor_view<float>> out;
    if constexpr (float_tensor<std::remove_cvref_t<Targets>>)
      out.emplace_back(tensor_data(targets), tensor_size(targets));
    else
      for (auto&& t : targets) out.emplace_back(tensor_data(t), tensor_size(t));
    if (out.size() != tensors_.size())
      diloco::detail::raise<config_error>("diloco::replicated::copy_global_to: got ", out.size(),
                                          " tensors, expected ", tensors_.size());
    for (std::size_t k = 0; k < out.size(); ++k)
      if (out[k].size() != tensors_[k].size())
        diloco::detail::raise<config_error>("diloco::replicated::copy_global_to: tensor ", k, " has ",
                                            out[k].size(), " elements, expected ", tensors_[k].size());
    const auto g = algo_->global_parameters();
    gather([&g](std::size_t o, std::size_t len, float* dst) { std::memcpy(dst, g.data() + o, len * sizeof(float)); },
           out, true);
  }

  /// Elements of each shard per all_gather of the replica over intra (at
  /// least 1; default_gather_chunk): the gather's staging is (G + 1) x this
  /// many floats, whatever the model's size. Every rank of the group must
  /// set the same value (their all_gathers pair chunk by chunk).
  void set_gather_chunk(std::size_t elements) {
    if (elements == 0)
      diloco::detail::raise<config_error>("diloco::replicated::set_gather_chunk: 0 elements, expected at least 1");
    gather_chunk_ = elements;
  }
  /// The elements of each shard per all_gather of the replica.
  std::size_t gather_chunk() const { return gather_chunk_; }

  /// Saves this rank's shard of the state (its algorithm's save_round:
  /// theta_global, outer and inner state, error-feedback residual and the
  /// replica's shard; collective over the whole mesh, every rank saves) as
  /// `<dir>/position-<g>/rank-<r>/round-<n>.ckpt`, and beside it its mesh
  /// manifest `round-<n>.mesh` (mesh_manifest(): R, G, this rank's group
  /// and position, the model's tensor sizes, the codec block, every
  /// position's element count and this shard's pieces); keeps the newest
  /// `keep` rounds. Returns the checkpoint's path. Under inner::external
  /// your optimizer's state is yours to save.
  std::string save_round(const std::string& dir, std::size_t keep = 2) {
    detail_sharded::refuse_elastic_checkpoints(*mesh_, "diloco::replicated", "save_round");
    return detail_sharded::save_shard_round(*algo_, position_dir(dir), keep, manifest_);
  }

  /// Resumes every shard from the newest round that every rank of the world
  /// saved with save_round (collective over the whole mesh), then gathers
  /// the replica over intra; returns the round. On the mesh that saved, the
  /// restore is bitwise. Restoring onto another mesh is refused, not
  /// re-sharded: a manifest naming another G, another R or another cut
  /// (other tensor sizes) is a state_error on every rank naming the saved
  /// mesh and this one, with nothing changed; so is no common round. A
  /// position whose file cannot be restored raises its error there and
  /// state_error at the other positions, which put back what they had (in a
  /// new instance of the shard's algorithm: references to
  /// shard_algorithm() do not survive that).
  std::uint64_t load_latest_common(const std::string& dir) {
    detail_sharded::refuse_elastic_checkpoints(*mesh_, "diloco::replicated", "load_latest_common");
    auto make = [this] { return make_algorithm(); };
    const std::uint64_t round =
        detail_sharded::load_shard_round(algo_, make, *mesh_, dir, position_dir(dir), manifest_, "diloco::replicated");
    gather_replica();
    return round;
  }

  /// The manifest save_round writes beside each checkpoint, as (key, value)
  /// pairs: kind, groups, group_size, group, position, model_elements,
  /// model_tensors, codec_block, group_cut, shard_elements, shard_pieces
  /// ("tensor:start+size" each).
  const detail_sharded::manifest& mesh_manifest() const { return manifest_; }

  ///@{
  /// The algorithm over this rank's shard (its stats, state, checkpoints).
  algorithm_type& shard_algorithm() { return *algo_; }
  const algorithm_type& shard_algorithm() const { return *algo_; }
  ///@}
  /// This rank's shard of theta_global, its pieces packed end to end.
  tensor_view<const float> global_parameters() const { return algo_->global_parameters(); }
  ///@{
  /// Shard g's pieces, in order (this rank's: shard(mesh.position())); its element count.
  const std::vector<shard_piece>& shard(int g) const { return shards_.at(static_cast<std::size_t>(g)); }
  std::size_t shard_elements(int g) const {
    std::size_t n = 0;
    for (const auto& p : shard(g)) n += p.size;
    return n;
  }
  ///@}
  /// The number of parameters (elements) of the whole replica.
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const auto& t : tensors_) n += t.size();
    return n;
  }

 private:
  template <class T>
  void add_tensor(T&& t) {
    using U = std::remove_cvref_t<T>;
    static_assert(std::same_as<tensor_value_t<U>, float> && std::same_as<tensor_space_t<U>, host_space>,
                  "diloco::replicated: the parameters must be writable fp32 host tensors");
    tensors_.emplace_back(tensor_data(t), tensor_size(t));
  }

  const std::vector<shard_piece>& own() const { return shards_[static_cast<std::size_t>(mesh_->position())]; }

  // The algorithm over views of this rank's pieces (the constructor's, and
  // load_latest_common's roll-back's).
  std::unique_ptr<algorithm_type> make_algorithm() {
    std::vector<tensor_view<float>> views;
    for (const shard_piece& p : own()) views.emplace_back(tensors_[p.tensor].data() + p.start, p.size);
    return std::make_unique<algorithm_type>(views, mesh_->inter(), opts_);
  }

  std::string position_dir(const std::string& dir) const {
    return (std::filesystem::path(dir) / diloco::detail::concat("position-", mesh_->position())).string();
  }

  // The G shards (detail_replicated::cut) and the largest one's elements.
  void plan() {
    std::vector<std::size_t> sizes;
    for (const auto& t : tensors_) sizes.push_back(t.size());
    shards_ = detail_replicated::cut(sizes, block, static_cast<std::size_t>(mesh_->group_size()));
    largest_ = 0;
    for (int s = 0; s < mesh_->group_size(); ++s) largest_ = std::max(largest_, shard_elements(s));
  }

  // Runs f (an algorithm call) and gathers the replica after it when
  // `always` or when the call wrote the replica (algorithm::replica_writes():
  // a merge, a reset of a refused round, the delayed schedules' restart at a
  // phase end); a refused round (numeric_error, alike on every rank) is
  // gathered, then rethrown. Every rank of a group decides alike: they take
  // the same steps under the same schedule. In an elastic mesh each
  // position's world re-forms on its own (a recovery may reset one
  // position's replica and not the others'), so the rule is the step count
  // instead, alike by construction: every phase end (where every schedule
  // here writes the replica), whether or not this position wrote it.
  template <class F>
  bool gathered(F&& f, bool always) {
    const auto before = algo_->replica_writes();
    bool applied = false;
    try {
      applied = f();
    } catch (const numeric_error&) {
      gather_replica();
      throw;
    }
    const bool wrote = mesh_->elastic() ? external_steps_ % opts_.inner_steps == 0 : algo_->replica_writes() != before;
    if (always || wrote) gather_replica();
    return applied;
  }

  // Every rank's shard of the replica into every other rank's replica.
  void gather_replica() {
    gather([this](std::size_t o, std::size_t len, float* dst) { copy_packed(own(), o, len, dst, tensors_, false); },
           tensors_, false);
  }

  // An all_gather over intra of every rank's shard (its pieces end to end,
  // padded to the largest shard), chunk by chunk, unpacked into `out` (own
  // shard too when `own_too`). pack(o, len, dst) writes elements [o, o +
  // len) of this rank's packed shard to dst. Every rank makes the same
  // chunks (from largest_), so the collectives pair.
  template <class Pack>
  void gather(Pack&& pack, std::vector<tensor_view<float>>& out, bool own_too) {
    const int gsize = mesh_->group_size();
    if (gsize == 1 && !own_too) return;
    const auto g = static_cast<std::size_t>(gsize);
    const std::size_t own_size = shard_elements(mesh_->position());
    const std::size_t chunk = std::min(largest_, gather_chunk_);
    std::vector<float> mine(chunk), all(chunk * g);
    for (std::size_t o = 0; o < largest_; o += chunk) {
      const std::size_t len = std::min(chunk, largest_ - o);
      const std::size_t have = o < own_size ? std::min(len, own_size - o) : 0;
      if (have > 0) pack(o, have, mine.data());
      std::fill(mine.begin() + static_cast<std::ptrdiff_t>(have), mine.begin() + static_cast<std::ptrdiff_t>(len), 0.0f);
      mesh_->in_group("diloco::replicated (the replica's gather)", [&] {
        mesh_->intra().all_gather(std::as_bytes(std::span<const float>(mine.data(), len)),
                                  std::as_writable_bytes(std::span<float>(all.data(), len * g)));
      });
      for (std::size_t s = 0; s < g; ++s) {
        if (static_cast<int>(s) == mesh_->position() && !own_too) continue;
        copy_packed(shards_[s], o, len, all.data() + len * s, out, true);
      }
    }
  }

  // Elements [o, o + len) of a shard's packed order (its pieces end to end;
  // clamped to the shard's size) between `packed` and the tensors: into the
  // tensors when `unpack`, else out of them.
  static void copy_packed(const std::vector<shard_piece>& pieces, std::size_t o, std::size_t len, float* packed,
                          std::vector<tensor_view<float>>& tensors, bool unpack) {
    std::size_t at = 0;  // the packed offset of the piece
    for (const shard_piece& p : pieces) {
      if (at >= o + len) break;
      const std::size_t lo = std::max(o, at), hi = std::min(o + len, at + p.size);
      if (lo < hi) {
        float* t = tensors[p.tensor].data() + p.start + (lo - at);
        float* q = packed + (lo - o);
        if (unpack)
          std::memcpy(t, q, (hi - lo) * sizeof(float));
        else
          std::memcpy(q, t, (hi - lo) * sizeof(float));
      }
      at += p.size;
    }
  }

  mesh<Comm>* mesh_;
  std::vector<tensor_view<float>> tensors_;         ///< the user's replica
  std::vector<std::vector<shard_piece>> shards_;    ///< G shards
  std::size_t largest_ = 0;                         ///< elements of the largest shard
  std::size_t gather_chunk_ = default_gather_chunk;  ///< set_gather_chunk
  options opts_;                                    ///< the algorithm's (for a roll-back's new instance)
  std::uint64_t external_steps_ = 0;                ///< step() calls under inner::external
  std::unique_ptr<algorithm_type> algo_;
  detail_sharded::manifest manifest_;               ///< written beside each checkpoint
};

}  // namespace diloco
