// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::mesh over comm::gloo (the optional Gloo component, target
// diloco::gloo): each part of a split is a new comm::gloo world that meets
// in the parent's rendezvous store under its own prefix,
//   <run id>/split-<nonce>/<color>,
// where the nonce is drawn by the parent's rank 0 and shared in the same
// all_gather that publishes every rank's (color, key): a store can serve
// several meshes, and successive splits of one world, without collisions.
// The parts keep the parent's options (timeout, hostname or interface,
// argument checks, local world size); the rank in a part is its place in
// (key, parent rank) order, as MPI_Comm_split ranks.
//
// An elastic world (options.elastic) splits only into a mesh's parts, at its
// first generation: the group's part (mesh_part::intra) is a fixed world of
// G ranks, each position's part (mesh_part::inter) an elastic world of the R
// groups' ranks there, with min_workers / G groups at least (rounded up)
// and no joiners. A group that loses a rank then leaves as a whole: its
// survivors' next collective over intra fails and they end, and each
// position's world re-forms without the group (comm/mesh.hpp). A group does
// not rejoin: a restarted rank would need a new group world, which is not
// built. Any other split of an elastic world is refused.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "diloco/comm/gloo.hpp"
#include "diloco/comm/mesh.hpp"

namespace diloco::comm {

namespace detail_mesh_gloo {

// The split, with the parts' options made by `adjust(options, members)`.
template <class Adjust>
std::unique_ptr<gloo> split(gloo& parent, int color, int key, Adjust&& adjust) {
  struct record {
    std::int32_t color;
    std::int32_t key;
    std::uint64_t nonce;
  };
  std::uint64_t nonce = 0;
  if (parent.rank() == 0) {
    std::random_device rd;
    nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd()) ^
            static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  const record mine{color, key, nonce};
  std::vector<record> all(static_cast<std::size_t>(parent.size()));
  parent.all_gather(std::as_bytes(std::span<const record>(&mine, 1)), std::as_writable_bytes(std::span<record>(all)));
  std::vector<int> members;
  for (int k = 0; k < parent.size(); ++k)
    if (all[static_cast<std::size_t>(k)].color == color) members.push_back(k);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[static_cast<std::size_t>(a)].key < all[static_cast<std::size_t>(b)].key;
  });
  gloo::options o = parent.settings();
  o.rank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank()) - members.begin());
  o.size = static_cast<int>(members.size());
  o.run_id = diloco::detail::concat(o.run_id, "/split-", all[0].nonce, "/", color);
  adjust(o, static_cast<int>(members.size()));
  return std::make_unique<gloo>(std::move(o));
}

}  // namespace detail_mesh_gloo

/// comm::gloo splits into new worlds under prefixed keys of the parent's
/// store (see the top of comm/mesh_gloo.hpp). Collective over `parent`,
/// which must be a fixed world.
inline std::unique_ptr<gloo> split_communicator(gloo& parent, int color, int key) {
  if (parent.settings().elastic)
    diloco::detail::raise<config_error>("comm::gloo: only a mesh's parts are split off an elastic world "
                                        "(options.elastic): split_communicator(parent, color, key, mesh_part)");
  return detail_mesh_gloo::split(parent, color, key, [](gloo::options&, int) {});
}

/// A mesh's part (mesh_part::intra: a group; inter: a position). From a
/// fixed world, the same split as above; from an elastic world at its first
/// generation, a fixed group world and an elastic world per position (see
/// the top of comm/mesh_gloo.hpp). Collective over `parent`.
inline std::unique_ptr<gloo> split_communicator(gloo& parent, int color, int key, mesh_part part) {
  const gloo::options& p = parent.settings();
  if (!p.elastic) return split_communicator(parent, color, key);
  if (parent.generation() != 0)
    diloco::detail::raise<config_error>("comm::gloo: an elastic world splits into a mesh at its first generation; "
                                        "this one has re-formed (generation ", parent.generation(),
                                        "): make the mesh right after the world");
  const int world = parent.size();
  return detail_mesh_gloo::split(parent, color, key, [part, world, least = p.min_workers](gloo::options& o, int n) {
    if (part == mesh_part::intra) {
      o.elastic = false;
      o.min_workers = 1;
    } else {
      const int g = world / n;  // the group size, as the mesh checked it
      o.min_workers = std::max(1, (least + g - 1) / g);
      o.admit_joiners = false;
    }
  });
}

}  // namespace diloco::comm
