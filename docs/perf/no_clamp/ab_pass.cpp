// One pass timed for bench ab (README.md): reduce_blocks at M = 4 (or, via NAME_enc, encode_block
// without error feedback) over 2048 blocks of 128 in cache on one thread, or 32768 blocks on
// OpenMP's threads; via NAME_ct, chunk_topk 64/4096 int2's encode pass over 16 chunks, flat
// (WHICH even) or normal (WHICH odd); compiled once per header version with the namespace renamed.
#include <algorithm>
#include <diloco/diloco.hpp>
#include <diloco/kernels/compressed_passes.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>
namespace cp = diloco::compress;
namespace dk = diloco::kernels;
namespace {
template <class F> double run(int which, std::vector<unsigned char>& outcopy) {
  using C = cp::blockwise_codec<F, 128, cp::round_nearest>;
  const C c{};
  const std::size_t stride = c.stride();
  const std::size_t blocks = which >= 2 ? 32768 : 2048;
  const int kind = which & 1;
  static std::vector<std::vector<std::byte>> pay;
  pay.assign(4, std::vector<std::byte>(blocks * stride));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(128), dq(128);
  for (auto& p : pay)
    for (std::size_t b = 0; b < blocks; ++b) {
      for (auto& x : v) x = nd(rng);
      c.encode(v.data(), 128, p.data() + b * stride, dq.data(), 0, 0);
    }
  std::vector<std::byte> out(blocks * stride);
  std::vector<double> norms(blocks);
  double best = 1e30;
  for (int outer = 0; outer < 7; ++outer) {
    auto t0 = std::chrono::steady_clock::now();
    const int reps = which >= 2 ? 2 : 10;
    for (int r = 0; r < reps; ++r)
#pragma omp parallel for schedule(static)
      for (std::size_t b = 0; b < blocks; b += 8) {
        const std::byte* in[4];
        for (int k = 0; k < 4; ++k) in[k] = pay[k].data() + b * stride;
        if (kind == 0)
          dk::host_simd::reduce_blocks_avx512<F, 128, 8, 8>(in, stride, 4, 0xff, out.data() + b * stride, norms.data() + b);
        else
          dk::host_simd::reduce_blocks<F, 128, 8, 8>(in, stride, 4, 0xff, out.data() + b * stride, norms.data() + b);
      }
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / (reps * blocks * 128.0));
  }
  outcopy.assign(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<unsigned char*>(out.data()) + out.size());
  const auto* nb = reinterpret_cast<const unsigned char*>(norms.data());
  outcopy.insert(outcopy.end(), nb, nb + norms.size() * sizeof(double));
  return best;
}
}
extern "C" double NAME(const char* f, int which, std::vector<unsigned char>* out) {
  if (!std::strcmp(f, "int4")) return run<diloco::int4>(which, *out);
  if (!std::strcmp(f, "int8")) return run<diloco::int8>(which, *out);
  if (!std::strcmp(f, "fp4")) return run<diloco::fp4_e3m0>(which, *out);
  if (!std::strcmp(f, "int2")) return run<diloco::int2>(which, *out);
  if (!std::strcmp(f, "e4m3")) return run<diloco::fp8_e4m3>(which, *out);
  return -1;
}
namespace {
template <class F> double run_enc(int which, std::vector<unsigned char>& outcopy) {
  // encode_block over 2048 blocks of 128 in cache, one thread, no error feedback (which & 1: AVX2).
  constexpr std::size_t B = 128, blocks = 2048, n = B * blocks;
  std::vector<float> g(n), l(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  for (std::size_t i = 0; i < n; ++i) g[i] = nd(rng), l[i] = g[i] + 0.01f * nd(rng);
  using C = cp::blockwise_codec<F, B, cp::round_nearest>;
  const std::size_t stride = C{}.stride();
  std::vector<std::byte> out(blocks * stride);
  std::vector<double> sums(2 * blocks);
  double best = 1e30;
  for (int outer = 0; outer < 7; ++outer) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 10; ++r)
      for (std::size_t b = 0; b < blocks; ++b) {
        if (which & 1)
          dk::host_simd::encode_block<F, B, 8>(g.data() + b * B, l.data() + b * B, nullptr, nullptr, 1.0f, out.data() + b * stride, sums[2 * b], sums[2 * b + 1]);
        else
          dk::host_simd::encode_block_avx512<F, B, 8>(g.data() + b * B, l.data() + b * B, nullptr, nullptr, 1.0f, out.data() + b * stride, sums[2 * b], sums[2 * b + 1]);
      }
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / (10.0 * n));
  }
  outcopy.assign(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<unsigned char*>(out.data()) + out.size());
  const auto* nb = reinterpret_cast<const unsigned char*>(sums.data());
  outcopy.insert(outcopy.end(), nb, nb + sums.size() * sizeof(double));
  return best;
}
}
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
extern "C" double CAT(NAME, _enc)(const char* f, int which, std::vector<unsigned char>* out) {
  if (!std::strcmp(f, "int4")) return run_enc<diloco::int4>(which, *out);
  if (!std::strcmp(f, "int8")) return run_enc<diloco::int8>(which, *out);
  if (!std::strcmp(f, "fp4")) return run_enc<diloco::fp4_e3m0>(which, *out);
  if (!std::strcmp(f, "int2")) return run_enc<diloco::int2>(which, *out);
  if (!std::strcmp(f, "e4m3")) return run_enc<diloco::fp8_e4m3>(which, *out);
  if (!std::strcmp(f, "e5m2")) return run_enc<diloco::fp8_e5m2>(which, *out);
  return -1;
}
namespace {
double run_ct(int which, std::vector<unsigned char>& outcopy) {
  // chunk_topk 64/4096 int2 encode over 16 chunks of bench_compress_step's data, no error feedback (the CPU's path: DILOCO_HOST_SIMD).
  using C = cp::chunk_topk_codec<4096, 64, diloco::int2, cp::round_nearest>;
  const std::size_t n = std::size_t{1} << 16;
  const C c{};
  const cp::block_layout layout({n}, C::block, 1);
  std::vector<float> g(n), l(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  for (std::size_t i = 0; i < n; ++i) {
    if (which & 1) { l[i] = 0.02f * nd(rng); g[i] = l[i] + 1e-3f * nd(rng); }
    else g[i] = 1.0f + 1e-7f * float(i % 1000), l[i] = 0.999f + 1e-7f * float(i % 1000);
  }
  std::vector<float*> ptrs{l.data()};
  std::vector<std::size_t> offs{0};
  std::vector<std::byte> pay(layout.block_count() * c.stride());
  const dk::encode_pseudo_gradient<C> pass{c, layout.blocks(), {ptrs.data(), offs.data()}, g.data(), nullptr, nullptr, pay.data(), c.stride(), 1};
  double best = 1e30, s = 0;
  for (int outer = 0; outer < 7; ++outer) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 10; ++r)
      for (std::size_t b = 0; b < layout.block_count(); ++b) { auto x = pass(b); s += x.a + x.b; }
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / (10.0 * n));
  }
  outcopy.assign(reinterpret_cast<unsigned char*>(pay.data()), reinterpret_cast<unsigned char*>(pay.data()) + pay.size());
  const auto* sb = reinterpret_cast<const unsigned char*>(&s);
  outcopy.insert(outcopy.end(), sb, sb + sizeof s);
  return best;
}
}
extern "C" double CAT(NAME, _ct)(const char*, int which, std::vector<unsigned char>* out) { return run_ct(which, *out); }
