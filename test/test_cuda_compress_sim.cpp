// SPDX-License-Identifier: Apache-2.0
// The device path of the compressed mean, on the host: in this program
// "device memory" is host memory and the device executor replays every
// thread of the grids exec::cuda would launch (cuda_grid_sim.hpp), so the
// team programs (kernels/compressed_blocks.hpp), the device checksum and
// structure checks (kernels/wire_passes.hpp) and the compressed mean over
// device memory (compress/compressed_mean.hpp), and chunk_topk's team programs
// (kernels/topk_blocks.hpp) with the gathered mean over device memory
// (compress/gathered_mean.hpp), and low_rank's engine over device
// memory (compress/low_rank.hpp: its passes as grid launches, the device
// checksums and headers) all run here.
//
// References: the host reference functors (kernels/compressed_passes.hpp),
// the host checksum and validation (codec/wire_format.hpp, segment.hpp)
// and the host engine, itself tested against the codecs' definitions in
// test_compressed_mean.cpp. The device path promises the same bits: the same
// wire bytes (headers and norms included), theta_global, replicas and
// error-feedback residuals, so every comparison here is exact.
//
// What a replay cannot see: it runs a team program's threads one after
// another, so every thread's writes are in place before the next reads
// them. A missing __syncthreads() (or a barrier a thread skips), a race on
// shared memory, and a read of shared memory before another thread wrote it
// pass here; only a GPU run catches them (test/README.md lists what only
// scripts/gpu-check.sh checks).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "sim_device.hpp"
#include "threads_link.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
namespace k = diloco::kernels;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * n01(rng);
  return v;
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// Equal bits, or both NaN: which NaN an operation returns depends on its
// operands' order, which compilers may swap (float addition commutes), so
// NaN payloads are not part of any promise.
bool same_value(double a, double b) { return same_bytes(&a, &b, sizeof a) || (std::isnan(a) && std::isnan(b)); }
bool same_sums(const k::sums2& a, const k::sums2& b) { return same_value(a.a, b.a) && same_value(a.b, b.b); }

// ------------------------------------------------------------------ passes
// One codec's three passes over the blocks of a few tensors, device form
// (team programs in the replayed grid) against the host reference functors,
// block by block.
template <class Codec>
void compare_passes(const std::vector<std::size_t>& sizes, bool residual, int world, std::uint32_t seed) {
  using E = k::codec_elements<Codec>;
  const Codec codec{};
  CAPTURE(Codec::block);
  CAPTURE(residual);
  CAPTURE(world);
  // Packed (host) and padded (device) flat layouts of the same tensors.
  std::vector<std::size_t> packed, padded;
  std::size_t np = 0, nd = 0;
  for (auto n : sizes) {
    packed.push_back(np);
    padded.push_back(nd);
    np += n;
    nd += (n + 15) / 16 * 16;
  }
  const cp::block_layout layout(sizes, Codec::block, 1);
  const std::size_t nb = layout.block_count();
  // Values of mixed magnitudes per block, plus zero, tiny and huge blocks.
  std::vector<std::vector<float>> local;
  for (std::size_t t = 0; t < sizes.size(); ++t) local.push_back(random_floats(sizes[t], seed + static_cast<std::uint32_t>(t), 0.01f));
  std::vector<float> global_h = random_floats(np, seed + 100), residual_h = random_floats(np, seed + 200, 0.001f);
  if (np > 3) {
    global_h[0] = local[0][0];  // a zero delta
    global_h[np - 1] *= 1e-38f;
  }
  std::vector<float> global_d(nd, 0.0f), residual_d(nd, 0.0f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      global_d[padded[t] + i] = global_h[packed[t] + i];
      residual_d[padded[t] + i] = residual_h[packed[t] + i];
    }
  std::vector<float*> local_ptr;
  std::vector<k::device_tensor> tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    local_ptr.push_back(local[t].data());
    tensors.push_back({local[t].data(), padded[t], packed[t]});
  }
  const k::tensor_table table{local_ptr.data(), packed.data()};
  const std::uint64_t stream = k::make_stream(seed, 3, 1, 1);

  // Stage 1.
  std::vector<std::byte> pay_h(nb * Codec::stride(), std::byte{0x55}), pay_d(nb * Codec::stride(), std::byte{0xaa});
  std::vector<float> next_h(np, -1.0f), next_d(nd, -1.0f);
  std::vector<k::sums2> sums_d(nb);
  const k::encode_pseudo_gradient<Codec> host{codec,
                                              layout.blocks(),
                                              table,
                                              global_h.data(),
                                              residual ? residual_h.data() : nullptr,
                                              residual ? next_h.data() : nullptr,
                                              pay_h.data(),
                                              Codec::stride(),
                                              stream};
  std::vector<k::sums2> sums_h(nb);
  for (std::size_t b = 0; b < nb; ++b) sums_h[b] = host(b);
  const bool vector = E::group == 4;
  sim::run_teams(nb, k::encode_blocks<E>{layout.blocks(), tensors.data(), global_d.data(),
                                         residual ? residual_d.data() : nullptr, residual ? next_d.data() : nullptr,
                                         pay_d.data(), stream, sums_d.data(), vector});
  CHECK(same_bytes(pay_h.data(), pay_d.data(), pay_h.size()));
  for (std::size_t b = 0; b < nb; ++b) {
    CAPTURE(b);
    REQUIRE(same_sums(sums_h[b], sums_d[b]));
  }
  if (residual)
    for (std::size_t t = 0; t < sizes.size(); ++t)
      REQUIRE(same_bytes(next_h.data() + packed[t], next_d.data() + padded[t], sizes[t] * sizeof(float)));
  // Every block is well formed.
  for (std::size_t b = 0; b < nb; ++b) REQUIRE(codec.check(pay_d.data() + b * Codec::stride(), layout.blocks()[b].len) == nullptr);

  // Stages 3+4: `world` encodings of this shard (the stage-1 payload with
  // different factors or values per source), reduced.
  std::vector<std::vector<std::byte>> sources;
  for (int r = 0; r < world; ++r) {
    sources.push_back(pay_h);
    std::vector<float> v = random_floats(np, seed + 300 + static_cast<std::uint32_t>(r));
    if (nb > 1) {  // block 1 tiny: a subnormal scale (and amax itself subnormal for odd r), decoded as (q * amax) / L
      const auto tiny = layout.blocks()[1];
      for (std::size_t j = 0; j < tiny.len; ++j) v[packed[tiny.tensor] + tiny.start + j] *= r % 2 ? 1e-39f : 2e-37f;
    }
    float dq[Codec::block];
    for (std::size_t b = 0; b < nb; ++b) {
      const auto blk = layout.blocks()[b];
      codec.encode(v.data() + packed[blk.tensor] + blk.start, blk.len, sources.back().data() + b * Codec::stride(), dq,
                   stream, 0);
    }
  }
  std::vector<const std::byte*> received;
  for (auto& s : sources) received.push_back(s.data());
  std::vector<std::byte> red_h(pay_h.size(), std::byte{1}), red_d(pay_h.size(), std::byte{2});
  const std::uint64_t stream2 = k::make_stream(seed, 3, 1, 2);
  const k::reduce_shard<Codec> host_reduce{codec, layout.blocks(), packed.data(), received.data(), world,
                                           red_h.data(), Codec::stride(), stream2};
  sim::run_teams(nb, k::reduce_blocks<E>{layout.blocks(), tensors.data(), received.data(), world, red_d.data(), stream2,
                                         sums_d.data()});
  for (std::size_t b = 0; b < nb; ++b) {
    CAPTURE(b);
    const double want = host_reduce(b);
    REQUIRE(same_bytes(&want, &sums_d[b].a, sizeof want));
  }
  CHECK(same_bytes(red_h.data(), red_d.data(), red_h.size()));

  // Stage 7 with Nesterov (state) on both layouts.
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  std::vector<float> state_h = random_floats(np, seed + 400), state_d(nd, 0.0f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) state_d[padded[t] + i] = state_h[packed[t] + i];
  auto local_d = local;  // the device pass writes its own copy of the replica
  std::vector<k::device_tensor> tensors_d = tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) tensors_d[t].local = local_d[t].data();
  const k::decode_apply<Codec, k::sgd_update> host_apply{codec, nesterov, layout.blocks(), table, red_h.data(),
                                                         Codec::stride(), global_h.data(), state_h.data(), np};
  for (std::size_t b = 0; b < nb; ++b) host_apply(b);
  sim::run_teams(nb, k::decode_apply_blocks<E, k::sgd_update>{nesterov, layout.blocks(), tensors_d.data(), red_d.data(),
                                                              global_d.data(), state_d.data(), nd, vector});
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    CAPTURE(t);
    REQUIRE(same_bytes(global_h.data() + packed[t], global_d.data() + padded[t], sizes[t] * sizeof(float)));
    REQUIRE(same_bytes(state_h.data() + packed[t], state_d.data() + padded[t], sizes[t] * sizeof(float)));
    REQUIRE(same_bytes(local[t].data(), local_d[t].data(), sizes[t] * sizeof(float)));
  }
}

}  // namespace

TEST_CASE("team programs give the host passes' bytes, sums and results at block boundaries") {
  for (std::size_t b : {std::size_t{1}, std::size_t{127}, std::size_t{128}, std::size_t{129}}) {
    // One tensor of b elements, then several tensors that cross blocks.
    for (const auto& sizes : {std::vector<std::size_t>{b}, std::vector<std::size_t>{b, 3, 257, 128, 1}}) {
      CAPTURE(sizes.size());
      CAPTURE(b);
      for (bool residual : {false, true}) {
        compare_passes<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>(sizes, residual, 3, 1);
        compare_passes<cp::blockwise_codec<dc::int4, 128, cp::round_nearest>>(sizes, residual, 2, 2);
        compare_passes<cp::blockwise_codec<dc::int4, 128, cp::stochastic_rounding>>(sizes, residual, 4, 3);
        compare_passes<cp::cast_codec<dc::bf16, cp::round_nearest>>(sizes, residual, 3, 4);
        compare_passes<cp::cast_codec<dc::fp16, cp::stochastic_rounding>>(sizes, residual, 2, 5);
      }
    }
  }
}

TEST_CASE("team programs: block sizes that are not multiples of 4, tiny blocks, large blocks") {
  // B = 10: groups of 2, an int4 stride of 9 (factors unaligned); B = 8:
  // teams of 8 with 6 idle threads; B = 4096: 4 groups per thread.
  const std::vector<std::size_t> sizes{1, 9, 10, 11, 23, 4097, 8191};
  for (bool residual : {false, true}) {
    compare_passes<cp::blockwise_codec<dc::int4, 10, cp::round_nearest>>(sizes, residual, 3, 11);
    compare_passes<cp::blockwise_codec<dc::int8, 10, cp::stochastic_rounding>>(sizes, residual, 2, 12);
    compare_passes<cp::blockwise_codec<dc::int8, 8, cp::round_nearest>>({1, 2, 3, 9}, residual, 2, 13);
    compare_passes<cp::blockwise_codec<dc::int4, 4096, cp::round_nearest>>(sizes, residual, 3, 14);
    compare_passes<cp::blockwise_codec<dc::int8, 256, cp::round_nearest>>(sizes, residual, 2, 15);
  }
}

TEST_CASE("team programs: the small formats (fp8, fp4, int2) give the host passes' bytes") {
  const std::vector<std::size_t> sizes{1, 3, 127, 128, 129, 257};
  for (bool residual : {false, true}) {
    compare_passes<cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>>(sizes, residual, 3, 21);
    compare_passes<cp::blockwise_codec<dc::fp8_e4m3, 10, cp::stochastic_rounding>>(sizes, residual, 2, 22);
    compare_passes<cp::blockwise_codec<dc::fp8_e5m2, 64, cp::round_nearest>>(sizes, residual, 4, 23);
    compare_passes<cp::blockwise_codec<dc::fp4_e3m0, 128, cp::stochastic_rounding>>(sizes, residual, 3, 24);
    compare_passes<cp::blockwise_codec<dc::fp4_e3m0, 10, cp::round_nearest>>(sizes, residual, 2, 25);
    compare_passes<cp::blockwise_codec<dc::int2, 128, cp::round_nearest>>(sizes, residual, 3, 26);
    compare_passes<cp::blockwise_codec<dc::int2, 8, cp::stochastic_rounding>>(sizes, residual, 2, 27);
  }
}

TEST_CASE("non-finite and extreme blocks: the same codes and residuals (NaN factors, tiny scales, fp16 overflow)") {
  using C8 = cp::blockwise_codec<dc::int8, 16, cp::round_nearest>;
  using E8 = k::codec_elements<C8>;
  using CH = cp::cast_codec<dc::fp16, cp::round_nearest>;
  using EH = k::codec_elements<CH>;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // Blocks: a NaN, an inf, all zeros, a subnormal scale, the largest floats.
  std::vector<float> local(80, 0.0f), global(80, 0.0f);
  for (std::size_t i = 0; i < 80; ++i) global[i] = std::sin(static_cast<float>(i));
  global[3] = nan;
  global[20] = -inf;
  for (std::size_t i = 32; i < 48; ++i) global[i] = 0.0f;
  for (std::size_t i = 48; i < 64; ++i) global[i] = 1e-39f * (static_cast<float>(i) - 50.0f);  // amax 1.3e-38: L / amax overflows, amax / L is subnormal
  for (std::size_t i = 64; i < 80; ++i) global[i] = (i % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::max() / static_cast<float>(i - 63);
  float* lp = local.data();
  const std::size_t off = 0;
  const k::tensor_table table{&lp, &off};
  const k::device_tensor dt{lp, 0, 0};
  auto run = [&](auto codec, auto elements) {
    using Codec = decltype(codec);
    using E = decltype(elements);
    const cp::block_layout layout({80}, Codec::block, 1);
    const std::size_t nb = layout.block_count();
    std::vector<std::byte> ph(nb * Codec::stride()), pd(nb * Codec::stride());
    std::vector<float> rh(80), rd(80);
    std::vector<k::sums2> sd(nb);
    const k::encode_pseudo_gradient<Codec> host{codec, layout.blocks(), table, global.data(), nullptr, rh.data(),
                                                ph.data(), Codec::stride(), 7};
    std::vector<k::sums2> sh(nb);
    for (std::size_t b = 0; b < nb; ++b) sh[b] = host(b);
    sim::run_teams(nb, k::encode_blocks<E>{layout.blocks(), &dt, global.data(), nullptr, rd.data(), pd.data(), 7,
                                           sd.data(), true});
    CHECK(same_bytes(ph.data(), pd.data(), ph.size()));
    CHECK(same_bytes(rh.data(), rd.data(), rh.size() * sizeof(float)));
    for (std::size_t b = 0; b < nb; ++b) CHECK(same_sums(sh[b], sd[b]));
  };
  run(C8{}, E8{});
  run(CH{}, EH{});
}

TEST_CASE("device payload checksums equal the host's at every tail length") {
  std::vector<std::byte> bytes(4096 + 64);
  std::mt19937 rng(5);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  for (std::size_t n : {0, 1, 7, 8, 9, 15, 63, 64, 65, 1000, 2049, 4096}) {
    CAPTURE(n);
    // Three segments of different lengths in one launch, sized by the largest.
    std::vector<k::segment_ref> segs{{bytes.data(), n, 0, 0, 0},
                                     {bytes.data() + 64, n / 2, 0, 0, 0},
                                     {bytes.data() + 8, 4096 - n, 0, 0, 0}};
    std::vector<std::uint64_t> sums(3, 1);
    sim::checksum_segments(segs.data(), segs.size(), 4096, sums.data());
    for (std::size_t s = 0; s < segs.size(); ++s)
      CHECK(sums[s] == dc::wire::detail::payload_words_sum(segs[s].payload, segs[s].payload_bytes));
  }
}

TEST_CASE("the device structure check finds the first malformed block of each segment, as validate_segment does") {
  using C4 = cp::blockwise_codec<dc::int4, 8, cp::round_nearest>;
  const C4 codec{};
  // Blocks of 8, 8, 5 elements: the last block's padding is checkable.
  const cp::block_layout layout({21}, 8, 1);
  const std::size_t stride = C4::stride();
  std::vector<std::byte> payload(3 * stride * 2, std::byte{0});  // two segments of the same 3 blocks
  std::vector<k::segment_ref> segs{{payload.data(), 3 * stride, 0, 3, 0}, {payload.data() + 3 * stride, 3 * stride, 0, 3, 3}};
  auto first_bad = [&] {
    std::vector<std::uint64_t> out(2, ~std::uint64_t{0});
    sim::cuda_executor ex;
    ex.for_each(k::check_blocks<C4>::items(6), k::check_blocks<C4>{codec, segs.data(), 2, layout.blocks(), out.data()});
    return out;
  };
  CHECK(first_bad() == std::vector<std::uint64_t>{~std::uint64_t{0}, ~std::uint64_t{0}});
  // Segment 0: an int4 -8 in block 2 and a non-zero padding nibble in block 2.
  // Segment 1: a padding nibble in block 2 and -8 in block 1 (first wins).
  payload[2 * stride + 4] = std::byte{0x08};
  payload[3 * stride + 2 * stride + 4 + 2] = std::byte{0x10};
  payload[3 * stride + 1 * stride + 4 + 3] = std::byte{0x80};
  const auto got = first_bad();
  CHECK(got[0] == 2);
  CHECK(got[1] == 1);
  // The host validator names the same blocks.
  for (std::size_t s = 0; s < 2; ++s) {
    std::size_t host_first = 3;
    for (std::size_t b = 0; b < 3 && host_first == 3; ++b)
      if (codec.check(payload.data() + s * 3 * stride + b * stride, layout.blocks()[b].len)) host_first = b;
    CHECK(got[s] == host_first);
  }
}

namespace {

// Every single-byte corruption of a segment of valid blocks (the last one
// partial): the team scan (check_blocks<Codec>::team threads per block, each
// checking its share) reports the first block the host validator
// codec.check refuses, which is the block the host then names with
// check()'s message; the valid segment passes both.
template <class Codec>
void team_check_agrees_with_check(std::size_t elements, std::uint32_t seed) {
  using check = k::check_blocks<Codec>;
  const Codec codec{};
  const cp::block_layout layout({elements}, Codec::block, 1);
  const std::size_t nb = layout.block_count(), stride = Codec::stride();
  CAPTURE(Codec::block);
  CAPTURE(check::team);
  const auto v = random_floats(elements, seed);
  std::vector<float> dq(Codec::block);
  std::vector<std::byte> valid(nb * stride), payload;
  for (std::size_t b = 0; b < nb; ++b) {
    const auto blk = layout.blocks()[b];
    codec.encode(v.data() + blk.start, blk.len, valid.data() + b * stride, dq.data(), 0, blk.start);
  }
  REQUIRE(layout.blocks()[nb - 1].len < Codec::block);  // a partial block's padding is checked too
  const k::segment_ref seg{nullptr, nb * stride, 0, nb, 0};
  auto first_bad = [&] {
    k::segment_ref s = seg;
    s.payload = payload.data();
    std::vector<std::uint64_t> out(1, ~std::uint64_t{0});
    sim::cuda_executor ex;
    ex.for_each(check::items(nb), check{codec, &s, 1, layout.blocks(), out.data()});
    return out[0];
  };
  auto host_first_bad = [&] {
    for (std::size_t b = 0; b < nb; ++b)
      if (codec.check(payload.data() + b * stride, layout.blocks()[b].len) != nullptr) return std::uint64_t{b};
    return ~std::uint64_t{0};
  };
  payload = valid;
  REQUIRE(host_first_bad() == ~std::uint64_t{0});
  CHECK(first_bad() == ~std::uint64_t{0});
  std::mt19937 rng(seed);
  std::size_t refused = 0, agreed = 0, cases = 0;
  for (std::size_t pos = 0; pos < valid.size(); ++pos)
    for (unsigned x : {0x01u, 0x80u, 0xffu, static_cast<unsigned>(rng() % 256)}) {
      payload = valid;
      payload[pos] ^= std::byte(x);
      const std::uint64_t want = host_first_bad();
      refused += want != ~std::uint64_t{0};
      agreed += first_bad() == want;
      ++cases;
    }
  CHECK(agreed == cases);
  CHECK(refused > 0);  // the corruptions do reach the checked bytes
}

}  // namespace

TEST_CASE("the team structure check: every single-byte corruption gets check()'s verdict, for every device codec") {
  team_check_agrees_with_check<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>(3 * 128 + 37, 1);
  team_check_agrees_with_check<cp::blockwise_codec<dc::int8, 32, cp::round_nearest>>(2 * 32 + 5, 2);
  team_check_agrees_with_check<cp::blockwise_codec<dc::int4, 64, cp::round_nearest>>(2 * 64 + 9, 3);
  team_check_agrees_with_check<cp::blockwise_codec<dc::int4, 8, cp::round_nearest>>(4 * 8 + 5, 4);
  team_check_agrees_with_check<cp::blockwise_codec<dc::int2, 128, cp::round_nearest>>(128 + 7, 5);
  team_check_agrees_with_check<cp::blockwise_codec<dc::fp8_e4m3, 64, cp::round_nearest>>(64 + 3, 6);
  team_check_agrees_with_check<cp::blockwise_codec<dc::fp4_e3m0, 16, cp::round_nearest>>(3 * 16 + 7, 7);
  team_check_agrees_with_check<cp::cast_codec<dc::bf16, cp::round_nearest>>(3 * 64 + 11, 8);
  team_check_agrees_with_check<cp::chunk_topk_codec<4096, 64, dc::int2, cp::round_nearest>>(4096 + 1000, 9);
  team_check_agrees_with_check<cp::chunk_topk_codec<256, 16, dc::int4, cp::round_nearest>>(256 + 9, 10);
}

// ------------------------------------------------------------------ engine
// ------------------------------------------------------------ top-k passes
namespace {

// chunk_topk's two device passes (kernels/topk_blocks.hpp) in the replayed
// grid against the host functors (encode_pseudo_gradient,
// gathered_decode_apply), chunk by chunk. The deltas hold the cases a
// selection can get wrong: runs of equal magnitudes of both signs (ties
// across the threshold, decided by the lower index), zeros and -0, a chunk
// of one repeated value, an all-zero chunk, and optionally a NaN.
template <class Codec>
void compare_topk_passes(const std::vector<std::size_t>& sizes, bool residual, float decay, int world,
                         std::uint32_t seed, bool with_nan = false) {
  const Codec codec{};
  CAPTURE(Codec::block);
  CAPTURE(Codec::k);
  CAPTURE(Codec::values_name);
  CAPTURE(residual);
  CAPTURE(world);
  std::vector<std::size_t> packed, padded;
  std::size_t np = 0, nd = 0;
  for (auto n : sizes) {
    packed.push_back(np);
    padded.push_back(nd);
    np += n;
    nd += (n + 15) / 16 * 16;
  }
  const cp::block_layout layout(sizes, Codec::block, 1);
  const std::size_t nb = layout.block_count();
  std::vector<std::vector<float>> local;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    local.push_back(random_floats(sizes[t], seed + static_cast<std::uint32_t>(t), 0.01f));
  std::vector<float> global_h = random_floats(np, seed + 100), residual_h = random_floats(np, seed + 200, 0.001f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      const std::size_t j = packed[t] + i;
      if (i % 5 == 1) {  // runs of +-2.5 and of +-0: equal magnitudes
        local[t][i] = 0.0f;
        global_h[j] = (i % 3 == 0 ? -2.5f : 2.5f);
      } else if (i % 11 == 4) {
        local[t][i] = 0.0f;
        global_h[j] = (i % 2 ? -0.0f : 0.0f);
        residual_h[j] = (i % 4 ? -0.0f : 0.0f);
      }
    }
  // Tensor 1 (when there is one) all ties, tensor 2 all zeros.
  if (sizes.size() > 1)
    for (std::size_t i = 0; i < sizes[1]; ++i) {
      local[1][i] = 0.0f;
      global_h[packed[1] + i] = i % 2 ? 1.0f : -1.0f;
      residual_h[packed[1] + i] = 0.0f;
    }
  if (sizes.size() > 2)
    for (std::size_t i = 0; i < sizes[2]; ++i) {
      local[2][i] = 0.0f;
      global_h[packed[2] + i] = 0.0f;
      residual_h[packed[2] + i] = 0.0f;
    }
  if (with_nan) global_h[np / 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> global_d(nd, 0.0f), residual_d(nd, 0.0f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      global_d[padded[t] + i] = global_h[packed[t] + i];
      residual_d[padded[t] + i] = residual_h[packed[t] + i];
    }
  std::vector<float*> local_ptr;
  std::vector<k::device_tensor> tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    local_ptr.push_back(local[t].data());
    tensors.push_back({local[t].data(), padded[t], packed[t]});
  }
  const k::tensor_table table{local_ptr.data(), packed.data()};
  const std::uint64_t stream = k::make_stream(seed, 3, 1, 1);

  // Encode.
  std::vector<std::byte> pay_h(nb * Codec::stride(), std::byte{0x55}), pay_d(nb * Codec::stride(), std::byte{0xaa});
  std::vector<float> next_h(np, -1.0f), next_d(nd, -1.0f);
  std::vector<k::sums2> sums_h(nb), sums_d(nb);
  const k::encode_pseudo_gradient<Codec> host{codec,
                                              layout.blocks(),
                                              table,
                                              global_h.data(),
                                              residual ? residual_h.data() : nullptr,
                                              residual ? next_h.data() : nullptr,
                                              pay_h.data(),
                                              Codec::stride(),
                                              stream,
                                              decay};
  for (std::size_t b = 0; b < nb; ++b) sums_h[b] = host(b);
  sim::run_teams(nb, k::topk_encode_blocks<Codec>{layout.blocks(), tensors.data(), global_d.data(),
                                                  residual ? residual_d.data() : nullptr,
                                                  residual ? next_d.data() : nullptr, pay_d.data(), stream,
                                                  sums_d.data(), decay, true});
  for (std::size_t b = 0; b < nb; ++b) {
    CAPTURE(b);
    REQUIRE(same_bytes(pay_h.data() + b * Codec::stride(), pay_d.data() + b * Codec::stride(), Codec::stride()));
    REQUIRE(same_sums(sums_h[b], sums_d[b]));
    REQUIRE(codec.check(pay_d.data() + b * Codec::stride(), layout.blocks()[b].len) == nullptr);
  }
  if (residual)
    for (std::size_t t = 0; t < sizes.size(); ++t)
      REQUIRE(same_bytes(next_h.data() + packed[t], next_d.data() + padded[t], sizes[t] * sizeof(float)));
  if (with_nan) return;

  // Decode, sum in rank order, Nesterov, copy-back: `world` segments, the
  // first the one just encoded, the others other vectors' encodings.
  std::vector<std::vector<std::byte>> sources{pay_h};
  for (int r = 1; r < world; ++r) {
    sources.push_back(pay_h);
    std::vector<float> v = random_floats(np, seed + 300 + static_cast<std::uint32_t>(r));
    for (std::size_t i = 0; i < np; i += 3) v[i] = i % 2 ? -0.0f : 0.0f;
    float dq[Codec::block];
    for (std::size_t b = 0; b < nb; ++b) {
      const auto blk = layout.blocks()[b];
      codec.encode(v.data() + packed[blk.tensor] + blk.start, blk.len, sources.back().data() + b * Codec::stride(), dq,
                   stream, 0);
    }
  }
  std::vector<const std::byte*> payloads;
  for (auto& src : sources) payloads.push_back(src.data());
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  std::vector<float> state_h = random_floats(np, seed + 400), state_d(nd, 0.0f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) state_d[padded[t] + i] = state_h[packed[t] + i];
  auto local_d = local;
  std::vector<k::device_tensor> tensors_d = tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) tensors_d[t].local = local_d[t].data();
  const k::gathered_decode_apply<Codec, k::sgd_update> host_apply{
      codec, nesterov, layout.blocks(), table, payloads.data(), world, Codec::stride(), global_h.data(),
      state_h.data(), np};
  for (std::size_t b = 0; b < nb; ++b) host_apply(b);
  sim::run_teams(nb, k::topk_decode_apply_blocks<Codec, k::sgd_update>{nesterov, layout.blocks(), tensors_d.data(),
                                                                       payloads.data(), world, global_d.data(),
                                                                       state_d.data(), nd});
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    CAPTURE(t);
    REQUIRE(same_bytes(global_h.data() + packed[t], global_d.data() + padded[t], sizes[t] * sizeof(float)));
    REQUIRE(same_bytes(state_h.data() + packed[t], state_d.data() + padded[t], sizes[t] * sizeof(float)));
    REQUIRE(same_bytes(local[t].data(), local_d[t].data(), sizes[t] * sizeof(float)));
  }
}

// The selection on its own: a chunk whose kept set is known by hand.
template <class Codec>
std::vector<unsigned> device_positions(const std::vector<float>& delta) {
  const std::vector<std::size_t> sizes{delta.size()};
  const cp::block_layout layout(sizes, Codec::block, 1);
  std::vector<float> local(delta.size(), 0.0f), global = delta;
  std::vector<k::device_tensor> tensors{{local.data(), 0, 0}};
  std::vector<std::byte> pay(layout.block_count() * Codec::stride());
  std::vector<k::sums2> sums(layout.block_count());
  sim::run_teams(layout.block_count(), k::topk_encode_blocks<Codec>{layout.blocks(), tensors.data(), global.data(),
                                                                    nullptr, nullptr, pay.data(), 0, sums.data(),
                                                                    1.0f, false});
  std::vector<unsigned> out;
  for (std::size_t e = 0; e < Codec::entries(delta.size()); ++e) out.push_back(Codec::position(pay.data(), e));
  return out;
}

}  // namespace

TEST_CASE("chunk_topk device selection: the K largest magnitudes, ties to the lower index, NaN first") {
  using C = cp::chunk_topk_codec<16, 4, dc::int8, cp::round_nearest>;
  // |x|: 3 at 2, 9 at 5 and 12 (tie), 7 at 9 and -7 at 14 (tie), 1 elsewhere.
  std::vector<float> d(16, 1.0f);
  d[2] = 3.0f;
  d[5] = -9.0f;
  d[12] = 9.0f;
  d[9] = 7.0f;
  d[14] = -7.0f;
  CHECK(device_positions<C>(d) == std::vector<unsigned>{5, 9, 12, 14});
  d[9] = 2.0f;  // now 3 is the 4th: 2, 5, 12, 14
  CHECK(device_positions<C>(d) == std::vector<unsigned>{2, 5, 12, 14});
  std::vector<float> ties(16, -0.5f);  // all equal: the first K
  CHECK(device_positions<C>(ties) == std::vector<unsigned>{0, 1, 2, 3});
  ties[11] = std::numeric_limits<float>::quiet_NaN();
  CHECK(device_positions<C>(ties) == std::vector<unsigned>{0, 1, 2, 11});
  // Magnitudes that differ only in their lowest byte (the last radix pass).
  std::vector<float> close(16);
  for (std::size_t i = 0; i < 16; ++i) {
    std::uint32_t b = 0x3f800000u + static_cast<std::uint32_t>((i * 7) % 16);
    std::memcpy(&close[i], &b, 4);
  }
  // (i * 7) % 16 is largest for i = 9 (15), 2 (14), 11 (13), 4 (12).
  CHECK(device_positions<C>(close) == std::vector<unsigned>{2, 4, 9, 11});
  // A partial chunk of 3 elements keeps all 3.
  CHECK(device_positions<C>({0.0f, -1.0f, 2.0f}) == std::vector<unsigned>{0, 1, 2});
}

TEST_CASE("chunk_topk team programs give the host passes' bytes, norms, residuals and results") {
  compare_topk_passes<cp::chunk_topk_codec<4096, 64, dc::int2, cp::round_nearest>>({5000, 4096, 300, 1}, true, 0.95f, 3,
                                                                                  11);
  compare_topk_passes<cp::chunk_topk_codec<4096, 64, dc::int2, cp::round_nearest>>({4097, 2}, false, 1.0f, 1, 12);
  compare_topk_passes<cp::chunk_topk_codec<64, 8, dc::int4, cp::stochastic_rounding>>({1, 63, 64, 65, 200, 7}, true,
                                                                                      1.0f, 4, 13);
  compare_topk_passes<cp::chunk_topk_codec<100, 7, dc::fp8_e4m3, cp::round_nearest>>({250, 100, 99}, true, 0.9f, 2, 14);
  compare_topk_passes<cp::chunk_topk_codec<8, 3, dc::int8, cp::round_nearest>>({10, 8, 2, 1}, true, 1.0f, 3, 15);
  compare_topk_passes<cp::chunk_topk_codec<16, 16, dc::int2, cp::round_nearest>>({40, 16, 5}, true, 1.0f, 2, 16);
  compare_topk_passes<cp::chunk_topk_codec<1000, 64, dc::fp4_e3m0, cp::stochastic_rounding>>({2500, 1000, 999}, true,
                                                                                             0.95f, 3, 17);
  compare_topk_passes<cp::chunk_topk_codec<2048, 32, dc::fp8_e5m2, cp::round_nearest>>({3000, 2048, 1}, false, 1.0f, 2,
                                                                                      18);
  compare_topk_passes<cp::chunk_topk_codec<4096, 4096, dc::int8, cp::round_nearest>>({5000, 10, 3}, true, 1.0f, 2, 19);
}

TEST_CASE("chunk_topk team programs: a NaN chunk encodes as on the host (its amax is NaN, the round is refused)") {
  compare_topk_passes<cp::chunk_topk_codec<64, 8, dc::int2, cp::round_nearest>>({200, 64, 64}, true, 0.95f, 1, 21, true);
}

namespace {

// Awkward tensor sizes around the block sizes 128 (blockwise) and 64 (casts).
const std::vector<std::size_t> model_sizes = {1, 127, 129, 300, 64, 5};

float target(int m, std::size_t j) { return std::sin(static_cast<float>(7 * m + 1) + 0.37f * static_cast<float>(j)); }

// One replica in 64-byte aligned storage (optionally starting `misalign`
// floats in), seen as host or device tensors: tensor k is a matrix of
// sizes[k] / cols[k] rows when `cols` gives it more than one column, else
// a vector.
template <class Space>
struct replica {
  std::vector<std::size_t> sizes;
  std::vector<dc::host_buffer<float>> storage, grad_storage;
  std::vector<dc::matrix_view<float, Space>> params;
  std::vector<dc::tensor_view<float, Space>> grads;

  replica(int rank, const std::vector<std::size_t>& s, std::size_t misalign = 0,
          const std::vector<std::size_t>& cols = {})
      : sizes(s) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t c = k < cols.size() ? cols[k] : 1;
      storage.emplace_back(sizes[k] + misalign);
      grad_storage.emplace_back(sizes[k] + misalign);
      params.emplace_back(storage.back().data() + misalign, sizes[k] / c, c);
      grads.emplace_back(grad_storage.back().data() + misalign, sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i)
        params[k][i] = 0.1f * static_cast<float>(rank + 1) * static_cast<float>(i % 5);
    }
  }
  void compute_grads(int rank) {
    std::size_t j = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i, ++j) grads[k][i] = params[k][i] - target(rank, j);
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& p : params) out.insert(out.end(), p.data(), p.data() + p.size());
    return out;
  }
};

// What a rank put on the wire: every all-to-all and all-gather send buffer.
using wire_log = std::vector<std::vector<std::byte>>;

// The links below neither log nor damage the engine's position records
// (threads_link.hpp's position_record()).

// A host communicator over comm::threads that records what it sends,
// blocking or not (an overlapping schedule starts its collectives with the
// i-operations).
class recording_link : public threads_host_link {
 public:
  recording_link(dc::comm::threads& c, wire_log& log) : threads_host_link(c), log_(log) {}
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) {
    log_.emplace_back(s.begin(), s.end());
    threads().all_to_all(s, r);
  }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) {
    if (!position_record(s.size())) log_.emplace_back(s.begin(), s.end());
    threads().all_gather(s, r);
  }
  request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) {
    log_.emplace_back(s.begin(), s.end());
    return threads().iall_to_all(s, r);
  }
  request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) {
    log_.emplace_back(s.begin(), s.end());
    return threads().iall_gather(s, r);
  }

 private:
  wire_log& log_;
};

// The same over device views only (a device_communicator such as NCCL; in
// this program device memory is host memory).
class recording_device_link : public threads_device_link {
 public:
  recording_device_link(dc::comm::threads& c, wire_log& log) : threads_device_link(c), log_(log) {}
  void all_to_all(dc::device_view<const std::byte> s, dc::device_view<std::byte> r) {
    ++device_all_to_alls;
    log_.emplace_back(s.data(), s.data() + s.size());
    threads().all_to_all(span(s), span(r));
  }
  void all_gather(dc::device_view<const std::byte> s, dc::device_view<std::byte> r) {
    if (!position_record(s.size())) log_.emplace_back(s.data(), s.data() + s.size());
    threads().all_gather(span(s), span(r));
  }
  int device_all_to_alls = 0;

 private:
  wire_log& log_;
};
static_assert(dc::device_communicator<recording_device_link> && !dc::communicator<recording_device_link>);

struct run_result {
  std::vector<std::vector<float>> replicas, globals, residuals;  // [rank], per tensor packed
  std::vector<wire_log> wire;                                    // [rank]
  std::vector<dc::stats> stats;
};

template <class C, class Sync = dc::sync::blocking>
using options = dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov, C, Sync>;

template <class C, class Sync = dc::sync::blocking>
options<C, Sync> make_options(typename C::options copts = {}, typename Sync::options so = {},
                              std::size_t inner_steps = 2) {
  return {.inner_steps = inner_steps,
          .inner = {.lr = 0.05f, .weight_decay = 0.01f},
          .outer = {.lr = 0.7f, .momentum = 0.9f},
          .compress = copts,
          .sync = so};
}

enum class link_kind { host, device };

// How the parameters are shaped and when they are reduced, beyond train()'s
// defaults: vectors, sync::blocking every 2 steps.
template <class Sync = dc::sync::blocking>
struct run_shape {
  std::vector<std::size_t> cols{};  // per tensor, as replica takes them
  typename Sync::options sync{};
  std::size_t inner_steps = 2;
};

// `rounds` rounds (of H steps) on `m` workers with parameters in Space,
// through a recording communicator of the given kind, then finish().
template <class Space, class C, link_kind Link = link_kind::host, class Sync = dc::sync::blocking>
run_result train(int m, int rounds, const std::vector<std::size_t>& sizes, typename C::options copts = {},
                 std::size_t misalign = 0, const run_shape<Sync>& shape = {}) {
  run_result out;
  const auto mm = static_cast<std::size_t>(m);
  out.replicas.resize(mm);
  out.globals.resize(mm);
  out.residuals.resize(mm);
  out.wire.resize(mm);
  out.stats.resize(mm);
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& threads) {
    const int r = threads.rank();
    const auto ri = static_cast<std::size_t>(r);
    using link = std::conditional_t<Link == link_kind::host, recording_link, recording_device_link>;
    link comm(threads, out.wire[ri]);
    replica<Space> rep(r, sizes, misalign, shape.cols);
    const auto opts = make_options<C, Sync>(copts, shape.sync, shape.inner_steps);
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, C, link, Sync> t(rep.params, comm, opts);
    // The rounds' segments only: the start-up agreement's records name the
    // memory space (a per-rank field), so they differ between host and
    // device runs by design.
    out.wire[ri].clear();
    for (int s = 0; s < rounds * static_cast<int>(opts.inner_steps); ++s) {
      rep.compute_grads(r);
      t.step(rep.grads);
    }
    t.finish();
    const auto g = t.template global_parameters<Space>();
    const auto e = t.template compression_residual<Space>();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      out.globals[ri].insert(out.globals[ri].end(), g.data() + t.global_offset(k),
                             g.data() + t.global_offset(k) + sizes[k]);
      if (e.size())
        out.residuals[ri].insert(out.residuals[ri].end(), e.data() + t.global_offset(k),
                                 e.data() + t.global_offset(k) + sizes[k]);
    }
    out.replicas[ri] = rep.flat();
    out.stats[ri] = t.stats();
  });
  return out;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bytes(a.data(), b.data(), a.size() * sizeof(float));
}

// `rounds`: the reductions applied (a fragment's count under streaming).
// The workers' replicas agree at the end unless a schedule left local
// progress in them (streaming: the fragments synced before the last step).
void check_same_run(const run_result& host, const run_result& device, int m, int rounds,
                    bool replicas_agree = true) {
  for (int r = 0; r < m; ++r) {
    CAPTURE(r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(same(host.globals[i], device.globals[i]));
    CHECK(same(host.replicas[i], device.replicas[i]));
    CHECK(same(host.residuals[i], device.residuals[i]));
    if (replicas_agree) CHECK(same(device.replicas[i], device.replicas[0]));
    // Every segment of every round, headers (norms, checksums) included.
    // With one worker nothing travels: the device path copies its segments
    // on the device instead of calling the communicator.
    if (m == 1) {
      CHECK(device.wire[i].empty());
    } else {
      REQUIRE(host.wire[i].size() == device.wire[i].size());
      for (std::size_t c = 0; c < host.wire[i].size(); ++c) {
        CAPTURE(c);
        REQUIRE(host.wire[i][c].size() == device.wire[i][c].size());
        CHECK(same_bytes(host.wire[i][c].data(), device.wire[i][c].data(), host.wire[i][c].size()));
      }
    }
    const auto& hs = host.stats[i];
    const auto& ds = device.stats[i];
    CHECK(ds.rounds == static_cast<std::uint64_t>(rounds));
    CHECK(same_bytes(&hs.pseudo_gradient_norm, &ds.pseudo_gradient_norm, sizeof(double)));
    CHECK(same_bytes(&hs.compression_error_norm, &ds.compression_error_norm, sizeof(double)));
    CHECK(hs.encoded_bytes_per_parameter == ds.encoded_bytes_per_parameter);
    CHECK(hs.last_round_bytes_sent == ds.last_round_bytes_sent);
    CHECK(hs.bytes_received == ds.bytes_received);
  }
}

template <class C>
void compare_engines(int m, int rounds, const std::vector<std::size_t>& sizes = model_sizes,
                     typename C::options copts = {}) {
  CAPTURE(m);
  CAPTURE(C::name);
  CAPTURE(C::has_error_feedback);
  const auto host = train<dc::host_space, C>(m, rounds, sizes, copts);
  sim::team_launches = 0;
  sim::launches.reset();
  const auto device = train<dc::device_space, C>(m, rounds, sizes, copts);
  CHECK(sim::team_launches > 0);
  check_same_run(host, device, m, rounds);
  // The wire really carried data: one all-to-all and one all-gather per
  // round for M > 1, one all-gather for a sparse (gathered) codec (a world
  // of one copies on the device).
  if (m > 1) CHECK(device.wire[0].size() == static_cast<std::size_t>((cp::gathered_v<C> ? 1 : 2) * rounds));
}

}  // namespace

TEST_CASE("device compressed mean: the host engine's bits, M = 1, 2, 3, 4, int8 / int4 / bf16, with and without error feedback") {
  for (int m : {1, 2, 3, 4}) {
    compare_engines<cp::blockwise<dc::int8, 128>>(m, 3);
    compare_engines<cp::error_feedback<cp::blockwise<dc::int8, 128>>>(m, 3);
    compare_engines<cp::blockwise<dc::int4, 128>>(m, 3);
    compare_engines<cp::error_feedback<cp::blockwise<dc::int4, 128>>>(m, 3);
    compare_engines<cp::cast<dc::bf16>>(m, 3);
    compare_engines<cp::error_feedback<cp::cast<dc::bf16>>>(m, 3);
    compare_engines<cp::blockwise<dc::fp8_e4m3, 128>>(m, 3);
    compare_engines<cp::error_feedback<cp::blockwise<dc::fp4_e3m0, 64, cp::stochastic_rounding>>>(m, 3);
    compare_engines<cp::error_feedback<cp::blockwise<dc::int2, 128>>>(m, 3);
  }
}

TEST_CASE("device compressed mean: more workers than blocks (empty shards)") {
  compare_engines<cp::error_feedback<cp::blockwise<dc::int8, 128>>>(4, 2, {3});
  compare_engines<cp::cast<dc::bf16>>(3, 2, {64, 1});
}

TEST_CASE("device compressed mean: stochastic rounding draws the host's numbers (packed element indices)") {
  compare_engines<cp::error_feedback<cp::blockwise<dc::int4, 64, cp::stochastic_rounding>>>(3, 3, model_sizes,
                                                                                            {.seed = 99});
  compare_engines<cp::cast<dc::fp16, cp::stochastic_rounding>>(2, 2, model_sizes, {.seed = 7});
}

TEST_CASE("device compressed mean: shards of more than one reduction chunk sum their norms in the host's order") {
  // B = 8: 17501 blocks over 2 shards, each more than exec::host's
  // 8192-block chunk, so the norms' chunk partials are combined as on the
  // host.
  compare_engines<cp::error_feedback<cp::blockwise<dc::int8, 8>>>(2, 2, {140001, 3});
}

TEST_CASE("device compressed mean through a device communicator (device views, nothing staged)") {
  using C = cp::error_feedback<cp::blockwise<dc::int4, 128>>;
  const auto host = train<dc::host_space, C>(3, 2, model_sizes);
  const auto device = train<dc::device_space, C, link_kind::device>(3, 2, model_sizes);
  check_same_run(host, device, 3, 2);
}

TEST_CASE("device compressed mean over misaligned replicas: scalar accesses, same bits") {
  using C = cp::error_feedback<cp::blockwise<dc::int8, 128>>;
  const auto host = train<dc::host_space, C>(2, 2, model_sizes);
  const auto device = train<dc::device_space, C>(2, 2, model_sizes, {}, /*misalign=*/1);
  check_same_run(host, device, 2, 2);
}

TEST_CASE("device gathered mean (chunk_topk): the host engine's bits, M = 1, 2, 3, 4, with and without error feedback") {
  using sparse = cp::error_feedback<cp::chunk_topk<64, 8, dc::int2>>;
  for (int m : {1, 2, 3, 4}) {
    compare_engines<sparse>(m, 3, model_sizes, {.decay = 0.95f});
    compare_engines<cp::chunk_topk<>>(m, 2);
    compare_engines<cp::error_feedback<cp::chunk_topk<128, 16, dc::fp8_e4m3, cp::stochastic_rounding>>>(
        m, 3, model_sizes, {.seed = 5});
  }
  // Chunks of 4096 (16 elements per thread, 16-byte accesses) over tensors
  // that end inside chunks, on replicas that allow or forbid 16-byte
  // accesses.
  using sparse_loco = cp::error_feedback<cp::chunk_topk<4096, 64, dc::int2>>;
  compare_engines<sparse_loco>(3, 2, {5000, 4096, 17}, {.decay = 0.95f});
  const auto host = train<dc::host_space, sparse_loco>(2, 2, {5000, 300});
  const auto device = train<dc::device_space, sparse_loco>(2, 2, {5000, 300}, {}, /*misalign=*/1);
  check_same_run(host, device, 2, 2);
}

TEST_CASE("device gathered mean through a device communicator (device views, nothing staged)") {
  using C = cp::error_feedback<cp::chunk_topk<64, 8, dc::int4>>;
  const auto host = train<dc::host_space, C>(3, 2, model_sizes);
  const auto device = train<dc::device_space, C, link_kind::device>(3, 2, model_sizes);
  check_same_run(host, device, 3, 2);
}

// ---------------------------------------------------------------- low rank
namespace {

// Matrices with more rows than the orthonormalisation's 64 lanes and more
// elements than a norm chunk (150 x 40), a small one (24 x 16), one too
// small for rank 3 (3 x 2, sent whole), vectors, and tensor sizes that are
// not multiples of 16 (the device layout pads after them).
const std::vector<std::size_t> low_rank_sizes = {150 * 40, 16, 24 * 16, 5, 3 * 2};
const std::vector<std::size_t> low_rank_cols = {40, 1, 16, 1, 2};

// Returns the device run.
template <class Sync = dc::sync::blocking, link_kind Link = link_kind::host, class C = cp::low_rank>
run_result compare_low_rank(int m, int rounds, int applied, const run_shape<Sync>& shape_in = {},
                      typename C::options co = cp::low_rank::options{.rank = 3, .seed = 11}) {
  CAPTURE(m);
  run_shape<Sync> shape = shape_in;
  shape.cols = low_rank_cols;
  const auto host = train<dc::host_space, C, link_kind::host, Sync>(m, rounds, low_rank_sizes, co, 0, shape);
  sim::launches.reset();
  const auto device = train<dc::device_space, C, Link, Sync>(m, rounds, low_rank_sizes, co, 0, shape);
  CHECK(sim::launches.scalar > 0);
  constexpr bool fragments = std::is_same_v<Sync, dc::sync::streaming>;
  check_same_run(host, device, m, applied, !fragments);
  // Two all-gathers (P, then Q) per reduction; a world of one copies.
  if (m > 1) CHECK(device.wire[0].size() == static_cast<std::size_t>(2 * applied));
  // The factors did not travel whole: P and Q of the three matrices are
  // smaller than the matrices (the fallback's vectors aside).
  for (const auto& seg : device.wire[0]) CHECK(seg.size() < 4 * (150 * 40 + 24 * 16));
  // Error feedback held something back (rank 3 of a 150 x 40 matrix); with
  // fragments each has its own residual, which the algorithm does not show.
  double residual = 0.0;
  for (float e : device.residuals[0]) residual += static_cast<double>(e) * e;
  CHECK((fragments || residual > 0.0));
  return device;
}

}  // namespace

TEST_CASE("device low_rank: the host engine's bits (theta_global, replicas, residual, P and Q segments), M = 1, 2, 3") {
  for (int m : {1, 2, 3}) compare_low_rank(m, 3, 3);
}

TEST_CASE("device low_rank under overlapping schedules: the host engine's bits") {
  // one_step_delay: 3 rounds begin, the first two are applied at the next
  // round's end and finish() applies the third.
  SUBCASE("one_step_delay") {
    for (int m : {1, 2, 3}) compare_low_rank<dc::sync::one_step_delay>(m, 3, 3);
  }
  // streaming, P = 2 fragments of whole tensors (each its own factors and
  // Q), H = 4, tau = 1: 12 steps apply a fragment after steps 2, 4, 6, 8,
  // 10, 12.
  SUBCASE("streaming") {
    for (int m : {1, 2, 3})
      compare_low_rank<dc::sync::streaming>(m, 3, 6, {.sync = {.fragments = 2, .delay = 1}, .inner_steps = 4});
  }
}

TEST_CASE("device low_rank as an adaptive rung: rank 3 in the first round, int8 after it, the host engine's bits") {
  // A budget every rung fits: the rule moves to the most accurate rung
  // after round 1, and the residual moves from low_rank's to int8's.
  using ladder = cp::adaptive<cp::error_feedback<cp::blockwise<dc::int8, 16>>, cp::low_rank>;
  const ladder::options co{.codecs = {{}, {.rank = 3, .seed = 2}}, .rule = {.budget_seconds = 1e9, .start = 1}};
  for (int m : {2, 3}) {
    const auto device = compare_low_rank<dc::sync::blocking, link_kind::host, ladder>(m, 3, 3, {}, co);
    // Round 1's P and Q segments say low_rank (header byte 6), the later
    // rounds' int8 segments say blockwise int8.
    const auto codec = [&](std::size_t c) { return static_cast<cp::codec_id>(device.wire[0][c][6]); };
    REQUIRE(device.wire[0].size() == 6);
    CHECK(codec(0) == cp::codec_id::low_rank);
    CHECK(codec(1) == cp::codec_id::low_rank);
    for (std::size_t c = 2; c < 6; ++c) CHECK(codec(c) == cp::codec_id::int8);
  }
}

TEST_CASE("device low_rank through a device communicator (device views, nothing staged)") {
  compare_low_rank<dc::sync::blocking, link_kind::device>(3, 2, 2);
}

// --------------------------------------------------------------- rejection
namespace {

// A host communicator over comm::threads whose all-to-all (the compressed
// mean's first exchange; the all-gathers when `gathered`: the gathered
// mean's, low_rank's two) hands `victim` damaged bytes (fault injection on a
// real exchange) on the `call`-th of them after arm() (the start-up
// agreement also gathers): the second round's with one per round.
class flaky_link : public threads_host_link {
 public:
  using damage = void (*)(std::span<std::byte> slot_of_rank_1);
  flaky_link(dc::comm::threads& c, int victim, damage d, bool gathered, int call = 2)
      : threads_host_link(c), victim_(victim), damage_(d), gathered_(gathered), call_(call) {}
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) {
    threads().all_to_all(s, r);
    if (!gathered_) hit(r);
  }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) {
    threads().all_gather(s, r);
    if (gathered_ && !position_record(s.size())) hit(r);
  }
  void arm() { armed_ = true; }

 private:
  void hit(std::span<std::byte> r) {
    const std::size_t slot = r.size() / static_cast<std::size_t>(size());
    if (armed_ && ++calls_ == call_ && rank() == victim_) damage_(r.subspan(slot, slot));
  }
  int victim_;
  damage damage_;
  bool gathered_;
  int call_;
  bool armed_ = false;
  int calls_ = 0;
};

// One flipped payload bit: the checksum no longer matches.
void flip_a_bit(std::span<std::byte> seg) { seg[100] ^= std::byte{0x10}; }

// An int8 code of -128 (never written) in block 0, with the checksum
// recomputed: only the structure check can see it.
void forge_a_code(std::span<std::byte> seg) {
  seg[dc::wire::header_bytes + 4 + 5] = std::byte{0x80};
  const auto payload = dc::wire::detail::get<std::uint64_t>(seg.data() + 24);
  dc::wire::detail::put<std::uint64_t>(seg.data() + 48, dc::wire::detail::segment_checksum(seg.data(), payload));
}

// A chunk_topk position beyond the chunk (4095 in a tensor of 500) in
// chunk 0, with the checksum recomputed.
template <class Codec>
void forge_a_position(std::span<std::byte> seg) {
  seg[dc::wire::header_bytes + 4 + Codec::value_bytes] = std::byte{0xff};
  seg[dc::wire::header_bytes + 4 + Codec::value_bytes + 1] |= std::byte{0x0f};
  const auto payload = dc::wire::detail::get<std::uint64_t>(seg.data() + 24);
  dc::wire::detail::put<std::uint64_t>(seg.data() + 48, dc::wire::detail::segment_checksum(seg.data(), payload));
}

struct rejection {
  std::vector<std::string> what;  // [rank] the second round's error
  bool state_kept = true;         // theta_global, residual, replica as the rules say
  bool third_round_applied = true;
};

// Three rounds on 3 workers (one tensor of 500, a matrix of `cols` columns
// when cols > 1): the second is damaged on rank 2 (`damage`, in the
// `call`-th exchange after the first round's start) or carries a NaN from
// rank 1 (damage == nullptr).
template <class Space, class C = cp::error_feedback<cp::blockwise<dc::int8>>>
rejection reject_second_round(flaky_link::damage damage, std::size_t cols = 1, int call = 2) {
  constexpr int m = 3;
  rejection out;
  out.what.resize(m);
  std::mutex mu;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& inner) {
    const int r = inner.rank();
    flaky_link comm(inner, 2, damage ? damage : [](std::span<std::byte>) {},
                    cp::gathered_v<C> || cp::factored_compressor<C>, call);
    replica<Space> rep(r, {500}, 0, {cols});
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, C, flaky_link> t(rep.params, comm,
                                                                        {.inner_steps = 1, .inner = {.lr = 0.5f}});
    comm.arm();
    rep.compute_grads(r);
    t.step(rep.grads);
    const auto g = t.template global_parameters<Space>();
    const auto e = t.template compression_residual<Space>();
    const std::vector<float> g0(g.data(), g.data() + g.size()), e0(e.data(), e.data() + e.size());
    rep.compute_grads(r);
    t.inner_step(rep.grads);
    if (!damage && r == 1) rep.params[0][17] = std::numeric_limits<float>::quiet_NaN();
    std::string what;
    try {
      t.outer_round();
      what = "applied";
    } catch (const dc::error& err) {
      what = err.what();
    }
    bool kept = same(std::vector<float>(g.data(), g.data() + g.size()), g0) &&
                same(std::vector<float>(e.data(), e.data() + e.size()), e0) &&
                same(rep.flat(), std::vector<float>(g.data(), g.data() + 500));  // the replica reset to theta_global
    rep.compute_grads(r);
    const bool third = t.step(rep.grads);
    std::lock_guard lock(mu);
    out.what[static_cast<std::size_t>(r)] = what;
    out.state_kept = out.state_kept && kept;
    out.third_round_applied = out.third_round_applied && third;
  });
  return out;
}

// The second round was refused on every rank of both runs, the device's
// with the host's words down to the stored checksum a corrupt segment is
// reported with; rank 2 names `victim`, and with `damaged` bytes the others
// name rank 2's report. The state stayed as the rules say and the third
// round was applied.
void refused_alike(const rejection& host, const rejection& device, const char* victim, bool damaged) {
  CHECK(device.state_kept);
  CHECK(device.third_round_applied);
  CHECK(host.state_kept);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(device.what[i] == host.what[i]);
    CHECK(device.what[i].find("outer round 2 rejected") != std::string::npos);
  }
  CHECK(device.what[2].find(victim) != std::string::npos);
  if (damaged) CHECK(device.what[0].find("rank(s) 2 received corrupt compressed data") != std::string::npos);
}

}  // namespace

TEST_CASE("device compressed mean: a NaN, a corrupt byte, a forged code reject the round as on the host") {
  struct scenario {
    const char* name;
    flaky_link::damage damage;
    const char* victim;  // what rank 2 must say
  };
  for (const scenario s : {scenario{"nan", nullptr, "non-finite pseudo-gradient from rank 1 (norm nan: the pseudo-gradient holds NaN"},
                           scenario{"flipped bit", flip_a_bit, "checksum mismatch"},
                           scenario{"forged code", forge_a_code, "block 0: quantized value out of range"}}) {
    CAPTURE(s.name);
    refused_alike(reject_second_round<dc::host_space>(s.damage), reject_second_round<dc::device_space>(s.damage),
                  s.victim, s.damage != nullptr);
  }
}

TEST_CASE("device gathered mean: a NaN, a corrupt byte, a forged position reject the round as on the host") {
  using C = cp::error_feedback<cp::chunk_topk<>>;
  struct scenario {
    const char* name;
    flaky_link::damage damage;
    const char* victim;
  };
  for (const scenario s :
       {scenario{"nan", nullptr, "non-finite pseudo-gradient from rank 1 (norm nan: the pseudo-gradient holds NaN"},
        scenario{"flipped bit", flip_a_bit, "checksum mismatch"},
        scenario{"forged position", forge_a_position<C::codec>, "chunk_topk position beyond its chunk"}}) {
    CAPTURE(s.name);
    refused_alike(reject_second_round<dc::host_space, C>(s.damage), reject_second_round<dc::device_space, C>(s.damage),
                  s.victim, s.damage != nullptr);
  }
}

TEST_CASE("device low_rank: a NaN, a corrupt P or Q segment reject the round on every rank as on the host") {
  // 25 x 20 at rank 4; two all-gathers per round: the second round's P is
  // the third after the first round began, its Q the fourth.
  struct scenario {
    const char* name;
    flaky_link::damage damage;
    int call;
    const char* victim;
  };
  for (const scenario s :
       {scenario{"nan", nullptr, 0, "non-finite pseudo-gradient from rank 1 (norm nan: the pseudo-gradient holds NaN"},
        scenario{"flipped bit in P", flip_a_bit, 3, "low-rank round 2, P segment from rank 1 on rank 2: checksum mismatch"},
        scenario{"flipped bit in Q", flip_a_bit, 4, "low-rank round 2, Q segment from rank 1 on rank 2: checksum mismatch"}}) {
    CAPTURE(s.name);
    refused_alike(reject_second_round<dc::host_space, cp::low_rank>(s.damage, 20, s.call),
                  reject_second_round<dc::device_space, cp::low_rank>(s.damage, 20, s.call), s.victim,
                  s.damage != nullptr);
  }
}

TEST_CASE("topk has no device form: a compile-time error names what to use (see compile_fail_device_topk)") {
  CHECK_FALSE(k::codec_elements<cp::topk_codec<64>>::supported);
  CHECK(k::codec_elements<cp::blockwise_codec<dc::int4, 64, cp::round_nearest>>::supported);
  CHECK(k::codec_elements<cp::cast_codec<dc::bf16, cp::round_nearest>>::supported);
}

namespace {

template <class C>
void mixed_workers(const std::vector<std::size_t>& sizes = model_sizes, const std::vector<std::size_t>& cols = {},
                   typename C::options copts = {}) {
  CAPTURE(C::name);
  constexpr int m = 3, rounds = 2;
  const auto host = train<dc::host_space, C>(m, rounds, sizes, copts, 0, {.cols = cols});
  std::vector<std::vector<float>> mixed(m);
  std::vector<wire_log> logs(m);
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& threads) {
    const int r = threads.rank();
    recording_link comm(threads, logs[static_cast<std::size_t>(r)]);
    auto run = [&](auto rep) {
      dc::algorithm<dc::inner::adamw, dc::outer::nesterov, C, recording_link> t(rep.params, comm,
                                                                                make_options<C>(copts));
      logs[static_cast<std::size_t>(r)].clear();  // the rounds' segments only, as train() records
      for (int s = 0; s < rounds * 2; ++s) {
        rep.compute_grads(r);
        t.step(rep.grads);
      }
      mixed[static_cast<std::size_t>(r)] = rep.flat();
    };
    if (r == 1)
      run(replica<dc::host_space>(r, sizes, 0, cols));
    else
      run(replica<dc::device_space>(r, sizes, 0, cols));
  });
  for (std::size_t r = 0; r < m; ++r) {
    CAPTURE(r);
    CHECK(same(mixed[r], host.replicas[r]));
    REQUIRE(logs[r].size() == host.wire[r].size());
    for (std::size_t c = 0; c < logs[r].size(); ++c) CHECK(logs[r][c] == host.wire[r][c]);
  }
}

}  // namespace

TEST_CASE("host and device workers share compressed rounds: the same segments, the all-host run's bits") {
  mixed_workers<cp::error_feedback<cp::blockwise<dc::int4, 128>>>();
  mixed_workers<cp::error_feedback<cp::chunk_topk<64, 8, dc::int2>>>();
  mixed_workers<cp::low_rank>(low_rank_sizes, low_rank_cols, {.rank = 3, .seed = 4});
}

// Issue 17 item 7: the block passes load the library's flat buffers 16 bytes
// at a time; where those are handed to a device round a misaligned one is a
// state_error naming it, not a fault inside a kernel.
TEST_CASE("device compressed round: a flat buffer that is not 16-byte aligned is refused by name") {
  alignas(16) float flat[8] = {};
  namespace dd = dc::compress::device_detail;
  CHECK_NOTHROW(dd::require_aligned16(flat, "theta_global"));
  CHECK_NOTHROW(dd::require_aligned16(nullptr, "the outer state"));
  CHECK_THROWS_WITH_AS(dd::require_aligned16(flat + 1, "theta_global"),
                       doctest::Contains("theta_global (address"), dc::state_error);
  std::vector<std::vector<float>> tensors = {std::vector<float>(5), std::vector<float>(3)};
  const dc::parameter_set<float, dc::device_space> padded(tensors);  // offsets padded to 16 floats
  CHECK_NOTHROW(dd::require_aligned_offsets(padded));
  const dc::parameter_set<float, dc::host_space> packed(tensors);  // tensor 1 at offset 5
  CHECK_THROWS_WITH_AS(dd::require_aligned_offsets(packed), doctest::Contains("tensor 1 starts at flat offset 5"),
                       dc::state_error);
}
