// SPDX-License-Identifier: Apache-2.0
// chunk_topk's encode pass (kernels/compressed_passes.hpp) on every
// instruction set this CPU runs: its portable code compiled at the baseline,
// for AVX2 and for AVX-512 (chosen at run time), and what operator() picks,
// must give the same payload bytes, residual bits and norm bits. Built at
// -O3 (label `codegen`, release only, as fp_contract_same_bits): the AVX2
// and AVX-512 forms are the compiler's vectorization of the same source,
// which a test built at -O0 would not see. The portable code itself is
// checked against a full sort and the error-feedback formula in
// test_chunk_topk.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <diloco/codec/block_layout.hpp>
#include <diloco/codec/chunk_topk.hpp>
#include <diloco/kernels/compressed_passes.hpp>
#include <random>
#include <vector>

#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

// The encode pass's forms against its portable code, with error feedback
// decaying by `decay`: normal chunks, a flat one (every magnitude equal),
// one of four magnitudes (heavy ties), a partial chunk, two tensors.
template <class Codec>
void encode_paths_agree(float decay) {
  const Codec c{};
  const std::size_t n0 = 4 * Codec::block + Codec::block / 3, n1 = Codec::block - 5;
  const cp::block_layout layout({n0, n1}, Codec::block, 1);
  const std::size_t n = n0 + n1;
  std::vector<float> global = random_normals(n, 21), local = random_normals(n, 22, 0.9f), r = random_normals(n, 23, 0.1f);
  for (std::size_t j = Codec::block; j < 2 * Codec::block; ++j) global[j] = local[j] + 0.25f, r[j] = 0.0f;  // flat
  std::mt19937 rng(24);
  std::uniform_int_distribution<int> pick(0, 3);
  for (std::size_t j = 2 * Codec::block; j < 3 * Codec::block; ++j) {  // four magnitudes of either sign
    global[j] = local[j] + (j % 3 ? 1.0f : -1.0f) * (0.5f + 0.125f * static_cast<float>(pick(rng)));
    r[j] = 0.0f;
  }
  std::vector<float*> ptrs{local.data(), local.data() + n0};
  std::vector<std::size_t> offs{0, n0};
  struct out {
    std::vector<std::byte> payload;
    std::vector<float> next;
    std::vector<dc::kernels::sums2> sums;
  };
  auto run = [&](auto&& call) {
    out o{std::vector<std::byte>(layout.block_count() * c.stride()), std::vector<float>(n, -1.0f), {}};
    const dc::kernels::encode_pseudo_gradient<Codec> pass{c, layout.blocks(), {ptrs.data(), offs.data()}, global.data(),
                                                          r.data(), o.next.data(), o.payload.data(), c.stride(), 7,
                                                          decay};
    for (std::size_t b = 0; b < layout.block_count(); ++b) o.sums.push_back(call(pass, b));
    return o;
  };
  const out want = run([](const auto& p, std::size_t b) { return p.portable(b); });
  auto same = [&](const out& got) {
    CHECK(std::memcmp(got.payload.data(), want.payload.data(), want.payload.size()) == 0);
    CHECK(std::memcmp(got.next.data(), want.next.data(), n * sizeof(float)) == 0);
    for (std::size_t b = 0; b < want.sums.size(); ++b) {
      CAPTURE(b);
      CHECK(std::memcmp(&got.sums[b].a, &want.sums[b].a, sizeof(double)) == 0);
      CHECK(std::memcmp(&got.sums[b].b, &want.sums[b].b, sizeof(double)) == 0);
    }
  };
  same(run([](const auto& p, std::size_t b) { return p(b); }));
#if defined(DILOCO_HOST_SIMD_X86)
  if (dc::kernels::host_simd::enabled()) same(run([](const auto& p, std::size_t b) { return p.portable_avx2(b); }));
  if (dc::kernels::host_simd::avx512())
    same(run([](const auto& p, std::size_t b) { return p.portable_avx512(b); }));
  else
    MESSAGE("this CPU lacks AVX-512 (or DILOCO_HOST_SIMD=avx2): its form of the encode pass was not compared");
#endif
}

}  // namespace

TEST_CASE("chunk_topk's encode pass: every instruction set this CPU runs gives the portable code's bytes and bits") {
  encode_paths_agree<cp::chunk_topk_codec<4096, 64, dc::int2, cp::round_nearest>>(0.95f);
  encode_paths_agree<cp::chunk_topk_codec<4096, 64, dc::int8, cp::round_nearest>>(1.0f);
  encode_paths_agree<cp::chunk_topk_codec<256, 16, dc::int4, cp::stochastic_rounding>>(0.5f);
}

