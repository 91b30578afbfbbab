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

// Eager's state for n elements: theta_global, the shared momentum slots,
// the worker's anchor, own and slots, and its replica (flat), random.
struct eager_state {
  std::vector<float> global, state, anchor, own, slots, local;
  eager_state(std::size_t n, std::mt19937& rng) : global(n), state(n), anchor(n), own(n), slots(n), local(n) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (auto* v : {&global, &state, &anchor, &own, &slots, &local})
      for (auto& x : *v) x = value(rng);
  }
};

constexpr float eager_lr = 0.7f, eager_mu = 0.9f, eager_inv = 0.25f;  // M = 4

// The outer step (torch SGD, Nesterov with momentum) at step `step`.
dc::kernels::sgd_update eager_outer(bool momentum, float wd, std::uint64_t step) {
  return dc::outer::sgd::make_update(
      {.lr = eager_lr, .momentum = momentum ? eager_mu : 0.0f, .weight_decay = wd, .nesterov = momentum}, step);
}

// What eager's pass must leave, by the formulas: the worker's step from
// start = anchor - own along mean + (fresh - own)/M, fresh = start - l, then
// own <- fresh, anchor <- x + fresh, l <- x; the shared step on theta_global.
eager_state eager_formulas(eager_state s, const std::vector<float>& mean, bool momentum, float wd_shared,
                           float wd_worker, std::uint64_t worker_step) {
  for (std::size_t i = 0; i < mean.size(); ++i) {
    const float stale = s.own[i];
    const float start = s.anchor[i] - stale;
    const float fresh = start - s.local[i];
    float x = start;
    const float correction = (fresh - stale) * eager_inv;
    sgd_step(x, mean[i] + correction, momentum ? &s.slots[i] : nullptr, eager_lr, eager_mu, wd_worker,
             worker_step <= 1);
    s.own[i] = fresh;
    s.anchor[i] = x + fresh;
    s.local[i] = x;
    sgd_step(s.global[i], mean[i], momentum ? &s.state[i] : nullptr, eager_lr, eager_mu, wd_shared, false);
  }
  return s;
}

// got (with the replica's element i at local(i)) against want, every element.
template <class Local>
void check_eager_state(const eager_state& got, const eager_state& want, bool momentum, Local&& local) {
  for (std::size_t i = 0; i < want.global.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got.global[i] == want.global[i]);
    REQUIRE(local(i) == want.local[i]);
    REQUIRE(got.anchor[i] == want.anchor[i]);
    REQUIRE(got.own[i] == want.own[i]);
    if (momentum) {
      REQUIRE(got.state[i] == want.state[i]);
      REQUIRE(got.slots[i] == want.slots[i]);
    }
  }
}

// Eager's decode-apply on M = 4 workers' mean: the shared step (step 2) and
// the worker's own (step `worker_step`), with weight decay wd_shared and
// wd_worker, against the formulas.
template <class Format>
void check_eager(bool momentum, float wd_shared, float wd_worker, std::uint64_t worker_step) {
  using codec = cp::blockwise_codec<Format, block, cp::round_nearest>;
  const layout L;
  std::mt19937 rng(11 + (momentum ? 100u : 0u) + Format::bits + static_cast<unsigned>(worker_step));
  std::vector<float> mean;
  const auto payload = make_payload<Format>(L, rng, mean);
  eager_state got(L.total, rng);
  replica local(L, got.local);
  const auto want = eager_formulas(got, mean, momentum, wd_shared, wd_worker, worker_step);

  const kn::tensor_table table{local.ptrs.data(), L.offsets.data()};
  const kn::merge::eager<kn::sgd_update> merge{{},      eager_outer(momentum, wd_worker, worker_step),
                                               got.anchor.data(), got.own.data(),
                                               momentum ? got.slots.data() : nullptr, L.total, eager_inv};
  dc::exec::host ex;
  ex.for_each(L.blocks.size(), kn::decode_apply<codec, kn::sgd_update, decltype(merge)>{
                                   codec{}, eager_outer(momentum, wd_shared, 2), L.blocks.data(), table,
                                   payload.data(), codec::stride(), got.global.data(),
                                   momentum ? got.state.data() : nullptr, L.total, merge});
  check_eager_state(got, want, momentum, [&](std::size_t i) {
    std::size_t t = 0;
    while (i >= L.offsets[t] + sizes[t]) ++t;
    return local.tensors[t][i - L.offsets[t]];
  });
}

// The same with the fp32 mean (the wire holds 4 x the mean, scaled by 1/4:
// exact), through the multi-tensor outer apply on the host executor, which
// runs eager in blocks of 256 over each piece of its chunk table: tensors
// larger than a block and than a chunk (8192), and small ones.
void check_eager_fp32(bool momentum, float wd_shared, float wd_worker, std::uint64_t worker_step) {
  const std::vector<std::size_t> fp32_sizes = {1, 300, 8500, 7, 513};
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (auto n : fp32_sizes) {
    offsets.push_back(total);
    total += n;
  }
  std::mt19937 rng(23 + (momentum ? 100u : 0u) + static_cast<unsigned>(worker_step));
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::vector<float> mean(total), wire(total);
  for (std::size_t i = 0; i < total; ++i) {
    mean[i] = value(rng);
    wire[i] = mean[i] * 4.0f;
  }
  eager_state got(total, rng);
  const auto want = eager_formulas(got, mean, momentum, wd_shared, wd_worker, worker_step);
  std::vector<float*> ptrs;
  for (auto off : offsets) ptrs.push_back(got.local.data() + off);  // the replica's tensors, in place
  const dc::exec::chunk_table chunks(fp32_sizes);
  const kn::merge::eager<kn::sgd_update> merge{{},      eager_outer(momentum, wd_worker, worker_step),
                                               got.anchor.data(), got.own.data(),
                                               momentum ? got.slots.data() : nullptr, total, eager_inv};
  dc::exec::host ex;
  ex.for_each_chunked(chunks.view(), kn::outer_applies<kn::sgd_update, decltype(merge)>{
                                         eager_outer(momentum, wd_shared, 2), wire.data(), 0.25f, got.global.data(),
                                         momentum ? got.state.data() : nullptr, total,
                                         kn::tensor_ptrs{ptrs.data(), offsets.data()}, merge});
  check_eager_state(got, want, momentum, [&](std::size_t i) { return got.local[i]; });
}

// f(momentum, wd_shared, wd_worker, worker_step) for momentum on and off
// and weight decay on and off: the two steps agreeing (the engine's case:
// the branch-free loop) at the worker's first step and a later one, then
// differing in weight decay (the general loop).
template <class F>
void for_each_eager_case(F&& f) {
  for (const bool momentum : {true, false})
    for (const float wd : {0.0f, 0.05f}) {
      CAPTURE(momentum);
      CAPTURE(wd);
      for (const std::uint64_t worker_step : {1u, 3u}) {
        CAPTURE(worker_step);
        f(momentum, wd, wd, worker_step);
      }
      f(momentum, wd, 0.05f - wd, 3);
    }
}

}  // namespace

TEST_CASE("decode-apply with eager's merge: the worker's step, then the shared one, as the formulas say") {
  for_each_eager_case([](bool momentum, float wd_shared, float wd_worker, std::uint64_t worker_step) {
    check_eager<dc::int8>(momentum, wd_shared, wd_worker, worker_step);
    check_eager<dc::int4>(momentum, wd_shared, wd_worker, worker_step);
  });
}

TEST_CASE("fp32 outer apply with eager's merge (multi-tensor pass, blocks of a range): as the formulas say") {
  for_each_eager_case(check_eager_fp32);
}
