// SPDX-License-Identifier: Apache-2.0
// The decode-apply pass (kernels::decode_apply: decode a block of the
// reduced mean, the outer step, the merge into the replica) against the
// documented formulas, element by element: the codes and scales are written
// by hand, the outer step is torch.optim.SGD's (Nesterov: b <- mu b + d,
// p <- p - lr (d + mu b); plain SGD: p <- p - lr d) and the merges are
// those of kernels/merge.hpp's comments (overwrite: l <- g; rebase:
// l <- g - (start - l), start <- l; mix: l <- alpha l + (1 - alpha) g).
// Tensors of odd sizes give partial blocks, and blocks at offsets other than
// their tensor's start.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <diloco/diloco.hpp>
#include <random>
#include <vector>

namespace dc = diloco;
namespace cp = diloco::compress;
namespace kn = diloco::kernels;

namespace {

constexpr std::size_t block = 64;
const std::vector<std::size_t> sizes = {1, 63, 64, 200, 5, 129};

// The blocks (cp::block_layout, one shard) and each tensor's offset in the
// flat arrays.
struct layout {
  cp::block_layout cut{sizes, block, 1};
  std::vector<cp::block_ref> blocks{cut.blocks(), cut.blocks() + cut.block_count()};
  std::vector<std::size_t> offsets;
  std::size_t total = cut.total();
  layout() {
    for (std::size_t t = 0, at = 0; t < sizes.size(); at += sizes[t++]) offsets.push_back(at);
  }
};

// A payload of random codes (never the one code the format does not
// write) and a scale per block; `mean` gets what each element decodes to:
// q * (amax / levels), the codec's documented value.
template <class Format>
std::vector<std::byte> make_payload(const layout& L, std::mt19937& rng, std::vector<float>& mean) {
  using codec = cp::blockwise_codec<Format, block, cp::round_nearest>;
  constexpr auto levels = static_cast<int>(Format::levels);
  std::vector<std::byte> payload(L.blocks.size() * codec::stride(), std::byte{0});
  mean.assign(L.total, 0.0f);
  std::uniform_int_distribution<int> code(-levels, levels);
  std::uniform_real_distribution<float> scale(0.01f, 2.0f);
  for (std::size_t b = 0; b < L.blocks.size(); ++b) {
    std::byte* out = payload.data() + b * codec::stride();
    const float amax = scale(rng);
    std::memcpy(out, &amax, 4);
    const auto& blk = L.blocks[b];
    for (std::size_t j = 0; j < blk.len; ++j) {
      const int q = code(rng);
      const auto bits = static_cast<unsigned>(q) & codec::mask;
      auto& byte = out[4 + j / codec::per_byte];
      byte = static_cast<std::byte>(static_cast<unsigned>(byte) | (bits << ((j % codec::per_byte) * codec::bits)));
      mean[L.offsets[blk.tensor] + blk.start + j] = static_cast<float>(q) * (amax / static_cast<float>(levels));
    }
  }
  return payload;
}

enum class merge_kind { overwrite, rebase, mix };

template <class Format>
void check_against_formulas(merge_kind kind, bool momentum) {
  using codec = cp::blockwise_codec<Format, block, cp::round_nearest>;
  const layout L;
  std::mt19937 rng(7 + static_cast<unsigned>(kind) + (momentum ? 100u : 0u) + Format::bits);
  std::vector<float> mean;
  const auto payload = make_payload<Format>(L, rng, mean);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> global(L.total), state(L.total), start(L.total), local_flat(L.total);
  for (auto* v : {&global, &state, &start, &local_flat})
    for (auto& x : *v) x = value(rng);
  // The replica as separate tensors.
  std::vector<std::vector<float>> local(sizes.size());
  std::vector<float*> local_ptrs;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    local[t].assign(local_flat.begin() + static_cast<std::ptrdiff_t>(L.offsets[t]),
                    local_flat.begin() + static_cast<std::ptrdiff_t>(L.offsets[t] + sizes[t]));
    local_ptrs.push_back(local[t].data());
  }

  const float lr = 0.7f, mu = 0.9f, alpha = 0.25f;
  // Step 2 of the outer optimizer: the momentum buffer exists already.
  const auto update = momentum ? dc::outer::nesterov::make_update({.lr = lr, .momentum = mu}, 2)
                               : dc::outer::sgd::make_update({.lr = lr}, 2);
  float* state_ptr = momentum ? state.data() : nullptr;

  // The formulas, element by element.
  std::vector<float> want_g = global, want_b = state, want_start = start, want_l = local_flat;
  for (std::size_t i = 0; i < L.total; ++i) {
    const float d = mean[i];
    float step = d;
    if (momentum) {
      const float mb = mu * want_b[i];
      want_b[i] = mb + d;
      const float mb2 = mu * want_b[i];
      step = d + mb2;
    }
    const float lstep = lr * step;
    want_g[i] = want_g[i] - lstep;
    switch (kind) {
      case merge_kind::overwrite: want_l[i] = want_g[i]; break;
      case merge_kind::rebase: {
        const float progress = want_start[i] - want_l[i];
        want_l[i] = want_g[i] - progress;
        want_start[i] = want_l[i];
        break;
      }
      case merge_kind::mix: {
        const float a = alpha * want_l[i];
        const float c = (1.0f - alpha) * want_g[i];
        want_l[i] = a + c;
        break;
      }
    }
  }

  const kn::tensor_table table{local_ptrs.data(), L.offsets.data()};
  dc::exec::host ex;
  auto run = [&](auto merge) {
    ex.for_each(L.blocks.size(), kn::decode_apply<codec, kn::sgd_update, decltype(merge)>{
                                     codec{}, update, L.blocks.data(), table, payload.data(), codec::stride(),
                                     global.data(), state_ptr, L.total, merge});
  };
  switch (kind) {
    case merge_kind::overwrite: run(kn::merge::overwrite{}); break;
    case merge_kind::rebase: run(kn::merge::rebase{{}, start.data()}); break;
    case merge_kind::mix: run(kn::merge::mix{{}, alpha}); break;
  }

  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t j = 0; j < sizes[t]; ++j) {
      const std::size_t i = L.offsets[t] + j;
      CAPTURE(t);
      CAPTURE(j);
      REQUIRE(global[i] == want_g[i]);
      REQUIRE(local[t][j] == want_l[i]);
      if (momentum) REQUIRE(state[i] == want_b[i]);
      if (kind == merge_kind::rebase) REQUIRE(start[i] == want_start[i]);
    }
}

}  // namespace

TEST_CASE("decode-apply: every element as the formulas say, for every merge, with and without outer state") {
  for (const auto kind : {merge_kind::overwrite, merge_kind::rebase, merge_kind::mix})
    for (const bool momentum : {true, false}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(momentum);
      check_against_formulas<dc::int8>(kind, momentum);
      check_against_formulas<dc::int4>(kind, momentum);
    }
}
