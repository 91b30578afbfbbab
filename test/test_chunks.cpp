// SPDX-License-Identifier: Apache-2.0
// Multi-tensor passes (exec/chunks.hpp, kernels/tensor_passes.hpp): one
// pass over a whole tensor list, on the host executor and on the replay of
// the CUDA launch (cuda_grid_sim.hpp). References: the per-tensor passes
// (one for_each per tensor, as before), which must give the same bits for
// element-wise passes; and for reductions the order exec/chunks.hpp defines,
// computed here from its text with plain loops over the flat elements, and a
// double-precision sum.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/kernels/tensor_passes.hpp>
#include <diloco/tensor/tensor_list.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_grid_sim.hpp"
#include "same_bits.hpp"

namespace dc = diloco;
namespace ex = dc::exec;
namespace k = dc::kernels;

namespace {

// Tensor sizes: empty and one-element tensors, odd sizes, sizes that cross
// chunks, and lists of up to 10^4 tensors.
std::vector<std::size_t> random_layout(std::uint64_t seed, std::size_t tensors, std::size_t max_size) {
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> sizes;
  for (std::size_t t = 0; t < tensors; ++t) {
    const auto pick = rng() % 10;
    sizes.push_back(pick == 0 ? 0 : pick == 1 ? 1 : rng() % (max_size + 1));
  }
  return sizes;
}

const std::vector<std::vector<std::size_t>> layouts = {
    {},
    {0},
    {1},
    {8192},
    {8193},
    {3, 0, 17, 1, 64, 5},
    {20000, 1, 0, 8191, 2, 8192, 3},
    random_layout(1, 100, 3000),
    random_layout(2, 10000, 40),
    random_layout(3, 7, 50000),
};

// A set of tensors (each in its own 64-byte aligned storage, `misalign`
// floats in) with values drawn from a normal distribution.
struct tensors {
  std::vector<dc::host_buffer<float>> storage;
  std::vector<dc::tensor_view<float, dc::host_space>> views;

  // `binades`: values scaled by 2^e, e uniform in [-binades, binades], so
  // that sums of their squares round (a sum whose every partial sum is
  // exact would not tell one order from another).
  tensors(const std::vector<std::size_t>& sizes, std::uint64_t seed, std::size_t misalign = 0, int binades = 0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> exponent(-binades, binades);
    for (std::size_t n : sizes) {
      storage.emplace_back(n + misalign + 1);
      views.emplace_back(storage.back().data() + misalign, n);
      for (std::size_t i = 0; i < n; ++i) views.back()[i] = std::ldexp(normal(rng), exponent(rng));
    }
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& v : views) out.insert(out.end(), v.data(), v.data() + v.size());
    return out;
  }
};

std::size_t total(const std::vector<std::size_t>& sizes) { return std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}); }


// The sum exec/chunks.hpp defines, written from its text: chunks of 8192
// flat elements; in each, lane l adds the elements at positions congruent
// to l mod 256 in increasing order (in double); lanes added pairwise
// (l += l + w for w = 128, ..., 1); chunk sums added in chunk order.
double defined_sum(const std::vector<double>& terms) {
  double total = 0.0;
  for (std::size_t lo = 0; lo < terms.size(); lo += 8192) {
    double lane[256] = {};
    for (std::size_t p = 0; p < 8192 && lo + p < terms.size(); ++p) lane[p % 256] += terms[lo + p];
    for (unsigned w = 128; w > 0; w /= 2)
      for (unsigned l = 0; l < w; ++l) lane[l] += lane[l + w];
    total += lane[0];
  }
  return total;
}

}  // namespace

TEST_CASE("chunk_table: every element once, in order, in chunks of 8192 with the right positions") {
  for (const auto& sizes : layouts) {
    CAPTURE(sizes.size());
    const ex::chunk_table t(sizes);
    const std::size_t n = total(sizes);
    CHECK(t.elements() == n);
    CHECK(t.chunks() == (n + ex::chunk_elements - 1) / ex::chunk_elements);
    // Walk the pieces: they must enumerate tensor by tensor, element by
    // element, with position = flat index mod 8192 and chunk = index / 8192.
    std::size_t flat = 0, tensor = 0, element = 0;
    for (std::size_t c = 0; c < t.chunks(); ++c) {
      std::size_t in_chunk = 0;
      for (std::uint32_t p = t.first()[c]; p < t.first()[c + 1]; ++p) {
        const ex::piece& pc = t.pieces()[p];
        while (tensor < sizes.size() && element == sizes[tensor]) ++tensor, element = 0;  // skip empty / finished
        REQUIRE(tensor < sizes.size());
        CHECK(pc.tensor == tensor);
        CHECK(pc.begin == element);
        CHECK(pc.count > 0);
        CHECK(pc.position == flat % ex::chunk_elements);
        CHECK(flat / ex::chunk_elements == c);
        element += pc.count;
        flat += pc.count;
        in_chunk += pc.count;
        CHECK(element <= sizes[tensor]);
      }
      CHECK(in_chunk == (c + 1 < t.chunks() ? ex::chunk_elements : n - c * ex::chunk_elements));
    }
    CHECK(flat == n);
  }
}

namespace {

// Runs the outer apply (Nesterov, overwrite and rebase merges) and an AdamW
// inner step over `sizes`, once per tensor (the reference) and once as one
// multi-tensor pass with `Exec`; compares every buffer bitwise.
template <class Exec>
void element_passes_match(const std::vector<std::size_t>& sizes, std::size_t misalign) {
  Exec exec;
  const dc::outer::nesterov::options oo{.lr = 0.7f, .momentum = 0.9f};
  const auto outer_update = dc::outer::nesterov::make_update(oo, 2);
  const dc::inner::adamw::options io{.lr = 1e-3f, .weight_decay = 0.1f};
  const auto inner_update = dc::inner::adamw::make_update(io, 3);

  auto run = [&](bool multi) {
    tensors local(sizes, 7, misalign), grads(sizes, 8, misalign);
    const std::size_t flat = total(sizes) + 16 * sizes.size();  // room for any offsets
    std::vector<std::size_t> offsets;
    std::size_t off = 0;
    for (std::size_t n : sizes) offsets.push_back(off), off += n + 3;  // gaps between tensors
    std::vector<float> global(flat + 3 * sizes.size()), wire(global.size()), momentum(global.size()),
        start(global.size()), adam(2 * global.size());
    for (std::size_t i = 0; i < global.size(); ++i) {
      global[i] = std::sin(0.1f * static_cast<float>(i));
      wire[i] = std::cos(0.3f * static_cast<float>(i));
      momentum[i] = 0.01f * static_cast<float>(i % 7);
      start[i] = 0.5f * global[i];
      adam[i] = 0.001f * static_cast<float>(i % 5);
      adam[global.size() + i] = 0.002f * static_cast<float>(i % 3);
    }
    const std::size_t stride = global.size();
    std::vector<float*> data;
    std::vector<const float*> g;
    for (std::size_t t = 0; t < sizes.size(); ++t) data.push_back(local.views[t].data()), g.push_back(grads.views[t].data());
    const k::tensor_ptrs ptrs{data.data(), offsets.data()};
    const ex::chunk_table table(sizes);
    const k::merge::rebase rebase{{}, start.data()};
    if (multi) {
      exec.for_each_chunked(table.view(), k::inner_steps<decltype(inner_update)>{inner_update, ptrs, g.data(), 0.5f,
                                                                                 adam.data(), stride});
      exec.for_each_chunked(table.view(), k::outer_applies<decltype(outer_update), k::merge::overwrite>{
                                              outer_update, wire.data(), 0.25f, global.data(), momentum.data(), stride,
                                              ptrs, {}});
      exec.for_each_chunked(table.view(), k::outer_applies<decltype(outer_update), k::merge::rebase>{
                                              outer_update, wire.data(), 0.25f, global.data(), momentum.data(), stride,
                                              ptrs, rebase});
    } else {
      dc::exec::host h;
      for (std::size_t t = 0; t < sizes.size(); ++t)
        h.for_each(sizes[t], k::inner_step<decltype(inner_update)>{inner_update, data[t], g[t], 0.5f,
                                                                    adam.data() + offsets[t], stride});
      for (std::size_t t = 0; t < sizes.size(); ++t)
        h.for_each(sizes[t], k::outer_apply<decltype(outer_update)>{outer_update, wire.data() + offsets[t], 0.25f,
                                                                     global.data() + offsets[t],
                                                                     momentum.data() + offsets[t], stride, data[t]});
      for (std::size_t t = 0; t < sizes.size(); ++t)
        h.for_each(sizes[t], k::outer_apply<decltype(outer_update), k::merge::rebase>{
                                 outer_update, wire.data() + offsets[t], 0.25f, global.data() + offsets[t],
                                 momentum.data() + offsets[t], stride, data[t], rebase.shifted(offsets[t])});
    }
    std::vector<std::vector<float>> out{local.flat(), global, momentum, start, adam};
    return out;
  };
  const auto per_tensor = run(false), multi = run(true);
  for (std::size_t b = 0; b < per_tensor.size(); ++b) {
    CAPTURE(b);
    CHECK(same_bits(per_tensor[b], multi[b]));
  }
}

}  // namespace

TEST_CASE("multi-tensor element passes give the per-tensor passes' bits (host, and the replayed GPU launch)") {
  for (const auto& sizes : layouts) {
    CAPTURE(sizes.size());
    for (std::size_t misalign : {0, 1, 2}) {
      CAPTURE(misalign);
      element_passes_match<dc::exec::host>(sizes, misalign);
      element_passes_match<sim::cuda_executor>(sizes, misalign);
    }
  }
}

TEST_CASE("the replayed GPU launch takes the 4-wide path on aligned tensors and a scalar head on offsets") {
  // Tensors of 4k + 1 elements: from the second chunk on, pieces start at
  // elements that are not multiples of 4, so the lanes run a scalar head.
  const std::vector<std::size_t> sizes = {8193, 5, 8200, 4097};
  tensors a(sizes, 1), b(sizes, 2);
  std::vector<float*> src, dst;
  std::vector<std::size_t> offsets(sizes.size(), 0);
  for (std::size_t t = 0; t < sizes.size(); ++t) src.push_back(a.views[t].data()), dst.push_back(b.views[t].data());
  const ex::chunk_table table(sizes);
  struct copy_all {
    float* const* src;
    float* const* dst;
    k::copy bind(std::size_t t) const { return {src[t], dst[t]}; }
  };
  sim::launches.reset();
  sim::cuda_executor{}.for_each_chunked(table.view(), copy_all{src.data(), dst.data()});
  CHECK(sim::launches.vector == 1);
  CHECK(same_bits(a.flat(), b.flat()));
  tensors c(sizes, 3, 1), d(sizes, 4, 1);  // one float in: misaligned
  for (std::size_t t = 0; t < sizes.size(); ++t) src[t] = c.views[t].data(), dst[t] = d.views[t].data();
  sim::launches.reset();
  sim::cuda_executor{}.for_each_chunked(table.view(), copy_all{src.data(), dst.data()});
  CHECK(sim::launches.scalar == 1);
  CHECK(same_bits(c.flat(), d.flat()));
}

TEST_CASE("multi-tensor reductions: the defined order's bits for every layout, thread count and executor") {
  for (const auto& sizes : layouts) {
    CAPTURE(sizes.size());
    tensors x(sizes, 11, 0, 20), y(sizes, 12, 0, 20);
    const std::vector<float> fx = x.flat(), fy = y.flat();
    std::vector<double> terms(fx.size());
    double exact = 0.0;
    for (std::size_t i = 0; i < fx.size(); ++i) {
      const float d = fy[i] - fx[i];
      terms[i] = static_cast<double>(d * d);
      exact += static_cast<double>(fy[i] - fx[i]) * static_cast<double>(fy[i] - fx[i]);
    }
    const double defined = defined_sum(terms);

    // ref = y packed with gaps; local = x's tensors.
    std::vector<std::size_t> offsets;
    std::vector<float> ref;
    std::vector<float*> data;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      offsets.push_back(ref.size());
      ref.insert(ref.end(), y.views[t].data(), y.views[t].data() + sizes[t]);
      ref.insert(ref.end(), 5, 0.0f);
      data.push_back(x.views[t].data());
    }
    const k::tensor_ptrs ptrs{data.data(), offsets.data()};
    const ex::chunk_table table(sizes);
    const k::pseudo_gradients_sq f{ref.data(), ptrs};
    dc::exec::host one(1), two(2);
    const double host1 = one.transform_reduce_chunked(table.view(), f);
    const double host2 = two.transform_reduce_chunked(table.view(), f);
    const double gpu = sim::cuda_executor{}.transform_reduce_chunked(table.view(), f);
    CHECK(std::memcmp(&host1, &defined, sizeof(double)) == 0);
    CHECK(std::memcmp(&host2, &defined, sizeof(double)) == 0);
    CHECK(std::memcmp(&gpu, &defined, sizeof(double)) == 0);
    CHECK(host1 == doctest::Approx(exact).epsilon(1e-6));
    // Another order gives other bits on these values (the check above is
    // not vacuous): the same lanes without the pairwise step.
    if (fx.size() > 10000) {
      double other = 0.0;
      for (double t : terms) other += t;
      CHECK(std::memcmp(&other, &defined, sizeof(double)) != 0);
    }

    // The same elements as one flat tensor: the same bits.
    const std::vector<std::size_t> one_tensor{fx.size()};
    std::vector<float> flat_x = fx;
    float* flat_data = flat_x.data();
    const std::size_t zero = 0;
    const ex::chunk_table flat_table(one_tensor);
    const double flat = one.transform_reduce_chunked(flat_table.view(),
                                                     k::pseudo_gradients_sq{fy.data(), {&flat_data, &zero}});
    CHECK(std::memcmp(&flat, &defined, sizeof(double)) == 0);
  }
}

TEST_CASE("tensor_list: the set's pointers and offsets (or the given ones) and its chunk table") {
  std::vector<std::vector<float>> storage = {std::vector<float>(5), std::vector<float>(0), std::vector<float>(9000)};
  dc::parameter_set<float, dc::host_space> set(storage);
  dc::exec::host h;
  const dc::tensor_list<dc::host_space> own(set, h);
  CHECK(own.count() == 3);
  CHECK(own.elements() == 9005);
  CHECK(own.chunks().chunks == 2);
  for (std::size_t t = 0; t < 3; ++t) {
    CHECK(own.ptrs().data[t] == set[t].data());
    CHECK(own.ptrs().offset[t] == set.offset(t));
  }
  const std::vector<std::size_t> moved = {100, 7, 0};
  const dc::tensor_list<dc::host_space> other(set, h, moved);
  for (std::size_t t = 0; t < 3; ++t) CHECK(other.ptrs().offset[t] == moved[t]);

  dc::gradient_list<dc::host_space> grads(3);
  float a = 0, b = 0, c = 0;
  const float* list1[] = {&a, &b, &c};
  const float* const* p = grads.update(h, [&](std::size_t t) { return list1[t]; });
  CHECK(p[0] == &a);
  CHECK(p[2] == &c);
}
