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
// (key, parent rank) order, as MPI_Comm_split ranks. Elastic worlds are
// refused (a part would not follow the parent's re-forming).

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

/// comm::gloo splits into new worlds under prefixed keys of the parent's
/// store (see the top of comm/mesh_gloo.hpp). Collective over `parent`.
inline std::unique_ptr<gloo> split_communicator(gloo& parent, int color, int key) {
  if (parent.settings().elastic)
    diloco::detail::raise<config_error>("comm::gloo: a mesh needs a fixed world; this one is elastic "
                                        "(options.elastic), and its split groups would not follow its re-forming");
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
  return std::make_unique<gloo>(std::move(o));
}

}  // namespace diloco::comm
