// SPDX-License-Identifier: Apache-2.0
// The same training runs, compiled once with the default flags and once
// with -O3 -mfma -ffp-contract=fast (CMake builds both): each prints one
// line per run, `name: hash` of the bits of theta_global, the replicas and
// the error-feedback residual. The library rounds its host arithmetic
// operation by operation whatever the contraction flags (core/macros.hpp,
// DILOCO_EXACT_FP_BEGIN), so both binaries must print the same lines
// (test/fp_contract/compare.cmake). Before that, GCC fused the optimizer
// and outer-apply multiply-adds into FMAs under -mfma, and every run's bits
// differed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <diloco/diloco.hpp>
#include <mutex>
#include <string>
#include <vector>

namespace dc = diloco;
namespace cp = diloco::compress;

// The probe's own arithmetic (the gradients) must not depend on the flags
// either, so it is compiled the library's way.
DILOCO_EXACT_FP_BEGIN

namespace {

std::uint64_t fnv(std::uint64_t h, const float* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, p + i, 4);
    for (int b = 0; b < 4; ++b) h = (h ^ ((bits >> (8 * b)) & 0xffu)) * 0x100000001b3ULL;
  }
  return h;
}

// 2 workers, a quadratic per worker over tensors of awkward sizes; returns
// the hash of everything the run leaves.
// `shaped`: the tensors as matrices (7 x 10, 3 x 43, 3 x 11; low_rank
// compresses those).
template <class Inner, class Outer, class Compressor, class Sync>
std::uint64_t run(typename dc::algorithm_options<Inner, Outer, Compressor, Sync> opts, int steps, bool shaped = false) {
  const std::vector<std::size_t> sizes = {3, 70, 1, 129, 33}, cols = {1, 10, 1, 43, 11};
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  std::mutex mu;
  std::vector<std::uint64_t> per_rank(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    std::vector<std::vector<float>> w, g;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back(sizes[k]);
      g.emplace_back(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) w[k][i] = 0.3f * std::sin(0.7f * static_cast<float>(i + 13 * k));
    }
    std::vector<dc::matrix_view<float>> views;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      views.emplace_back(w[k].data(), shaped ? sizes[k] / cols[k] : sizes[k], shaped ? cols[k] : 1);
    dc::algorithm<Inner, Outer, Compressor, dc::comm::threads, Sync> t(views, comm, opts);
    for (int s = 0; s < steps; ++s) {
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i)
          g[k][i] = 1.7f * w[k][i] - std::cos(0.31f * static_cast<float>(i * (k + 1) + 7 * m) + 0.01f * static_cast<float>(s));
      t.step(g);
    }
    t.finish();
    std::uint64_t h = 0xcbf29ce484222325ULL;
    const auto global = t.global_parameters();
    h = fnv(h, global.data(), global.size());
    for (const auto& x : w) h = fnv(h, x.data(), x.size());
    const auto residual = t.compression_residual();
    h = fnv(h, residual.data(), residual.size());
    std::lock_guard lock(mu);
    per_rank[static_cast<std::size_t>(m)] = h;
  });
  for (std::uint64_t h : per_rank) hash = (hash ^ h) * 0x100000001b3ULL;
  return hash;
}

void print(const char* name, std::uint64_t h) {
  std::printf("%s: %016llx\n", name, static_cast<unsigned long long>(h));
}

}  // namespace

DILOCO_EXACT_FP_END

int main() {
#if defined(DILOCO_PROBE_FMA) && (defined(__x86_64__) || defined(__i386__))
  if (!__builtin_cpu_supports("fma")) {
    std::printf("SKIPPED: this CPU has no FMA instructions\n");
    return 0;
  }
#endif
  using dc::inner::adamw;
  using dc::inner::sgd;
  using dc::outer::nesterov;
  namespace sy = dc::sync;
  print("adamw_nesterov_fp32_blocking",
        run<adamw, nesterov, cp::none, sy::blocking>(
            {.inner_steps = 4, .inner = {.lr = 0.02f, .weight_decay = 0.1f, .max_grad_norm = 1.0f}}, 12));
  print("sgd_momentum_nesterov_streaming",
        run<sgd, nesterov, cp::none, sy::streaming>(
            {.inner_steps = 4, .inner = {.lr = 0.05f, .momentum = 0.9f, .nesterov = true},
             .sync = {.fragments = 2, .delay = 1, .alpha = 0.5f}},
            12));
  print("adamw_int8_ef_one_step_delay",
        run<adamw, nesterov, cp::error_feedback<cp::blockwise<dc::int8, 16>>, sy::one_step_delay>(
            {.inner_steps = 4, .inner = {.lr = 0.02f}}, 12));
  // B = 32: whole blocks take the hand-vectorised host passes
  // (kernels/host_simd.hpp) where the CPU has AVX2.
  print("adamw_int8_32_ef_one_step_delay",
        run<adamw, nesterov, cp::error_feedback<cp::blockwise<dc::int8, 32>>, sy::one_step_delay>(
            {.inner_steps = 4, .inner = {.lr = 0.02f}}, 12));
  print("adamw_int4_32_ef_blocking",
        run<adamw, nesterov, cp::error_feedback<cp::blockwise<dc::int4, 32>>, sy::blocking>(
            {.inner_steps = 4, .inner = {.lr = 0.02f}}, 12));
  print("adamw_int4_ef_stochastic_eager",
        run<adamw, nesterov, cp::error_feedback<cp::blockwise<dc::int4, 32, cp::stochastic_rounding>>, sy::eager>(
            {.inner_steps = 4, .inner = {.lr = 0.02f}, .outer = {.lr = 0.35f}}, 12));
  print("adamw_bf16_blocking",
        run<adamw, nesterov, cp::cast<dc::bf16>, sy::blocking>({.inner_steps = 4, .inner = {.lr = 0.02f}}, 12));
  print("adamw_chunk_topk_ef_blocking",
        run<adamw, nesterov, cp::error_feedback<cp::chunk_topk<32, 4, dc::int2>>, sy::blocking>(
            {.inner_steps = 4, .inner = {.lr = 0.02f}, .compress = {.decay = 0.95f}}, 12));
  print("adamw_low_rank_blocking",
        run<adamw, nesterov, cp::low_rank, sy::blocking>(
            {.inner_steps = 4, .inner = {.lr = 0.02f}, .compress = {.rank = 2}}, 12, /*shaped=*/true));
  return 0;
}
