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
//   ranks it) and beside it a manifest, `round-<n>.mesh`, naming the mesh
//   (R, G, this rank's group and position) and the cut (every position's
//   element count, this shard's tensor sizes, the model's size);
//   load_latest_common(dir) loads the newest round that every rank of the
//   world saved, so that no group resumes with its shards from different
//   rounds, and when a position cannot restore its file, the others put
//   their state back (into a new instance of the algorithm, since the round
//   they restored may hold a reduction in flight): every rank raises, none
//   changed. On the mesh that saved, the restore is bitwise. A manifest
//   naming another mesh or cut (another G, another R, other shards) is
//   refused before anything is loaded: the same state_error on every rank,
//   naming the saved mesh and this one. There is no re-sharding.
//   Checkpoints of an elastic mesh (mesh::elastic()) are a config_error.
// - Elastic meshes: before each step that ends a phase (and outer_round,
//   finish) the group checks over intra that it is whole (at_step), so a
//   group that lost a rank leaves as a whole before the round.
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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
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

/// A mesh manifest: what names the mesh and the cut a shard's checkpoint
/// belongs to, as (key, value) pairs in order. Written beside each
/// `round-<n>.ckpt` as `round-<n>.mesh` by sharded and replicated::save_round.
using manifest = std::vector<std::pair<std::string, std::string>>;

/// The first line of a manifest file.
inline constexpr std::string_view manifest_head = "diloco mesh manifest 1";

/// The manifest as its file holds it: the head line, then "key value" lines.
inline std::string manifest_text(const manifest& m) {
  std::string out(manifest_head);
  out += '\n';
  for (const auto& [k, v] : m) out += diloco::detail::concat(k, ' ', v, '\n');
  return out;
}

/// manifest_text's output parsed back; anything else is a format_error
/// naming `source` and the line.
inline manifest parse_manifest(const std::string& text, const std::string& source) {
  manifest out;
  std::size_t pos = text.find('\n');
  if (pos == std::string::npos || std::string_view(text).substr(0, pos) != manifest_head)
    diloco::detail::raise<format_error>("mesh manifest ", source, ": the first line is not '", manifest_head, "'");
  for (++pos; pos < text.size();) {
    const std::size_t end = text.find('\n', pos);
    if (end == std::string::npos)
      diloco::detail::raise<format_error>("mesh manifest ", source, ": the last line has no newline (truncated?)");
    const std::string line = text.substr(pos, end - pos);
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || space == 0)
      diloco::detail::raise<format_error>("mesh manifest ", source, ": line '", line, "' is not 'key value'");
    out.emplace_back(line.substr(0, space), line.substr(space + 1));
    pos = end + 1;
  }
  return out;
}

/// The value of `key` in `m`, or "(none)".
inline std::string manifest_field(const manifest& m, std::string_view key) {
  for (const auto& [k, v] : m)
    if (k == key) return v;
  return "(none)";
}

/// "R groups x G ranks" as a manifest names its mesh.
inline std::string mesh_name(const manifest& m) {
  return diloco::detail::concat(manifest_field(m, "groups"), " groups x ", manifest_field(m, "group_size"), " ranks");
}

/// The fields where `saved` and `here` differ ("key: saved A, here B; ..."),
/// or "" when none does.
inline std::string manifest_differences(const manifest& saved, const manifest& here) {
  std::string out;
  auto note = [&out](const std::string& k, const std::string& a, const std::string& b) {
    if (a != b) out += diloco::detail::concat(out.empty() ? "" : "; ", k, ": saved ", a, ", here ", b);
  };
  for (const auto& [k, v] : here) note(k, manifest_field(saved, k), v);
  for (const auto& [k, v] : saved)
    if (manifest_field(here, k) == "(none)") note(k, v, "(none)");
  return out;
}

/// Round n's manifest in a rank's checkpoint folder.
inline std::filesystem::path manifest_path(const std::filesystem::path& folder, std::uint64_t n) {
  return folder / diloco::detail::concat("round-", n, ".mesh");
}

/// The rounds of `folder` that have both their checkpoint and their
/// manifest (a save interrupted between the two does not count).
inline std::vector<std::uint64_t> manifested_rounds(const std::filesystem::path& folder) {
  std::vector<std::uint64_t> out;
  std::error_code ec;
  for (const std::uint64_t n : checkpoint::saved_rounds(folder))
    if (std::filesystem::exists(manifest_path(folder, n), ec)) out.push_back(n);
  return out;
}

/// Checkpoints of an elastic mesh are a config_error naming `who` and
/// `what` (sharded's and replicated's save_round and load_latest_common).
template <class Comm>
void refuse_elastic_checkpoints(const mesh<Comm>& m, const char* who, const char* what) {
  if (m.elastic())
    diloco::detail::raise<config_error>(who, "::", what,
                                        ": checkpoints of an elastic mesh are not supported (a group that left "
                                        "leaves its files behind, and the inter ranks renumber); use a fixed world "
                                        "for a mesh that saves");
}

/// Saves the shard's algorithm as algorithm::save_round under
/// `position_dir`, then its manifest beside the file (written as checkpoints
/// are: a temporary, fsync, rename), then removes the manifests whose
/// checkpoint save_round removed. Returns the checkpoint's path.
template <class Algo>
std::string save_shard_round(Algo& algo, const std::string& position_dir, std::size_t keep, const manifest& m) {
  const std::filesystem::path path = algo.save_round(position_dir, keep);
  const std::filesystem::path folder = path.parent_path();
  const std::string stem = path.stem().string();  // "round-<n>"
  const std::string text = manifest_text(m);
  checkpoint::write_file((folder / (stem + ".mesh")).string(),
                         std::as_bytes(std::span<const char>(text.data(), text.size())));
  // Listed first, removed after: a directory is not changed while it is read.
  std::vector<std::filesystem::path> orphans;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::filesystem::path f = entry.path();
    if (f.extension() != ".mesh" || !f.stem().string().starts_with("round-")) continue;
    std::filesystem::path ckpt = f;
    ckpt.replace_extension(".ckpt");
    std::error_code stat;
    if (!std::filesystem::exists(ckpt, stat) && !stat) orphans.push_back(f);
  }
  for (const auto& f : orphans) std::filesystem::remove(f, ec);  // one that stays is never read without its checkpoint
  return path.string();
}

/// What is wrong with round n's manifest in `folder` for a rank whose
/// manifest is `here` ("" when it matches).
inline std::string manifest_problem(const std::filesystem::path& folder, std::uint64_t n, const manifest& here) {
  const std::string source = manifest_path(folder, n).string();
  manifest saved;
  try {
    const std::vector<std::byte> bytes = checkpoint::read_file(source);
    saved = parse_manifest(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), source);
  } catch (const std::exception& e) {
    return std::string(diloco::detail::unprefixed(e.what()));
  }
  const std::string diff = manifest_differences(saved, here);
  if (diff.empty()) return {};
  return diloco::detail::concat("round ", n, " was saved by a mesh of ", mesh_name(saved), " (group ",
                                manifest_field(saved, "group"), ", position ", manifest_field(saved, "position"),
                                "): ", diff);
}

/// Every rank's text over the mesh, the same on every rank: each group's
/// positions (over intra) gathered over inter, as "group r: position g:
/// text" for the non-empty ones ("" when all are empty).
template <class Comm>
std::string mesh_failures(mesh<Comm>& m, const std::string& mine) {
  const std::string in_group = failures(gather_texts(m.intra(), mine), "position");
  return failures(gather_texts(m.inter(), in_group), "group");
}

/// load_latest_common of a shard's algorithm (`algo`, rebuilt by `make` for
/// a roll-back) on mesh `m`: see sharded::load_latest_common. `here`: this
/// rank's manifest now; `who`: the caller, for messages. Collective over
/// the whole mesh.
template <class Algo, class Comm, class Make>
std::uint64_t load_shard_round(std::unique_ptr<Algo>& algo, Make& make, mesh<Comm>& m, const std::string& dir,
                               const std::string& position_dir, const manifest& here, const char* who) {
  const std::filesystem::path folder =
      std::filesystem::path(position_dir) / diloco::detail::concat("rank-", m.group());
  const std::vector<std::uint64_t> saved = manifested_rounds(folder);
  const std::string mine = checkpoint::detail::rounds_text(saved);
  // The rounds every rank of this group has, then every group.
  const std::string group_common =
      checkpoint::detail::rounds_text(checkpoint::detail::common_rounds(gather_texts(m.intra(), mine)));
  const std::vector<std::string> groups = gather_texts(m.inter(), group_common);
  const std::vector<std::uint64_t> common = checkpoint::detail::common_rounds(groups);
  // The mesh and the cut that saved: the common round's manifest, or when
  // there is none, this rank's newest (a mesh of another G leaves some
  // positions without files and others with files of that G).
  std::string problem;
  if (!common.empty())
    problem = manifest_problem(folder, common.back(), here);
  else if (!saved.empty())
    problem = manifest_problem(folder, *std::max_element(saved.begin(), saved.end()), here);
  if (const std::string refused = mesh_failures(m, problem); !refused.empty())
    diloco::detail::raise<state_error>(
        who, "::load_latest_common: the checkpoints under ", dir, " were saved by another mesh or cut (", refused,
        "); this mesh: ", m.groups(), " groups x ", m.group_size(),
        " ranks. Restoring onto a different group size G, number of groups or cut is refused (no re-sharding): "
        "resume on the mesh that saved them; every rank raises this, its state unchanged");
  if (common.empty()) {
    std::string each;
    for (std::size_t r = 0; r < groups.size(); ++r)
      each += diloco::detail::concat(r ? "; " : "", "group ", r, ": ", groups[r].empty() ? "none" : groups[r]);
    diloco::detail::raise<state_error>(who, "::load_latest_common: no round has a checkpoint on every rank under ",
                                       dir, " (rounds that all positions of each group saved, each with its "
                                       "round-<n>.ckpt and round-<n>.mesh: ",
                                       each, "); every rank raises this");
  }
  const std::uint64_t round = common.back();
  // What this rank has now, to put back if another position fails.
  const std::vector<std::byte> before = algo->save_bytes();
  std::string failed_here;
  std::exception_ptr failure;
  try {
    algo->load((folder / diloco::detail::concat("round-", round, ".ckpt")).string());
  } catch (const std::exception& e) {
    failure = std::current_exception();
    failed_here = diloco::detail::unprefixed(e.what());
  }
  const std::string failed = failures(gather_texts(m.intra(), failed_here), "position");
  if (failed.empty()) return round;
  if (failure) std::rethrow_exception(failure);
  // Every group's rank at this position restored it: they put back what
  // they had, together, in a new instance (the restored round may have a
  // reduction in flight, which a load refuses; `before` has none).
  algo.reset();
  algo = make();
  algo->load(std::span<const std::byte>(before));
  diloco::detail::raise<state_error>(who, "::load_latest_common: round ", round,
                                     " could not be restored at every position of the group (", failed,
                                     "); this rank's state is as it was before the call");
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
    inner_steps_ = std::max<std::uint64_t>(1, opts.inner_steps);
    std::string tensors;  // this shard's tensor sizes, for the manifest (before `shard` is held)
    if constexpr (diloco::detail::replica_element_tensor<std::remove_cvref_t<Params>>)
      tensors = std::to_string(tensor_size(shard));
    else
      for (auto&& t : shard) tensors += diloco::detail::concat(tensors.empty() ? "" : " ", tensor_size(t));
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
    // The manifest of this rank's checkpoints: the mesh, and the cut as
    // every position's element count and this shard's tensor sizes.
    const std::size_t elements = algo_->parameter_count();
    std::string cut;
    std::size_t model = 0;
    for (const std::string& n : detail_sharded::gather_texts(m.intra(), std::to_string(elements))) {
      cut += (cut.empty() ? "" : " ") + n;
      model += static_cast<std::size_t>(std::stoull(n));
    }
    manifest_ = {{"kind", "sharded"},
                 {"groups", std::to_string(m.groups())},
                 {"group_size", std::to_string(m.group_size())},
                 {"group", std::to_string(m.group())},
                 {"position", std::to_string(m.position())},
                 {"model_elements", std::to_string(model)},
                 {"group_cut", cut},
                 {"shard_elements", std::to_string(elements)},
                 {"shard_tensors", tensors}};
  }

  sharded(const sharded&) = delete;
  sharded& operator=(const sharded&) = delete;

  /// The inner step with the shard's gradients (the library's inner
  /// optimizer), or after your own optimizer's (inner::external): as
  /// algorithm::step. Every rank of the world steps in lockstep.
  template <class Grads>
  bool step(Grads&& grads) {
    at_step();
    return algo_->step(std::forward<Grads>(grads));
  }
  /// algorithm::step() under inner::external.
  bool step() {
    at_step();
    return algo_->step();
  }
  /// algorithm::outer_round (sync::blocking).
  void outer_round()
    requires std::same_as<Sync, sync::blocking>
  {
    check_group();
    algo_->outer_round();
  }
  /// algorithm::finish.
  void finish() {
    check_group();
    algo_->finish();
  }

  /// Saves this rank's shard (algorithm::save_round, collective over the
  /// whole mesh as every rank saves) under `<dir>/position-<g>`, as
  /// `<dir>/position-<g>/rank-<r>/round-<n>.ckpt`, and beside it its mesh
  /// manifest `round-<n>.mesh` (mesh_manifest(): R, G, this rank's group
  /// and position, every position's element count, this shard's tensor
  /// sizes, the model's size); returns the checkpoint's path.
  std::string save_round(const std::string& dir, std::size_t keep = 2) {
    detail_sharded::refuse_elastic_checkpoints(*mesh_, "diloco::sharded", "save_round");
    return detail_sharded::save_shard_round(*algo_, position_dir(dir), keep, manifest_);
  }

  /// Resumes every shard from the newest round that every rank of the world
  /// saved with save_round (its checkpoint and its manifest; collective
  /// over the whole mesh); returns it. Restoring is bitwise on the mesh
  /// that saved. A manifest naming another mesh or cut (another G or R, or
  /// other shard sizes: there is no re-sharding) is a state_error on every
  /// rank naming the saved mesh and this one, with nothing changed; so is
  /// no common round (naming each group's rounds). A position whose file
  /// cannot be restored raises its error there (as algorithm::load does)
  /// and state_error at the other positions, which put back the state they
  /// had (in a new instance of the shard's algorithm, built as the
  /// constructor built it: references to shard_algorithm() do not survive
  /// that): every rank's state is as it was.
  std::uint64_t load_latest_common(const std::string& dir) {
    detail_sharded::refuse_elastic_checkpoints(*mesh_, "diloco::sharded", "load_latest_common");
    return detail_sharded::load_shard_round(algo_, make_, *mesh_, dir, position_dir(dir), manifest_,
                                            "diloco::sharded");
  }

  /// The manifest save_round writes beside each checkpoint, as (key, value)
  /// pairs: kind, groups, group_size, group, position, model_elements,
  /// group_cut, shard_elements, shard_tensors.
  const detail_sharded::manifest& mesh_manifest() const { return manifest_; }

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

  // Elastic meshes: nothing of sharded runs over intra between rounds, and
  // the group's own framework may not either, so before every step that
  // ends a phase (and before outer_round and finish) the group checks that
  // it is whole with a one-float all_reduce over intra; a lost rank makes
  // it raise mesh::in_group's comm_error before this rank takes part in the
  // round, so the group leaves every position's world at the same round.
  void at_step() {
    ++steps_;
    if (steps_ % inner_steps_ == 0) check_group();
  }
  void check_group() {
    if (!mesh_->elastic()) return;
    mesh_->in_group("diloco::sharded (the group's check before a round)", [&] {
      float one = 1.0f;
      mesh_->intra().all_reduce(std::span<float>(&one, 1), reduce_op::sum);
    });
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
  std::uint64_t steps_ = 0;        ///< step() calls (at_step)
  std::uint64_t inner_steps_ = 1;  ///< H
  std::function<std::unique_ptr<algorithm_type>()> make_;
  std::unique_ptr<algorithm_type> algo_;
  detail_sharded::manifest manifest_;
};

}  // namespace diloco
