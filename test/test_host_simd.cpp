// SPDX-License-Identifier: Apache-2.0
// The hand-vectorised host passes (kernels/host_simd.hpp) against the
// portable code they stand in for: the compressed round's encode
// (encode_pseudo_gradient) and shard reduction (reduce_shard) with the
// block codecs (int8, int4, int2, fp8 e4m3 and e5m2, fp4 e3m0) must give
// the same payload bytes, residual bits and
// norm bits for every block, on random layouts and on the blocks that take
// the special paths (zero, tiny, huge, infinite, NaN, ties). The portable
// code is in turn checked against hand-computed codes in
// test_compress_codecs.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/kernels/compressed_passes.hpp>
#include <limits>
#include <random>
#include <vector>

#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
namespace dk = diloco::kernels;

namespace {

std::uint64_t bits_of(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}

#if defined(DILOCO_HOST_SIMD_X86)
// Calls form(path) for each vector form of a block pass this CPU runs (0:
// AVX2; 1: AVX-512, where host_simd::avx512()); it returns whether that
// form took the block (checking its output where it did). The forms must
// take the same blocks; returns 1 where they took it, else 0.
template <class Form>
std::size_t each_vector_form(Form&& form) {
  int took[2] = {-1, -1};
  for (int path = 0; path < 2; ++path) {
    if (path == 1 && !dk::host_simd::avx512()) continue;
    CAPTURE(path);
    took[path] = form(path) ? 1 : 0;
  }
  if (took[1] >= 0) REQUIRE(took[0] == took[1]);
  return static_cast<std::size_t>(took[0]);
}
#endif

// Whether the hand-vectorised passes run in this build on this CPU; the
// tests say so when they cannot (they then compare the portable code with
// itself, which proves nothing, so they are skipped).
bool simd_runs() {
#if defined(DILOCO_HOST_SIMD_X86)
  return dk::host_simd::enabled();
#else
  return false;
#endif
}

// Tensors of the given sizes with values over many binades, then the
// blocks that take the special paths written over some of them: all zeros,
// magnitudes so small that amax / L is subnormal, magnitudes near FLT_MAX, an
// infinity, a NaN, and a block whose values land exactly halfway between
// grid points (ties to even: with amax = L every value is its own y).
struct inputs {
  std::vector<std::size_t> sizes, offsets;
  std::vector<float> global, residual;
  std::vector<std::vector<float>> local;  // one vector per tensor, the replica
  std::vector<float*> ptrs;
};

inputs make_inputs(const std::vector<std::size_t>& sizes, std::size_t block, float levels, unsigned seed) {
  inputs in;
  in.sizes = sizes;
  std::size_t total = 0;
  for (std::size_t s : sizes) {
    in.offsets.push_back(total);
    total += s;
  }
  in.global = random_values(total, seed, -12.0f, 4.0f);
  in.residual = random_values(total, seed + 1, -16.0f, -4.0f);
  std::mt19937 rng(seed + 2);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    in.local.push_back(random_values(sizes[k], seed + 3 + static_cast<unsigned>(k), -12.0f, 4.0f));
    // Special blocks, where the tensor has whole blocks to spare.
    const std::size_t whole = sizes[k] / block;
    for (std::size_t b = 0; b < whole; ++b) {
      float* l = in.local[k].data() + b * block;
      float* g = in.global.data() + in.offsets[k] + b * block;
      float* e = in.residual.data() + in.offsets[k] + b * block;
      switch (rng() % 10) {
        case 0:  // zero pseudo-gradient and residual
          for (std::size_t j = 0; j < block; ++j) l[j] = g[j], e[j] = 0.0f;
          break;
        case 1:  // tiny: amax / L subnormal
          for (std::size_t j = 0; j < block; ++j) g[j] = 0.0f, l[j] = 1e-39f * static_cast<float>(j % 7), e[j] = 0.0f;
          break;
        case 2:  // huge
          for (std::size_t j = 0; j < block; ++j) g[j] = 3e38f * std::sin(static_cast<float>(j)), l[j] = 0.0f, e[j] = 0.0f;
          break;
        case 3:  // one infinity
          l[block / 3] = std::numeric_limits<float>::infinity();
          break;
        case 4:  // one NaN
          e[block / 2] = std::numeric_limits<float>::quiet_NaN();
          break;
        case 5:  // ties: amax = L, values k + 0.5
          for (std::size_t j = 0; j < block; ++j) {
            g[j] = j == 0 ? levels : static_cast<float>(static_cast<int>(j % 13) - 6) + 0.5f;
            l[j] = 0.0f;
            e[j] = 0.0f;
          }
          break;
        default:
          break;
      }
    }
  }
  for (auto& l : in.local) in.ptrs.push_back(l.data());
  return in;
}

// Encodes every block both ways and compares payload bytes, new residual
// bits and the sums' bits; returns how many whole blocks the
// hand-vectorised routine took (it says false for the special ones).
template <class Codec>
std::size_t check_encode(const inputs& in, const cp::block_layout& layout, bool error_feedback, float decay) {
  const Codec c{};
  const std::size_t stride = c.stride();
  const std::size_t total = in.global.size();
  std::vector<std::byte> fast(layout.block_count() * stride, std::byte{0x5a}), slow(fast.size(), std::byte{0xa5});
  std::vector<float> next_fast(total, -1.0f), next_slow(total, -2.0f);
  auto pass = [&](std::vector<std::byte>& payload, std::vector<float>& next) {
    return dk::encode_pseudo_gradient<Codec>{c,
                                             layout.blocks(),
                                             {in.ptrs.data(), in.offsets.data()},
                                             in.global.data(),
                                             error_feedback ? in.residual.data() : nullptr,
                                             error_feedback ? next.data() : nullptr,
                                             payload.data(),
                                             stride,
                                             7,
                                             decay};
  };
  const auto f = pass(fast, next_fast);
  const auto s = pass(slow, next_slow);
  std::size_t taken = 0;
  for (std::size_t b = 0; b < layout.block_count(); ++b) {
    const dk::sums2 a = f(b), p = s.portable(b);
    CAPTURE(b);
    REQUIRE(bits_of(a.a) == bits_of(p.a));
    REQUIRE(bits_of(a.b) == bits_of(p.b));
#if defined(DILOCO_HOST_SIMD_X86)
    // Each vector form this CPU runs, called directly: where it takes the
    // block, the portable code's bytes, residual bits and sums; the AVX2
    // and AVX-512 forms take the same blocks.
    const cp::block_ref blk = layout.blocks()[b];
    if (blk.len == Codec::block) {
      const std::size_t off = in.offsets[blk.tensor] + blk.start;
      using format = typename dk::host_simd::supports<Codec>::format;
      constexpr std::size_t L = dk::norm_lanes(Codec::block);
      taken += each_vector_form([&](int path) {
        std::vector<std::byte> scratch(stride, std::byte{0x11});
        std::vector<float> scratch_next(Codec::block, -3.0f);
        double x = -1.0, y = -1.0;
        const float* e = error_feedback ? in.residual.data() + off : nullptr;
        float* nx = error_feedback ? scratch_next.data() : nullptr;
        const bool ok =
            path == 0 ? dk::host_simd::encode_block<format, Codec::block, L>(in.global.data() + off,
                                                                            in.ptrs[blk.tensor] + blk.start, e, nx,
                                                                            decay, scratch.data(), x, y)
                      : dk::host_simd::encode_block_avx512<format, Codec::block, L>(
                            in.global.data() + off, in.ptrs[blk.tensor] + blk.start, e, nx, decay, scratch.data(), x, y);
        if (!ok) return false;
        REQUIRE(std::memcmp(scratch.data(), slow.data() + b * stride, stride) == 0);
        REQUIRE(bits_of(x) == bits_of(p.a));
        REQUIRE(bits_of(y) == bits_of(p.b));
        if (error_feedback)
          REQUIRE(std::memcmp(scratch_next.data(), next_slow.data() + off, Codec::block * sizeof(float)) == 0);
        return true;
      });
    }
#endif
  }
  CHECK(std::memcmp(fast.data(), slow.data(), fast.size()) == 0);
  if (error_feedback) CHECK(std::memcmp(next_fast.data(), next_slow.data(), total * sizeof(float)) == 0);
  return taken;
}

// M ranks' encodings of one shard over `layout` (portable encodes of
// independent inputs, with the special blocks).
template <class Codec>
std::vector<std::vector<std::byte>> encodings(const std::vector<std::size_t>& sizes, const cp::block_layout& layout,
                                              int world, unsigned seed) {
  const Codec c{};
  const std::size_t stride = c.stride();
  std::vector<std::vector<std::byte>> payloads;
  for (int k = 0; k < world; ++k) {
    const inputs in = make_inputs(sizes, Codec::block, Codec::levels, seed + 100 * static_cast<unsigned>(k));
    std::vector<std::byte> p(layout.block_count() * stride);
    std::vector<float> next(in.global.size());
    const dk::encode_pseudo_gradient<Codec> enc{c, layout.blocks(), {in.ptrs.data(), in.offsets.data()},
                                                in.global.data(), in.residual.data(), next.data(), p.data(), stride, 3};
    for (std::size_t b = 0; b < layout.block_count(); ++b) enc.portable(b);
    payloads.push_back(std::move(p));
  }
  return payloads;
}

// M ranks' encodings of one shard (encodings()), reduced both ways.
template <class Codec>
std::size_t check_reduce(const std::vector<std::size_t>& sizes, int world, unsigned seed) {
  const Codec c{};
  const std::size_t stride = c.stride();
  const cp::block_layout layout(sizes, Codec::block, 1);  // one shard: every block
  std::vector<std::vector<std::byte>> payloads = encodings<Codec>(sizes, layout, world, seed);
  // A block of exact zeros with a zero factor from rank 0 (a frozen layer),
  // and one with a zero factor but non-zero codes: (q * 0) / L keeps q's sign.
  if (layout.block_count() > 2 && layout.blocks()[1].len == Codec::block) {
    std::memset(payloads[0].data() + stride, 0, stride);
    std::memset(payloads[0].data() + 2 * stride, 0, 4);
  }
  std::vector<const std::byte*> received;
  for (const auto& p : payloads) received.push_back(p.data());
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (std::size_t s : sizes) offsets.push_back(total), total += s;
  std::vector<std::byte> fast(layout.block_count() * stride, std::byte{0x5a}), slow(fast.size(), std::byte{0xa5});
  const dk::reduce_shard<Codec> f{c, layout.blocks(), offsets.data(), received.data(), world, fast.data(), stride, 5};
  const dk::reduce_shard<Codec> s{c, layout.blocks(), offsets.data(), received.data(), world, slow.data(), stride, 5};
  std::size_t taken = 0;
  for (std::size_t b = 0; b < layout.block_count(); ++b) {
    CAPTURE(b);
    REQUIRE(bits_of(f(b)) == bits_of(s.portable(b)));
#if defined(DILOCO_HOST_SIMD_X86)
    // Each vector form this CPU runs, called directly (as encode's above).
    if (layout.blocks()[b].len == Codec::block) {
      std::vector<const std::byte*> in;
      for (int k = 0; k < world; ++k) in.push_back(received[static_cast<std::size_t>(k)] + b * stride);
      using format = typename dk::host_simd::supports<Codec>::format;
      constexpr std::size_t L = dk::norm_lanes(Codec::block);
      taken += each_vector_form([&](int path) {
        std::vector<std::byte> scratch(stride, std::byte{0x11});
        double x = -1.0;
        const bool ok = path == 0 ? dk::host_simd::reduce_block<format, Codec::block, L>(in.data(), world,
                                                                                         scratch.data(), x)
                                  : dk::host_simd::reduce_blocks_avx512<format, Codec::block, L, 1>(
                                        in.data(), 0, world, 1u, scratch.data(), &x) != 0u;
        if (!ok) return false;
        REQUIRE(std::memcmp(scratch.data(), slow.data() + b * stride, stride) == 0);
        REQUIRE(bits_of(x) == bits_of(s.portable(b)));
        return true;
      });
    }
#endif
  }
  CHECK(std::memcmp(fast.data(), slow.data(), fast.size()) == 0);
  return taken;
}

// The shard reduction over runs of blocks (reduce_shard::batch, which
// exec::host's sums call 8 blocks at a time, and with AVX2
// host_simd::reduce_blocks): on tensors of 13.5, 5, 3 blocks and 7 elements
// and 1 block (odd counts, partial blocks between whole ones), with the
// random special blocks and, in tensor 0, planted ones that must leave the
// common path inside a run: block 3 with a tiny received factor (rank M -
// 1), 5 with an infinite one and 6 with a NaN one (rank 0), and for M >= 2
// block 9 whose ranks cancel to a mean whose scale is subnormal, beside
// block 10 whose ranks cancel exactly (a zero mean, which stays on it).
// Every run [b, b + n), n = 1..8, from every block: payload bytes (the
// whole output, so nothing is written outside the run) and norm bits equal
// the portable code's, block by block; and the executor's sum over the
// shard equals its sum of the portable norms.
template <class Codec>
void check_runs(int world) {
  const unsigned seed = 41;
  const Codec c{};
  const std::size_t stride = c.stride();
  constexpr std::size_t B = Codec::block;
  const std::vector<std::size_t> sizes{13 * B + B / 2, 5 * B, 3 * B + 7, B};
  const cp::block_layout layout(sizes, B, 1);
  REQUIRE(layout.block_count() == 24);
  std::vector<std::vector<std::byte>> payloads = encodings<Codec>(sizes, layout, world, seed);
  auto put = [&](int rank, std::size_t b, const std::vector<float>& v) {
    std::vector<float> dq(B);
    c.encode(v.data(), B, payloads[static_cast<std::size_t>(rank)].data() + b * stride, dq.data(), 3, 0);
  };
  auto factor = [&](int rank, std::size_t b, float amax) {
    std::memcpy(payloads[static_cast<std::size_t>(rank)].data() + b * stride, &amax, 4);
  };
  // Blocks 3..10 of tensor 0 ordinary for every rank, then the planted ones.
  for (int k = 0; k < world; ++k)
    for (std::size_t b = 3; b <= 10; ++b)
      put(k, b, random_values(B, seed + 7 * static_cast<unsigned>(k) + static_cast<unsigned>(b), -12.0f, 4.0f));
  std::vector<float> tiny(B), v(B), minus(B), zero(B, 0.0f);
  for (std::size_t j = 0; j < B; ++j) {
    tiny[j] = 1e-39f * static_cast<float>(j % 5 + 1);  // amax / L subnormal
    v[j] = 1e-33f * std::sin(static_cast<float>(j) + 0.5f);
  }
  v[0] = 1e-33f;  // amax 1e-33: every format's scale normal
  for (std::size_t j = 0; j < B; ++j) minus[j] = -v[j];  // the negated codes (every grid is symmetric)
  put(world - 1, 3, tiny);
  factor(0, 5, std::numeric_limits<float>::infinity());
  factor(0, 6, std::numeric_limits<float>::quiet_NaN());
  if (world >= 2) {
    for (int k = 0; k < world; ++k) {
      put(k, 9, k == 0 ? v : k == 1 ? minus : zero);
      put(k, 10, k == 0 ? v : k == 1 ? minus : zero);
    }
    // Block 9: rank 1's factor 1e-6 larger, so the sum is q * (s0 - s1),
    // about 1e-39 at most: the mean's amax / L subnormal.
    factor(1, 9, 1e-33f * (1.0f + 1e-6f));
  }
  std::vector<const std::byte*> received;
  for (const auto& p : payloads) received.push_back(p.data());
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (std::size_t n : sizes) offsets.push_back(total), total += n;
  std::vector<std::byte> fast(layout.block_count() * stride), slow(fast.size());
  const dk::reduce_shard<Codec> f{c, layout.blocks(), offsets.data(), received.data(), world, fast.data(), stride, 5};
  const dk::reduce_shard<Codec> s{c, layout.blocks(), offsets.data(), received.data(), world, slow.data(), stride, 5};
#if defined(DILOCO_HOST_SIMD_X86)
  // The planted blocks leave the common path, the others of the run stay on it.
  if (dk::host_simd::enabled() && world >= 2) {
    double norms[8];
    std::vector<const std::byte*> in;
    for (int k = 0; k < world; ++k) in.push_back(received[static_cast<std::size_t>(k)] + 3 * stride);
    using format = typename dk::host_simd::supports<Codec>::format;
    const unsigned done = dk::host_simd::reduce_blocks<format, B, dk::norm_lanes(B), 8>(
        in.data(), stride, world, 0xffu, fast.data() + 3 * stride, norms);
    CHECK(done == (0xffu & ~(1u << 0 | 1u << 2 | 1u << 3 | 1u << 6)));  // blocks 3, 5, 6, 9
    if (dk::host_simd::avx512()) {
      const unsigned wide = dk::host_simd::reduce_blocks_avx512<format, B, dk::norm_lanes(B), 8>(
          in.data(), stride, world, 0xffu, fast.data() + 3 * stride, norms);
      CHECK(wide == done);
    }
  }
#endif
  const std::size_t blocks = layout.block_count();
  for (std::size_t b = 0; b < blocks; ++b)
    for (std::size_t n = 1; n <= 8 && b + n <= blocks; ++n) {
      CAPTURE(b);
      CAPTURE(n);
      std::fill(fast.begin(), fast.end(), std::byte{0x5a});
      std::fill(slow.begin(), slow.end(), std::byte{0x5a});
      double got[8];
      f.batch(b, n, got);
      for (std::size_t j = 0; j < n; ++j) {
        CAPTURE(j);
        REQUIRE(bits_of(got[j]) == bits_of(s.portable(b + j)));
      }
      REQUIRE(std::memcmp(fast.data(), slow.data(), fast.size()) == 0);
    }
  struct portable_only {
    dk::reduce_shard<Codec> pass;
    double operator()(std::size_t b) const { return pass.portable(b); }
  };
  dc::exec::host ex(1);
  CHECK(bits_of(ex.transform_reduce(blocks, f)) == bits_of(ex.transform_reduce(blocks, portable_only{s})));
  CHECK(std::memcmp(fast.data(), slow.data(), fast.size()) == 0);
}

std::vector<std::size_t> random_sizes(std::size_t count, std::size_t max, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < count; ++i) sizes.push_back(rng() % (max + 1));
  sizes.push_back(0);
  sizes.push_back(1);
  return sizes;
}

template <class Codec>
void check_codec(std::size_t tensors, std::size_t max_size) {
  const auto sizes = random_sizes(tensors, max_size, 11);
  const cp::block_layout layout(sizes, Codec::block, 3);
  std::size_t whole = 0;
  for (std::size_t b = 0; b < layout.block_count(); ++b) whole += layout.blocks()[b].len == Codec::block;
  REQUIRE(whole > 20);
  for (const bool ef : {true, false})
    for (const float decay : {1.0f, 0.9f}) {
      CAPTURE(ef);
      CAPTURE(decay);
      const inputs in = make_inputs(sizes, Codec::block, Codec::levels, 21);
      const std::size_t taken = check_encode<Codec>(in, layout, ef, decay);
      // Most whole blocks take the vectorised path; the infinite, NaN and
      // tiny ones do not.
      CHECK(taken > whole / 2);
      CHECK(taken < whole);
    }
  for (const int world : {1, 2, 3, 4, 7, 8}) {
    CAPTURE(world);
    const std::size_t taken = check_reduce<Codec>(sizes, world, 31);
    CHECK(taken > 0);
  }
}

}  // namespace

// Where the passes do not run, doctest reports the case as skipped (its
// summary counts it), not as passed.
TEST_CASE("host SIMD encode and reduce equal the portable passes bit for bit" * doctest::skip(!simd_runs())) {
  if (!simd_runs()) {  // --no-skip
    FAIL("the hand-vectorised passes do not run here (no x86-64 AVX2, or DILOCO_HOST_SIMD=0)");
  }
#if defined(DILOCO_HOST_SIMD_X86)
  // The AVX2 forms are compared on every CPU with AVX2; the AVX-512 ones
  // (host_simd512.hpp) only where it runs them, which the log says.
  if (!dk::host_simd::avx512()) MESSAGE("no AVX-512 here (or DILOCO_HOST_SIMD=avx2): its forms are not compared");
#endif
  SUBCASE("int8, B = 128") { check_codec<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>(40, 1500); }
  SUBCASE("int4, B = 128") { check_codec<cp::blockwise_codec<dc::int4, 128, cp::round_nearest>>(40, 1500); }
  SUBCASE("int8, B = 32") { check_codec<cp::blockwise_codec<dc::int8, 32, cp::round_nearest>>(30, 400); }
  SUBCASE("int4, B = 64") { check_codec<cp::blockwise_codec<dc::int4, 64, cp::round_nearest>>(30, 700); }
  // 32 norm lanes: four registers of lanes and the tree across them.
  SUBCASE("int8, B = 1024") { check_codec<cp::blockwise_codec<dc::int8, 1024, cp::round_nearest>>(12, 9000); }
  SUBCASE("int4, B = 4096") { check_codec<cp::blockwise_codec<dc::int4, 4096, cp::round_nearest>>(8, 40000); }
  // The other formats share the passes' lanes and tree (checked above at
  // every width); their own element operations are checked at every code
  // in test_codec_fast_paths, so smaller layouts do here.
  SUBCASE("fp8 e4m3, B = 128") { check_codec<cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>>(20, 1500); }
  SUBCASE("fp8 e5m2, B = 128") { check_codec<cp::blockwise_codec<dc::fp8_e5m2, 128, cp::round_nearest>>(20, 1500); }
  SUBCASE("fp4 e3m0, B = 128") { check_codec<cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>>(20, 1500); }
  SUBCASE("int2, B = 128") { check_codec<cp::blockwise_codec<dc::int2, 128, cp::round_nearest>>(20, 1500); }
  SUBCASE("fp8 e4m3, B = 32") { check_codec<cp::blockwise_codec<dc::fp8_e4m3, 32, cp::round_nearest>>(30, 400); }
  SUBCASE("int2, B = 1024") { check_codec<cp::blockwise_codec<dc::int2, 1024, cp::round_nearest>>(8, 9000); }
}

// Runs with AVX2 or without (DILOCO_HOST_SIMD=0: batch() is then
// operator() block by block, which the test checks all the same).
TEST_CASE("the shard reduction over runs of blocks equals the portable code block by block") {
  auto worlds = [](auto run) {
    for (const int world : {1, 2, 3, 4}) {
      CAPTURE(world);
      run(world);
    }
  };
  SUBCASE("int8, B = 128") { worlds(check_runs<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>); }
  SUBCASE("int4, B = 128") { worlds(check_runs<cp::blockwise_codec<dc::int4, 128, cp::round_nearest>>); }
  SUBCASE("fp8 e4m3, B = 128") { worlds(check_runs<cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>>); }
  SUBCASE("fp8 e5m2, B = 32") { worlds(check_runs<cp::blockwise_codec<dc::fp8_e5m2, 32, cp::round_nearest>>); }
  SUBCASE("fp4 e3m0, B = 128") { worlds(check_runs<cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>>); }
  SUBCASE("int2, B = 128") { worlds(check_runs<cp::blockwise_codec<dc::int2, 128, cp::round_nearest>>); }
  // Runs of 4 blocks (run_blocks), two to a call of 8.
  SUBCASE("int8, B = 256") { worlds(check_runs<cp::blockwise_codec<dc::int8, 256, cp::round_nearest>>); }
}

TEST_CASE("host SIMD passes take the codecs they claim and no others") {
  using namespace dk::host_simd;
  CHECK(supports<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>::value);
  CHECK(supports<cp::blockwise_codec<dc::int4, 64, cp::round_nearest>>::value);
  CHECK_FALSE(supports<cp::blockwise_codec<dc::int8, 16, cp::round_nearest>>::value);  // not whole 32-steps
  CHECK_FALSE(supports<cp::blockwise_codec<dc::int4, 128, cp::stochastic_rounding>>::value);
  CHECK(supports<cp::blockwise_codec<dc::int2, 128, cp::round_nearest>>::value);
  CHECK(supports<cp::blockwise_codec<dc::fp8_e4m3, 128, cp::round_nearest>>::value);
  CHECK(supports<cp::blockwise_codec<dc::fp8_e5m2, 64, cp::round_nearest>>::value);
  CHECK(supports<cp::blockwise_codec<dc::fp4_e3m0, 128, cp::round_nearest>>::value);
  CHECK_FALSE(supports<cp::blockwise_codec<dc::fp8_e4m3, 40, cp::round_nearest>>::value);  // not whole 32-steps
  CHECK_FALSE(supports<cp::blockwise_codec<dc::int2, 128, cp::stochastic_rounding>>::value);
}

// The vector roundings (host_simd's grid_round and the small floats'
// round8 and codes8, and their AVX-512 twins) take |y| unclamped, where the
// portable code clamps it to L: on a block on the common path y = x * inv
// with inv = L / amax rounded once and |x| <= amax, so the largest |y| is
// that of x = amax (rounding is monotone), and that must be L or one of its
// two neighbours, which every grid rounds to L (test_codec_fast_paths
// checks the roundings on inputs up to L's upper neighbour against the
// grids' definitions). Checked here for every amax of the binade [1, 2)
// (2^23 values, L / amax and amax * inv each rounded to float as the passes
// round them). For every finite amax the common path takes, L / amax and
// the product stay normal (L >= 3 keeps the quotient above 2^-126 for every
// finite amax; a quotient that overflows, or a subnormal scale, leaves the
// path), so both only shift their exponents with amax's, and this binade
// stands for every one.
TEST_CASE("the roundings need no clamp: amax * (L / amax) is L or a neighbour of L") {
  for (const float levels : {dc::int8::levels, dc::int4::levels, dc::fp8_e4m3::levels, dc::fp8_e5m2::levels,
                             dc::fp4_e3m0::levels}) {
    CAPTURE(levels);
    const float below = std::nextafter(levels, 0.0f), above_l = std::nextafter(levels, 1e30f);
    std::uint32_t outside = 0, above = 0, first_outside = 0;
    for (std::uint32_t m = 0; m < (1u << 23); ++m) {
      const std::uint32_t bits = 0x3f800000u | m;  // 1 + m 2^-23
      float amax;
      std::memcpy(&amax, &bits, 4);
      volatile float inv = levels / amax;  // rounded to float, as scale_of's
      const volatile float y = amax * inv;  // rounded to float, as the passes' multiply
      if (y > levels) ++above;
      if ((y < below || y > above_l) && outside++ == 0) first_outside = bits;
    }
    CAPTURE(first_outside);
    CHECK(outside == 0);
    // The case a clamp would have acted on: y past L (for some L only).
    if (levels == dc::int8::levels || levels == dc::int4::levels) CHECK(above > 0);
  }
}
