// SPDX-License-Identifier: Apache-2.0
// The decode-apply pass (kernels::decode_apply: decode a block of the
// reduced mean, the outer step, the merge into the replica) against the
// documented formulas, element by element: the codes and scales are written
// by hand, the outer step is torch.optim.SGD's (Nesterov: b <- mu b + d,
// p <- p - lr (d + mu b); plain SGD: p <- p - lr d) and the merges are
// those of kernels/merge.hpp's comments (overwrite: l <- g; rebase:
// l <- g - (start - l), start <- l; mix: l <- alpha l + (1 - alpha) g).
// Tensors of odd sizes give partial blocks, and blocks at offsets other than
// their tensor's start. Eager's merge (Kale et al.; kernels/merge.hpp): the
// worker first steps its replica from where its phase began, start =
// anchor - own, along mean + (fresh - own)/M with fresh = start - l, with
// its own momentum slot and step count; then own <- fresh, anchor <- x +
// fresh, l <- x; the shared step follows. Its pass runs branch-free forms
// of the two steps where they agree on weight decay and momentum, and the
// general loop where they do not: both are checked.

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

// The replica as separate tensors, cut from a flat array.
struct replica {
  std::vector<std::vector<float>> tensors;
  std::vector<float*> ptrs;
  replica(const layout& L, const std::vector<float>& flat) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      tensors.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(L.offsets[t]),
                           flat.begin() + static_cast<std::ptrdiff_t>(L.offsets[t] + sizes[t]));
      ptrs.push_back(tensors.back().data());
    }
  }
};

// f(t, j, i) for element j of tensor t, i in the flat layout.
template <class F>
void for_each_element(const layout& L, F&& f) {
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t j = 0; j < sizes[t]; ++j) f(t, j, L.offsets[t] + j);
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
  replica local(L, local_flat);

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

  const kn::tensor_table table{local.ptrs.data(), L.offsets.data()};
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

  for_each_element(L, [&](std::size_t t, std::size_t j, std::size_t i) {
    CAPTURE(t);
    CAPTURE(j);
    REQUIRE(global[i] == want_g[i]);
    REQUIRE(local.tensors[t][j] == want_l[i]);
    if (momentum) REQUIRE(state[i] == want_b[i]);
    if (kind == merge_kind::rebase) REQUIRE(start[i] == want_start[i]);
  });
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

namespace {

// One torch.optim.SGD step on p with gradient d (Nesterov when momentum is
// on; the buffer b exists already unless `first`): d <- d + wd p;
// b <- d (first) or mu b + d; d <- d + mu b; p <- p - lr d.
void sgd_step(float& p, float d, float* b, float lr, float mu, float wd, bool first) {
  if (wd != 0.0f) {
    const float decay = wd * p;
    d = d + decay;
  }
  if (b != nullptr) {
    if (first) {
      *b = d;
    } else {
      const float carried = mu * *b;
      *b = carried + d;
    }
    const float through = mu * *b;
    d = d + through;
  }
  const float delta = lr * d;
  p = p - delta;
}

// Eager's decode-apply on M = 4 workers' mean: the shared step (step 2) and
// the worker's own (step `worker_step`), with weight decay wd_shared and
// wd_worker, against the formulas above.
template <class Format>
void check_eager(bool momentum, float wd_shared, float wd_worker, std::uint64_t worker_step) {
  using codec = cp::blockwise_codec<Format, block, cp::round_nearest>;
  const layout L;
  std::mt19937 rng(11 + (momentum ? 100u : 0u) + Format::bits + static_cast<unsigned>(worker_step));
  std::vector<float> mean;
  const auto payload = make_payload<Format>(L, rng, mean);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> global(L.total), state(L.total), anchor(L.total), own(L.total), slots(L.total),
      local_flat(L.total);
  for (auto* v : {&global, &state, &anchor, &own, &slots, &local_flat})
    for (auto& x : *v) x = value(rng);
  replica local(L, local_flat);
  const float lr = 0.7f, mu = 0.9f, inv = 0.25f;
  const float m = momentum ? mu : 0.0f;
  auto outer = [&](float wd, std::uint64_t step) {
    return dc::outer::sgd::make_update({.lr = lr, .momentum = m, .weight_decay = wd, .nesterov = momentum}, step);
  };
  const auto shared = outer(wd_shared, 2);
  const auto worker = outer(wd_worker, worker_step);

  std::vector<float> want_g = global, want_b = state, want_a = anchor, want_o = own, want_w = slots, want_l = local_flat;
  for (std::size_t i = 0; i < L.total; ++i) {
    const float stale = want_o[i];
    const float start = want_a[i] - stale;
    const float fresh = start - want_l[i];
    float x = start;
    const float correction = (fresh - stale) * inv;
    sgd_step(x, mean[i] + correction, momentum ? &want_w[i] : nullptr, lr, mu, wd_worker, worker_step <= 1);
    want_o[i] = fresh;
    want_a[i] = x + fresh;
    want_l[i] = x;
    sgd_step(want_g[i], mean[i], momentum ? &want_b[i] : nullptr, lr, mu, wd_shared, false);
  }

  const kn::tensor_table table{local.ptrs.data(), L.offsets.data()};
  const kn::merge::eager<kn::sgd_update> merge{
      {}, worker, anchor.data(), own.data(), momentum ? slots.data() : nullptr, L.total, inv};
  dc::exec::host ex;
  ex.for_each(L.blocks.size(), kn::decode_apply<codec, kn::sgd_update, decltype(merge)>{
                                   codec{}, shared, L.blocks.data(), table, payload.data(), codec::stride(),
                                   global.data(), momentum ? state.data() : nullptr, L.total, merge});
  for_each_element(L, [&](std::size_t t, std::size_t j, std::size_t i) {
    CAPTURE(t);
    CAPTURE(j);
    REQUIRE(global[i] == want_g[i]);
    REQUIRE(local.tensors[t][j] == want_l[i]);
    REQUIRE(anchor[i] == want_a[i]);
    REQUIRE(own[i] == want_o[i]);
    if (momentum) {
      REQUIRE(state[i] == want_b[i]);
      REQUIRE(slots[i] == want_w[i]);
    }
  });
}

}  // namespace

TEST_CASE("decode-apply with eager's merge: the worker's step, then the shared one, as the formulas say") {
  for (const bool momentum : {true, false})
    for (const float wd : {0.0f, 0.05f}) {
      CAPTURE(momentum);
      CAPTURE(wd);
      // The two steps agree (the engine's case: the branch-free loop), at
      // the worker's first step and a later one.
      for (const std::uint64_t worker_step : {1u, 3u}) {
        CAPTURE(worker_step);
        check_eager<dc::int8>(momentum, wd, wd, worker_step);
        check_eager<dc::int4>(momentum, wd, wd, worker_step);
      }
      // They differ in weight decay: the general loop.
      check_eager<dc::int8>(momentum, wd, 0.05f - wd, 3);
      check_eager<dc::int4>(momentum, wd, 0.05f - wd, 3);
    }
}
