// SPDX-License-Identifier: Apache-2.0
// The CUDA launcher's index math and the fused kernels' 4-wide paths, run on
// the host: every thread of the grid the launcher would start executes the
// kernels' per-thread code (see cuda_grid_sim.hpp). References are what the
// launch must do by definition (each index exactly once, closed-form sums)
// and the host executor's scalar loop over the same functors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/exec/cuda/launch_plan.hpp>
#include <random>
#include <vector>

#include "cuda_grid_sim.hpp"
#include "random_inputs.hpp"
#include "same_bits.hpp"

namespace dc = diloco;
namespace grid = dc::exec::grid;
namespace k = dc::kernels;

namespace {

const std::size_t awkward_sizes[] = {0, 1, 3, 4, 5, 1023, 1025};

// Records which element each call touched: vec4(i) marks i..i+3 as visited
// by the vector path, operator()(i) marks i as scalar.
struct recorder {
  int* scalar_hits;
  int* vector_hits;
  int* vector_starts;
  void operator()(std::size_t i) const { scalar_hits[i] += 1; }
  void vec4(std::size_t i) const {
    vector_starts[i] += 1;
    for (std::size_t l = 0; l < 4; ++l) vector_hits[i + l] += 1;
  }
  bool vec4_aligned() const { return true; }
};

// f(i) = i, exact in double for these sizes.
struct index_value {
  float operator()(std::size_t i) const { return static_cast<float>(i); }
  k::vec4f vec4(std::size_t i) const {
    return {{static_cast<float>(i), static_cast<float>(i + 1), static_cast<float>(i + 2), static_cast<float>(i + 3)}};
  }
  bool vec4_aligned() const { return true; }
};

// 64-byte aligned storage with `offset` floats of slack in front, so
// data() + offset is misaligned by `offset` floats.
struct array {
  dc::host_buffer<float> storage;
  std::size_t offset;
  array(const std::vector<float>& v, std::size_t off) : storage(v.size() + off + 4), offset(off) {
    if (!v.empty()) std::memcpy(storage.data() + off, v.data(), v.size() * sizeof(float));
  }
  float* data() { return storage.data() + offset; }
  std::vector<float> values(std::size_t n) { return {data(), data() + n}; }
};


}  // namespace

TEST_CASE("make_plan: groups, tail and grid size from the closed forms") {
  for (std::size_t n : awkward_sizes) {
    CAPTURE(n);
    const auto s = grid::make_plan(n, false);
    CHECK(s.groups == 0);
    CHECK(s.tail_begin == 0);
    CHECK(s.blocks == (n + 255) / 256);
    const auto v = grid::make_plan(n, true);
    CHECK(v.groups == n / 4);
    CHECK(v.tail_begin == n - n % 4);
    // Enough threads for the groups and for the tail's up to 3 elements.
    const std::size_t items = std::max(n / 4, n % 4);
    CHECK(v.blocks == (items + 255) / 256);
    CHECK((v.blocks == 0) == (n == 0));
  }
  // The grid is capped; the stride loop covers the rest.
  CHECK(grid::make_plan(std::size_t{1} << 30, false).blocks == grid::max_blocks);
  CHECK(grid::make_plan(std::size_t{1} << 30, false, grid::block_size, grid::max_reduce_blocks).blocks ==
        grid::max_reduce_blocks);
}

TEST_CASE("for_each_thread visits every element exactly once, 4-wide groups at multiples of 4, tail scalar") {
  struct shape {
    unsigned block, cap;
  };
  // The default launch, and grids small enough that threads loop.
  for (const shape sh : {shape{grid::block_size, grid::max_blocks}, shape{32, 2}, shape{4, 1}, shape{2, 1}})
    for (std::size_t n : awkward_sizes)
      for (bool vectorized : {false, true}) {
        CAPTURE(sh.block);
        CAPTURE(sh.cap);
        CAPTURE(n);
        CAPTURE(vectorized);
        std::vector<int> scalar(n + 4, 0), vec(n + 4, 0), starts(n + 4, 0);
        const auto p = grid::make_plan(n, vectorized, sh.block, sh.cap);
        sim::run_for_each(p, recorder{scalar.data(), vec.data(), starts.data()});
        const std::size_t vector_end = vectorized ? n / 4 * 4 : 0;
        for (std::size_t i = 0; i < n + 4; ++i) {
          CAPTURE(i);
          const bool inside = i < n;
          REQUIRE(scalar[i] + vec[i] == (inside ? 1 : 0));
          REQUIRE(vec[i] == (i < vector_end ? 1 : 0));
          REQUIRE(starts[i] == (i < vector_end && i % 4 == 0 ? 1 : 0));
        }
      }
}

TEST_CASE("the reduction's blocks, tree and partials sum f(i) = i exactly") {
  // n(n-1)/2 is exact in double; 2^21 + 5 elements make the capped grid of
  // the reduction loop several times.
  std::vector<std::size_t> sizes(std::begin(awkward_sizes), std::end(awkward_sizes));
  sizes.push_back((std::size_t{1} << 21) + 5);
  for (std::size_t n : sizes)
    for (bool vectorized : {false, true}) {
      CAPTURE(n);
      CAPTURE(vectorized);
      const auto p = grid::make_plan(n, vectorized, grid::block_size, grid::max_reduce_blocks);
      const double expected = n == 0 ? 0.0 : static_cast<double>(n) * static_cast<double>(n - 1) / 2.0;
      CHECK(sim::run_reduce(p, index_value{}) == expected);
    }
}

TEST_CASE("use_vector_path: only when every pointer is 16-byte aligned and strides keep slots aligned") {
  dc::host_buffer<float> mem(256);
  float* a = mem.data();  // 64-byte aligned
  for (std::size_t off = 0; off < 4; ++off) {
    CAPTURE(off);
    const bool aligned = off == 0;
    CHECK(grid::use_vector_path(k::pseudo_gradient{a + off, a + 64, a + 128}) == aligned);
    CHECK(grid::use_vector_path(k::pseudo_gradient{a, a + 64 + off, a + 128}) == aligned);
    CHECK(grid::use_vector_path(k::pseudo_gradient{a, a + 64, a + 128 + off}) == aligned);
    CHECK(grid::use_vector_path(k::copy{a + off, a + 64}) == aligned);
    CHECK(grid::use_vector_path(k::squares{a + off}) == aligned);
    CHECK(grid::use_vector_path(
              k::outer_apply<k::sgd_update>{{}, a, 0.5f, a + 32, a + 64 + off, 64, a + 192}) == aligned);
    CHECK(grid::use_vector_path(k::inner_step<k::adamw_update>{{}, a, a + 16 + off, 1.0f, a + 32, 64}) == aligned);
  }
  // Slot k of the state is at state + k * stride: a stride that is not a
  // multiple of 4 misaligns slot 1 even though the base is aligned.
  CHECK(grid::use_vector_path(k::inner_step<k::adamw_update>{{}, a, a + 16, 1.0f, a + 32, 64}));
  CHECK_FALSE(grid::use_vector_path(k::inner_step<k::adamw_update>{{}, a, a + 16, 1.0f, a + 32, 63}));
  // No state: the stride does not matter.
  CHECK(grid::use_vector_path(k::inner_step<k::sgd_update>{{}, a, a + 16, 1.0f, nullptr, 63}));

  // An update that does not declare vector_state_slots runs scalar.
  struct plain_update {
    void operator()(float& p, float g, float*, std::size_t) const { p -= g; }
  };
  CHECK_FALSE(grid::use_vector_path(k::inner_step<plain_update>{{}, a, a + 16, 1.0f, nullptr, 0}));
  // And the launcher still runs it, scalar: p - g.
  std::vector<float> p{1, 2, 3, 4, 5}, g{1, 1, 1, 1, 1};
  sim::cuda_executor{}.for_each(p.size(), k::inner_step<plain_update>{{}, p.data(), g.data(), 2.0f, nullptr, 0});
  CHECK(p == std::vector<float>{-1, 0, 1, 2, 3});
}

// The fused functors through the simulated launch (4-wide where aligned)
// against the host executor's scalar loop: the same bits element by element
// (each lane performs the scalar path's operations), and reductions equal to
// a double-precision sum.
TEST_CASE("fused kernels on the simulated grid match the host executor at awkward sizes and offsets") {
  const auto adamw = dc::inner::adamw::make_update({.lr = 1e-2f, .weight_decay = 0.1f}, 3);
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  const auto sgd_momentum = dc::inner::sgd::make_update({.lr = 0.1f, .momentum = 0.9f}, 2);
  const auto sgd_plain = dc::inner::sgd::make_update({.lr = 0.1f}, 1);
  dc::exec::host host;
  sim::cuda_executor device;

  for (std::size_t n : awkward_sizes)
    for (std::size_t off : {0, 1, 2, 3}) {
      CAPTURE(n);
      CAPTURE(off);
      const auto x0 = random_floats(n, 1), y0 = random_floats(n, 2), z0 = random_floats(n, 3);
      // State: two slots at stride n rounded up to 4 (as the library pads).
      const std::size_t stride = (n + 3) / 4 * 4;
      auto s0 = random_floats(2 * stride, 4, 0.0f, 1.0f);
      const long vector_before = sim::launches.vector;

      auto run_both = [&](auto make) {
        array hx(x0, off), hy(y0, off), hz(z0, off), hs(s0, off);
        array dx(x0, off), dy(y0, off), dz(z0, off), ds(s0, off);
        host.for_each(n, make(hx, hy, hz, hs));
        device.for_each(n, make(dx, dy, dz, ds));
        CHECK(same_bits(hx.values(n), dx.values(n)));
        CHECK(same_bits(hy.values(n), dy.values(n)));
        CHECK(same_bits(hz.values(n), dz.values(n)));
        CHECK(same_bits(hs.values(2 * stride), ds.values(2 * stride)));
      };
      run_both([&](array& x, array& g, array&, array& s) {
        return k::inner_step<k::adamw_update>{adamw, x.data(), g.data(), 0.75f, s.data(), stride};
      });
      run_both([&](array& x, array& g, array&, array& s) {
        return k::inner_step<k::sgd_update>{sgd_momentum, x.data(), g.data(), 1.0f, s.data(), stride};
      });
      run_both([&](array& x, array& g, array&, array&) {
        return k::inner_step<k::sgd_update>{sgd_plain, x.data(), g.data(), 1.0f, nullptr, stride};
      });
      run_both([&](array& r, array& gl, array& l, array& s) {
        return k::outer_apply<k::sgd_update>{nesterov, r.data(), 0.25f, gl.data(), s.data(), stride, l.data()};
      });
      run_both([&](array& gl, array&, array& l, array& s) {
        return k::outer_apply_local<k::sgd_update>{nesterov, gl.data(), s.data(), stride, l.data()};
      });
      run_both([&](array& src, array&, array& dst, array&) { return k::copy{src.data(), dst.data()}; });

      // Reductions: the written outputs bit for bit, the sums to double
      // rounding of a reference computed here.
      double ref_sq = 0.0, ref_x2 = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const float d = x0[i] - y0[i];
        ref_sq += static_cast<double>(d * d);
        ref_x2 += static_cast<double>(x0[i] * x0[i]);
      }
      array hx(x0, off), hy(y0, off), hz(z0, off), dx(x0, off), dy(y0, off), dz(z0, off);
      const double hsum = host.transform_reduce(n, k::pseudo_gradient{hx.data(), hy.data(), hz.data()});
      const double dsum = device.transform_reduce(n, k::pseudo_gradient{dx.data(), dy.data(), dz.data()});
      CHECK(same_bits(hz.values(n), dz.values(n)));
      CHECK(hsum == doctest::Approx(ref_sq).epsilon(1e-12));
      CHECK(dsum == doctest::Approx(ref_sq).epsilon(1e-12));
      CHECK(device.transform_reduce(n, k::pseudo_gradient_sq{dx.data(), dy.data()}) ==
            doctest::Approx(ref_sq).epsilon(1e-12));
      CHECK(device.transform_reduce(n, k::squares{dx.data()}) == doctest::Approx(ref_x2).epsilon(1e-12));

      // The 4-wide path ran exactly when the pointers allowed it.
      const long vector_launches = sim::launches.vector - vector_before;
      CHECK((vector_launches > 0) == (off == 0 && n > 0));
    }
}
