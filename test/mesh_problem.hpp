// SPDX-License-Identifier: Apache-2.0
#pragma once

// The problem test_mesh, test_mesh_mpi and test_mesh_gloo share: three tensors (967
// elements; G = 2 cuts tensor 0 at 512 with codec blocks of 64), a gradient
// per group that pulls each weight towards a group-dependent target, and
// the flat reference: DiLoCo with R workers on comm::threads, inner::sgd.

#include <cmath>
#include <cstddef>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <vector>

namespace mesh_problem {

namespace dc = diloco;
namespace cp = diloco::compress;

inline const std::vector<std::size_t> sizes = {700, 77, 190};  // 967 elements; G = 2 cuts tensor 0 at 512

using int4_ef = cp::error_feedback<cp::blockwise<dc::int4, 64>>;

// Worker (group) r's gradient at step s: a pull of each weight towards a
// target that depends on the group, so the groups drift apart.
inline float grad_of(int r, int s, std::size_t k, std::size_t i, float w) {
  const float target = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(k) + static_cast<float>(r));
  return (w - target) + 0.01f * static_cast<float>((s * 7 + static_cast<int>(i)) % 5 - 2);
}

// Every tensor's gradient of group (or worker) r at step s into g, resized
// to the parameters p.
inline void gradients_into(std::vector<std::vector<float>>& g, int r, int s, const std::vector<std::vector<float>>& p) {
  g.resize(p.size());
  for (std::size_t k = 0; k < p.size(); ++k) {
    g[k].resize(p[k].size());
    for (std::size_t i = 0; i < p[k].size(); ++i) g[k][i] = grad_of(r, s, k, i, p[k][i]);
  }
}

inline std::vector<std::vector<float>> initial_params() {
  std::vector<std::vector<float>> p;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    p.emplace_back(sizes[k]);
    for (std::size_t i = 0; i < sizes[k]; ++i) p[k][i] = 0.5f * std::cos(0.11f * static_cast<float>(i + 31 * k));
  }
  return p;
}

inline std::vector<float> concat_all(const std::vector<std::vector<float>>& t) {
  std::vector<float> out;
  for (const auto& v : t) out.insert(out.end(), v.begin(), v.end());
  return out;
}

struct flat_result {
  std::vector<std::vector<float>> replica;  // per worker, concatenated
  std::vector<std::vector<float>> global;   // per worker, tensors concatenated
};

constexpr int steps = 14;  // 4 rounds and 2 steps: the replicas differ at the end
constexpr std::size_t H = 3;

// One rank of a mesh trains the problem: its group's gradients, averaged
// over intra (all_reduce_gradients), step replicated<inner::sgd,
// outer::nesterov, C, Comm, Sync> for `steps` steps, then finish();
// `inspect(a, replica, theta_global)` sees the trainer, its tensors and the
// whole theta_global (copy_global_to), each tensor concatenated; `setup(a)`
// runs before the first step.
struct no_setup {
  template <class A>
  void operator()(A&) const {}
};
template <class C, class Sync, class Comm, class Inspect, class Setup = no_setup>
void train_on_mesh(dc::mesh<Comm>& m, Inspect&& inspect, Setup&& setup = {}) {
  auto p = initial_params();
  dc::replicated<dc::inner::sgd, dc::outer::nesterov, C, Comm, Sync> a(p, m, {.inner_steps = H, .inner = {.lr = 0.1f}});
  setup(a);
  std::vector<std::vector<float>> g(p.size());
  for (int s = 0; s < steps; ++s) {
    gradients_into(g, m.group(), s, p);
    dc::all_reduce_gradients(m, g);
    a.step(g);
  }
  a.finish();
  std::vector<std::vector<float>> th(p.size());
  for (std::size_t k = 0; k < p.size(); ++k) th[k].resize(p[k].size());
  a.copy_global_to(th);
  inspect(a, concat_all(p), concat_all(th));
}

// Steps [from, to) of the problem on a replicated trainer `a` over mesh
// `m`: the group's gradients, averaged over intra, then step(grads).
template <class A, class Comm>
void train_range(A& a, dc::mesh<Comm>& m, std::vector<std::vector<float>>& p, int from, int to) {
  std::vector<std::vector<float>> g(p.size());
  for (int s = from; s < to; ++s) {
    gradients_into(g, m.group(), s, p);
    dc::all_reduce_gradients(m, g);
    a.step(g);
  }
}

// The whole theta_global of a replicated trainer (copy_global_to), its
// tensors concatenated; `shape`: tensors of the parameters' sizes.
template <class A>
std::vector<float> whole_global(A& a, const std::vector<std::vector<float>>& shape) {
  std::vector<std::vector<float>> th(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k) th[k].resize(shape[k].size());
  a.copy_global_to(th);
  return concat_all(th);
}

template <class C, class Sync>
flat_result run_flat(int R) {
  using algo = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, C, dc::comm::threads, Sync>;
  flat_result out;
  out.replica.resize(static_cast<std::size_t>(R));
  out.global.resize(static_cast<std::size_t>(R));
  dc::comm::threads::world world(R);
  world.run([&](dc::comm::threads& comm) {
    auto p = initial_params();
    algo a(p, comm, {.inner_steps = H, .inner = {.lr = 0.1f}});
    std::vector<std::vector<float>> g(p.size());
    for (int s = 0; s < steps; ++s) {
      gradients_into(g, comm.rank(), s, p);
      a.step(g);
    }
    a.finish();
    std::vector<std::vector<float>> th(p.size());
    for (std::size_t k = 0; k < p.size(); ++k) th[k].resize(p[k].size());
    a.copy_global_to(th);
    out.replica[static_cast<std::size_t>(comm.rank())] = concat_all(p);
    out.global[static_cast<std::size_t>(comm.rank())] = concat_all(th);
  });
  return out;
}

}  // namespace mesh_problem
