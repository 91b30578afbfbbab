// SPDX-License-Identifier: Apache-2.0
#pragma once

// A two-level mesh over a communicator: a world of W = R x G ranks is R
// replica groups of G ranks. Rank w sits in group r = floor(w / G) at
// position g = w mod G, unless the caller names both. The mesh splits the
// world into two communicators of the same type:
//
//   intra: the G ranks of this rank's group (rank g there), the fast link;
//   inter: the R ranks at this rank's position, one per group (rank r there),
//          the slow link DiLoCo's exchange runs over.
//
// The check comes first and is collective over the world: every rank
// publishes (G, r, g) with one all_gather and every rank judges the same
// table, so a bad mesh (G < 1, W not divisible by G, ranks disagreeing on G,
// a group or position out of range or taken twice) is the same config_error
// on every rank, naming what was wrong and what was expected, and no split
// is attempted.
//
// How a communicator splits is a function found by argument-dependent
// lookup or an overload here: split_communicator(parent, color, key)
// returns std::unique_ptr<Comm>, collective over the parent, as
// MPI_Comm_split (same color: one new communicator, ranked by key).
// comm::threads splits here (threads::split); comm::mpi in comm/mesh_mpi.hpp
// (MPI_Comm_split: an optional component). A communicator whose parts
// differ by role provides split_communicator(parent, color, key, part)
// instead, with part mesh_part::intra or mesh_part::inter: comm::gloo
// (comm/mesh_gloo.hpp), whose elastic world splits into a fixed group and
// an elastic world per position.
//
// Elastic meshes (comm::gloo with options.elastic): a group that loses a
// rank leaves as a whole. Its survivors' next collective over intra fails
// (all_reduce_gradients, replicated's gather of the replica, or sharded's
// check before a round) and raises comm_error naming the group
// (mesh::in_group); their processes end, and every position's
// inter world re-forms without the group (elastic membership, per
// position), so the other groups go on. See docs/concepts.md, "Groups of
// ranks".

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "diloco/comm/threads.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

/// The shape of a mesh as one rank sees it: the group size G, and
/// optionally this rank's group and position (both or neither; -1: from the
/// rank, r = rank / G and g = rank % G).
struct mesh_shape {
  int group_size = 1;  ///< G: ranks per replica group
  int group = -1;      ///< r: this rank's group, or -1
  int position = -1;   ///< g: this rank's position in its group, or -1

  /// The shape the launcher describes: G from DILOCO_GROUP_SIZE, else
  /// torchrun's LOCAL_WORLD_SIZE (one group per node); the group and
  /// position from DILOCO_GROUP_RANK and DILOCO_LOCAL_RANK, else torchrun's
  /// GROUP_RANK and LOCAL_RANK, else from the rank (-1). A missing group
  /// size, a malformed number, or a group without a position (or the other
  /// way round) is a config_error naming the variable.
  static mesh_shape from_env() {
    auto read = [](const char* name, const char* fallback, int least, int& out) -> const char* {
      const char* used = name;
      const char* v = std::getenv(name);
      if ((v == nullptr || *v == '\0') && fallback) {
        used = fallback;
        v = std::getenv(fallback);
      }
      if (v == nullptr || *v == '\0') return nullptr;
      char* end = nullptr;
      errno = 0;
      const long x = std::strtol(v, &end, 10);
      if (end == v || *end != '\0' || errno != 0 || x < least || x > std::numeric_limits<int>::max())
        diloco::detail::raise<config_error>("mesh_shape::from_env: ", used, "='", v, "' is not an integer >= ",
                                            least);
      out = static_cast<int>(x);
      return used;
    };
    mesh_shape s;
    if (!read("DILOCO_GROUP_SIZE", "LOCAL_WORLD_SIZE", 1, s.group_size))
      diloco::detail::raise<config_error>("mesh_shape::from_env: neither DILOCO_GROUP_SIZE nor LOCAL_WORLD_SIZE is "
                                          "set; set DILOCO_GROUP_SIZE to the ranks per group (G)");
    const char* r = read("DILOCO_GROUP_RANK", "GROUP_RANK", 0, s.group);
    const char* g = read("DILOCO_LOCAL_RANK", "LOCAL_RANK", 0, s.position);
    if ((r == nullptr) != (g == nullptr))
      diloco::detail::raise<config_error>("mesh_shape::from_env: ", r ? r : g, " is set but ",
                                          r ? "DILOCO_LOCAL_RANK (or LOCAL_RANK)" : "DILOCO_GROUP_RANK (or GROUP_RANK)",
                                          " is not; set both, or neither to take them from the rank");
    return s;
  }
};

/// Which part of a mesh a split makes (split_communicator's fourth
/// argument, for the communicators whose parts differ by role).
enum class mesh_part : std::uint8_t {
  intra,  ///< the G ranks of a group
  inter,  ///< the R ranks at one position, one per group
};

namespace comm {

/// comm::threads splits with threads::split.
inline std::unique_ptr<threads> split_communicator(threads& parent, int color, int key) {
  return parent.split(color, key);
}

}  // namespace comm

namespace detail_mesh {

/// One rank's entry in the mesh table.
struct entry {
  std::int32_t group_size;
  std::int32_t group;
  std::int32_t position;
};

/// Judges the table every rank gathered: the empty string when it forms a
/// mesh, else what is wrong. The same table gives the same text everywhere.
inline std::string problem(const std::vector<entry>& t) {
  using diloco::detail::concat;
  const int w = static_cast<int>(t.size());
  const int gsize = t[0].group_size;
  for (int k = 0; k < w; ++k)
    if (t[static_cast<std::size_t>(k)].group_size != gsize)
      return concat("the ranks disagree on the group size G: rank 0 passed ", gsize, ", rank ", k, " passed ",
                    t[static_cast<std::size_t>(k)].group_size, " (every rank must pass the same G)");
  if (gsize < 1) return concat("the group size G must be >= 1, got ", gsize);
  if (w % gsize != 0)
    return concat("the world has ", w, " ranks, which is not a multiple of the group size G = ", gsize,
                  " (W = R x G: expected a world of ", (w / gsize + 1) * gsize, " or ", (w / gsize) * gsize,
                  " ranks, or a G dividing ", w, ")");
  const int groups = w / gsize;
  std::vector<int> owner(static_cast<std::size_t>(w), -1);
  for (int k = 0; k < w; ++k) {
    const auto& e = t[static_cast<std::size_t>(k)];
    if ((e.group < 0) != (e.position < 0))
      return concat("rank ", k, " named its group (", e.group, ") or its position (", e.position,
                    ") but not both (pass both, or -1 for both to take them from the rank)");
    const int r = e.group < 0 ? k / gsize : e.group;
    const int g = e.position < 0 ? k % gsize : e.position;
    if (r >= groups)
      return concat("rank ", k, " is in group ", r, ", expected a group in [0, ", groups, ") (W = ", w,
                    ", G = ", gsize, ")");
    if (g >= gsize) return concat("rank ", k, " is at position ", g, ", expected a position in [0, ", gsize, ")");
    int& o = owner[static_cast<std::size_t>(r * gsize + g)];
    if (o >= 0) return concat("ranks ", o, " and ", k, " both claim group ", r, " position ", g);
    o = k;
  }
  return {};
}

}  // namespace detail_mesh

/// A world of W = R x G ranks as R replica groups of G ranks (see the top
/// of comm/mesh.hpp). Collective to construct over `world` (every rank, the
/// same G); it owns the two communicators it splits off. `world` may go on
/// being used for other things, and must outlive the mesh's communicators
/// only as far as Comm says (comm::threads: no; comm::mpi: no, the split
/// communicators are independent MPI communicators).
template <class Comm>
class mesh {
 public:
  /// Splits `world` into groups of `shape.group_size` ranks.
  mesh(Comm& world, mesh_shape shape) {
    const int w = world.size();
    const detail_mesh::entry mine{shape.group_size, shape.group, shape.position};
    std::vector<detail_mesh::entry> table(static_cast<std::size_t>(w));
    world.all_gather(std::as_bytes(std::span<const detail_mesh::entry>(&mine, 1)),
                     std::as_writable_bytes(std::span<detail_mesh::entry>(table)));
    if (const std::string p = detail_mesh::problem(table); !p.empty())
      diloco::detail::raise<config_error>("mesh (rank ", world.rank(), " of ", w, "): ", p);
    world_size_ = w;
    group_size_ = shape.group_size;
    group_ = shape.group < 0 ? world.rank() / group_size_ : shape.group;
    position_ = shape.position < 0 ? world.rank() % group_size_ : shape.position;
    intra_ = split(world, group_, position_, mesh_part::intra);
    inter_ = split(world, position_, group_, mesh_part::inter);
    if constexpr (elastic_communicator<Comm>) elastic_ = inter_->elastic();
  }

  mesh(const mesh&) = delete;
  mesh& operator=(const mesh&) = delete;
  ///@{
  /// Movable (the communicators live behind pointers); not copyable.
  mesh(mesh&&) noexcept = default;
  mesh& operator=(mesh&&) noexcept = default;
  ///@}

  ///@{
  /// W, G and R = W / G (as constructed: in an elastic mesh, the groups
  /// still in the run are inter().size()); this rank's group r and
  /// position g.
  int world_size() const { return world_size_; }
  int group_size() const { return group_size_; }
  int groups() const { return world_size_ / group_size_; }
  int group() const { return group_; }
  int position() const { return position_; }
  ///@}
  ///@{
  /// The G ranks of this group (rank position() there), and the R ranks at
  /// this position, one per group (rank group() there).
  Comm& intra() { return *intra_; }
  Comm& inter() { return *inter_; }
  ///@}
  /// Whether the inter worlds are elastic (comm::gloo split from an
  /// elastic world): a group that loses a rank leaves as a whole.
  bool elastic() const { return elastic_; }

  /// Runs `f`, a collective over intra named `what`. In an elastic mesh a
  /// comm_error from it (a rank of this group died or stalled) becomes the
  /// comm_error that says this group leaves the run; in a fixed mesh it
  /// propagates unchanged.
  template <class F>
  decltype(auto) in_group(const char* what, F&& f) {
    if (!elastic_) return f();
    try {
      return f();
    } catch (const comm_error& e) {
      diloco::detail::raise<comm_error>(
          what, ": group ", group_, " lost a rank (its collective over intra failed: ", e.what(),
          "); the group leaves the run as a whole: end this process (or destroy the trainer and the mesh), and "
          "the other groups go on without it");
    }
  }

 private:
  // split_communicator(parent, color, key, part) where Comm has it, else
  // the three-argument form.
  static std::unique_ptr<Comm> split(Comm& world, int color, int key, mesh_part part) {
    using comm::split_communicator;
    if constexpr (requires { split_communicator(world, color, key, part); })
      return split_communicator(world, color, key, part);
    else
      return split_communicator(world, color, key);
  }

  bool elastic_ = false;
  int world_size_ = 0;
  int group_size_ = 1;
  int group_ = 0;
  int position_ = 0;
  std::unique_ptr<Comm> intra_;
  std::unique_ptr<Comm> inter_;
};

namespace detail {

/// Refuses inner clipping (options.inner.max_grad_norm > 0) for a trainer
/// that runs the library's inner optimizer on a shard (replicated,
/// sharded): the norm would be the shard's, not the model's; `who` names
/// the trainer in the config_error.
template <class Options>
void refuse_shard_clipping(const Options& opts, const char* who) {
  if constexpr (requires { opts.inner.max_grad_norm; })
    if (opts.inner.max_grad_norm > 0.0f)
      raise<config_error>(who, ": inner max_grad_norm = ", opts.inner.max_grad_norm,
                          " (clipping) is not supported with the library's inner optimizer: it would clip by the "
                          "shard's norm; expected 0, or clip the whole model's gradients yourself under "
                          "inner::external");
}

}  // namespace detail

/// The group's data parallelism: averages this rank's fp32 gradients over
/// the mesh's group (an all_reduce mean over intra), in place, tensor by
/// tensor, so that every replica of the group takes the same inner step.
/// Collective over intra. `grads`: a range of writable fp32 host tensors
/// (std::vector<float>, spans, tensor_views), or one.
template <class Comm, class Grads>
void all_reduce_gradients(mesh<Comm>& m, Grads&& grads) {
  if (m.group_size() == 1) return;
  auto reduce_one = [&](auto&& t) {
    static_assert(std::same_as<tensor_value_t<std::remove_cvref_t<decltype(t)>>, float> &&
                      std::same_as<tensor_space_t<std::remove_cvref_t<decltype(t)>>, host_space>,
                  "diloco::all_reduce_gradients: the gradients must be writable fp32 host tensors");
    m.in_group("diloco::all_reduce_gradients",
               [&] { m.intra().all_reduce(std::span<float>(tensor_data(t), tensor_size(t)), reduce_op::mean); });
  };
  if constexpr (float_tensor<std::remove_cvref_t<Grads>>)
    reduce_one(grads);
  else
    for (auto&& t : grads) reduce_one(t);
}

}  // namespace diloco
