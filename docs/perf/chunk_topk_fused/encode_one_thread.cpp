// One thread, chunk_topk 64/4096 int2 encode pass (encode_pseudo_gradient) over
// 2^lg parameters, flat (as bench_compress_step fills) or normal data:
//   c++ -O3 -DNDEBUG -std=c++20 -Iinclude encode_one_thread.cpp -o e && REPS=400 ./e 0 n 16
// args: error feedback (0/1), f|n, lg (22); prints the median and least ns/element.
#include <diloco/diloco.hpp>
#include <diloco/kernels/compressed_passes.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <algorithm>
namespace cp = diloco::compress;
namespace dk = diloco::kernels;
// chunk_topk encode on one thread, data as bench_compress_step fills it (flat-ish) or normal (arg 2 = 'n').
int main(int argc, char** argv) {
  using C = cp::chunk_topk_codec<4096, 64, diloco::int2, cp::round_nearest>;
  const bool ef = argc > 1 && argv[1][0] == '1';
  const bool normal = argc > 2 && argv[2][0] == 'n';
  const int lg = argc > 3 ? std::atoi(argv[3]) : 22;
  const std::size_t n = std::size_t{1} << lg;
  const C c{};
  const cp::block_layout layout({n}, C::block, 1);
  std::vector<float> g(n), l(n), e(n, 0.0f), nx(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  for (std::size_t i = 0; i < n; ++i) {
    if (normal) g[i] = 1.0f + 1e-3f * nd(rng), l[i] = 0.999f + 1e-3f * nd(rng), e[i] = 1e-4f * nd(rng);
    else g[i] = 1.0f + 1e-7f * float(i % 1000) + 1e-4f * float((i * 2654435761u) % 97), l[i] = 0.999f + 1e-7f * float(i % 1000), e[i] = 1e-5f * float(i % 13);
  }
  std::vector<float*> ptrs{l.data()};
  std::vector<std::size_t> offs{0};
  std::vector<std::byte> pay(layout.block_count() * c.stride());
  const dk::encode_pseudo_gradient<C> pass{c, layout.blocks(), {ptrs.data(), offs.data()}, g.data(), ef ? e.data() : nullptr, ef ? nx.data() : nullptr, pay.data(), c.stride(), 1};
  double s = 0;
  std::vector<double> ts;
  const int reps = std::getenv("REPS") ? std::atoi(std::getenv("REPS")) : 9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t b = 0; b < layout.block_count(); ++b) { auto x = pass(b); s += x.a + x.b; }
    auto t1 = std::chrono::steady_clock::now();
    ts.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n));
  }
  std::sort(ts.begin(), ts.end());
  unsigned long h = 0;
  for (auto b : pay) h = h * 131 + unsigned(b);
  double rs = 0; for (auto x : nx) rs += x;
  std::printf("chunk_topk encode ef=%d %s: %.3f ns/elem (min %.3f) sum %.17g payload %lx res %.17g\n", ef, normal ? "normal" : "flat", ts[ts.size() / 2], ts[0], s, h, rs);
}
