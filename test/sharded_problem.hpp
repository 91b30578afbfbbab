// SPDX-License-Identifier: Apache-2.0
#pragma once

// The sharded-groups problem test_sharded and test_sharded_mpi share: a
// 2 x 2 mesh whose ranks each hold whole tensors of mesh_problem's model
// (position 0: tensor 0, position 1: tensors 1 and 2), trained FSDP-style:
// each step the group gathers its shards into the whole model over intra,
// and every gradient element is mesh_problem's pull towards its group's
// target plus 0.05 x the mean of all weights, so it needs the whole model.
// The reference: flat DiLoCo with R workers on comm::threads over the whole
// model and the same gradients.

#include <algorithm>
#include <cstddef>
#include <diloco/diloco.hpp>
#include <diloco/sharded.hpp>
#include <span>
#include <vector>

#include "mesh_problem.hpp"

namespace sharded_problem {

using namespace mesh_problem;

constexpr int R = 2, G = 2;
inline const std::vector<std::vector<std::size_t>> shard_tensors = {{0}, {1, 2}};

// 0.05 x the mean of the whole model's weights, summed tensor by tensor in
// double: the part of every gradient element that needs the whole model.
inline float coupling(const std::vector<std::vector<float>>& whole) {
  double sum = 0.0;
  std::size_t n = 0;
  for (const auto& t : whole)
    for (const float x : t) sum += x, ++n;
  return 0.05f * static_cast<float>(sum / static_cast<double>(n));
}

// The gradients of `mine` (the tensors `ks` of the model) at step s of group r.
inline std::vector<std::vector<float>> gradients(int r, int s, const std::vector<std::size_t>& ks,
                                          const std::vector<std::vector<float>>& mine, float c) {
  std::vector<std::vector<float>> g(mine.size());
  for (std::size_t j = 0; j < mine.size(); ++j) {
    g[j].resize(mine[j].size());
    for (std::size_t i = 0; i < mine[j].size(); ++i) g[j][i] = grad_of(r, s, ks[j], i, mine[j][i]) + c;
  }
  return g;
}

// The whole model from the group's shards: an all_gather over intra of
// each position's tensors, concatenated and padded to the largest shard.
template <class Comm>
std::vector<std::vector<float>> gather_whole(dc::mesh<Comm>& m, const std::vector<std::vector<float>>& mine) {
  std::size_t largest = 0;
  for (const auto& ks : shard_tensors) {
    std::size_t n = 0;
    for (std::size_t k : ks) n += sizes[k];
    largest = std::max(largest, n);
  }
  std::vector<float> packed(largest, 0.0f), all(largest * static_cast<std::size_t>(G));
  std::size_t off = 0;
  for (const auto& t : mine) std::copy(t.begin(), t.end(), packed.begin() + static_cast<std::ptrdiff_t>(off)), off += t.size();
  m.intra().all_gather(std::as_bytes(std::span<const float>(packed)), std::as_writable_bytes(std::span<float>(all)));
  std::vector<std::vector<float>> whole(sizes.size());
  for (int g = 0; g < G; ++g) {
    std::size_t at = static_cast<std::size_t>(g) * largest;
    for (std::size_t k : shard_tensors[static_cast<std::size_t>(g)]) {
      whole[k].assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + sizes[k]));
      at += sizes[k];
    }
  }
  return whole;
}

inline std::vector<std::vector<float>> initial_shard(int position) {
  const auto all = initial_params();
  std::vector<std::vector<float>> mine;
  for (std::size_t k : shard_tensors[static_cast<std::size_t>(position)]) mine.push_back(all[k]);
  return mine;
}

template <class A>
std::vector<std::vector<float>> global_tensors(const A& a, const std::vector<std::vector<float>>& like) {
  const auto g = a.global_parameters();
  std::vector<std::vector<float>> out;
  for (std::size_t j = 0; j < like.size(); ++j)
    out.emplace_back(g.data() + a.global_offset(j), g.data() + a.global_offset(j) + like[j].size());
  return out;
}

struct tensors_of {  // per worker (flat) or per world rank (mesh): tensor k's replica and theta_global
  std::vector<std::vector<std::vector<float>>> replica, global;
};

template <class C, class Sync>
tensors_of run_flat_coupled() {
  tensors_of out;
  out.replica.resize(R);
  out.global.resize(R);
  dc::comm::threads::world world(R);
  world.run([&](dc::comm::threads& comm) {
    auto p = initial_params();
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, C, dc::comm::threads, Sync> a(p, comm,
                                                                                    {.inner_steps = H, .inner = {.lr = 0.1f}});
    const std::vector<std::size_t> all_k = {0, 1, 2};
    for (int s = 0; s < steps; ++s) a.step(gradients(comm.rank(), s, all_k, p, coupling(p)));
    a.finish();
    const auto r = static_cast<std::size_t>(comm.rank());
    out.replica[r] = p;
    out.global[r] = global_tensors(a, p);
  });
  return out;
}

template <class C, class Sync, class Comm>
using sharded_sgd = dc::sharded<dc::inner::sgd, dc::outer::nesterov, C, Comm, Sync>;

// Steps [from, to) of the sharded run on this rank.
template <class S, class Comm>
void train_steps(S& a, dc::mesh<Comm>& m, std::vector<std::vector<float>>& mine, int from, int to) {
  const auto& ks = shard_tensors[static_cast<std::size_t>(m.position())];
  for (int s = from; s < to; ++s) a.step(gradients(m.group(), s, ks, mine, coupling(gather_whole(m, mine))));
}

}  // namespace sharded_problem
