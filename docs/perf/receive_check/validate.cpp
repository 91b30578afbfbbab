// The receiver's validation of one 2^24-parameter int8 payload (B = 128),
// before (checksum then structure check, one thread) and after (one pass,
// the executor's threads), against STREAM triad in the same run.
#include <diloco/diloco.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
namespace cp = diloco::compress;
namespace wire = diloco::wire;
int main() {
  using codec = cp::blockwise_codec<diloco::int8, 128, cp::round_nearest>;
  const codec c{};
  const std::size_t n = 1u << 24;
  const cp::block_layout layout({n}, 128, 1);
  std::vector<std::byte> payload(layout.block_count() * c.stride());
  std::vector<float> v(128), dq(128);
  for (std::size_t b = 0; b < layout.block_count(); ++b) {
    for (std::size_t j = 0; j < 128; ++j) v[j] = static_cast<float>((b * 37 + j * 11) % 101) - 50.0f;
    c.encode(v.data(), 128, payload.data() + b * c.stride(), dq.data(), 0, 0);
  }
  std::vector<float> a(n), x(n, 1.0f), y(n, 2.0f);
  diloco::exec::host ex(2);
  auto best = [](auto f) { double t = 1e9; for (int r = 0; r < 9; ++r) { auto t0 = std::chrono::steady_clock::now(); f(); t = std::min(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()); } return t; };
  volatile std::uint64_t sink = 0;
  const double bytes = static_cast<double>(payload.size());
  for (int rep = 0; rep < 3; ++rep) {
    const double tt = best([&] { ex.for_each(n, [&](std::size_t i) { a[i] = x[i] + 3.0f * y[i]; }); });
    const double triad = 12.0 * n / tt;
    const double ts = best([&] {
      sink = sink + wire::detail::payload_words_sum(payload.data(), payload.size());
      sink = sink + cp::first_bad_block(c, payload.data(), layout.blocks(), layout.block_count()).index; });
#ifdef NEW
    const double tp = best([&] { const auto r = cp::scan_payload(ex, c, payload.data(), layout.blocks(), layout.block_count(), true); sink = sink + r.sum + r.bad.index; });
    const double tc = best([&] { sink = sink + cp::payload_words_sum(ex, payload.data(), payload.size()); });
    std::printf("new: triad %.1f GB/s; serial checksum+check %.2f of triad; one pass, 2 threads %.2f; checksum, 2 threads %.2f\n", triad / 1e9, bytes / ts / triad, bytes / tp / triad, bytes / tc / triad);
#else
    const double tc = best([&] { sink = sink + wire::detail::payload_words_sum(payload.data(), payload.size()); });
    std::printf("old: triad %.1f GB/s; serial checksum+check %.2f of triad; checksum, 1 thread %.2f\n", triad / 1e9, bytes / ts / triad, bytes / tc / triad);
#endif
  }
}
