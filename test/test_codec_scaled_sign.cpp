// SPDX-License-Identifier: Apache-2.0
// The compressor axis is open: a codec defined in this file alone, a 1-bit
// scaled sign (every element travels as its sign, a block as one fp32 scale,
// its largest magnitude), written once as its element-level form
// (codec/element_codec.hpp), runs
//   - through the host compressed mean (threads communicator, 2 to 4
//     workers, error feedback), and
//   - through the device compressed mean, whose team programs
//     (kernels/compressed_blocks.hpp) and structure checks
//     (kernels/wire_passes.hpp) are replayed thread by thread on the host
//     (sim_device.hpp, as test_cuda_compress_sim.cpp does),
// with no line of the library naming it: the reducer comes from its kind
// (reduce/select.hpp), the fingerprint from its name and block size
// (compress/fingerprint.hpp), the wire id from codec_id::user_first.
//
// Expected values come from the codec's definition, re-derived here in
// fp32 without the library: for a block v, s = max |v_j| and
// dq_j = (v_j < 0 ? -s : s); the mean of a block is the decoded values
// summed in rank order, divided by M (correctly rounded), and re-encoded;
// error feedback keeps e = (delta + e) - dq. Every operation is one
// correctly rounded fp32 operation, so the comparisons are exact.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <diloco/codec/element_codec.hpp>
#include <diloco/diloco.hpp>
#include <random>
#include <type_traits>
#include <vector>

#include "sim_device.hpp"
#include "threads_link.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
namespace k = diloco::kernels;

namespace {

// ------------------------------------------------------------- the codec
// The element-level form: block B (a multiple of 8), groups of 8 elements
// whose sign bits fill one byte (element j0 + i in bit i), the block's
// scale (an fp32, its amax) in the first 4 bytes, the bits after it.
template <std::size_t B>
struct scaled_sign_elements {
  static_assert(B % 8 == 0 && B >= 8, "scaled_sign: B must be a multiple of 8");
  static constexpr cp::codec_id id = cp::codec_id::user_first;
  static constexpr std::size_t block = B;
  static constexpr std::size_t group = 8;
  static constexpr bool scaled = true;
  static constexpr bool stochastic = false;
  static constexpr std::size_t stride = 4 + B / 8;
  using code = unsigned;

  DILOCO_HD static float factor(const std::byte* blk) {
    float s;
    std::memcpy(&s, blk, 4);
    return s;
  }
  DILOCO_HD static void put_factor(std::byte* blk, float amax) { std::memcpy(blk, &amax, 4); }

  struct factor_terms {
    float scale;
  };
  DILOCO_HD static factor_terms terms(float amax) { return {amax}; }

  DILOCO_HD static void encode(float v, const factor_terms& f, float /*u*/, code& q, float& dq) {
    q = v < 0.0f ? 1u : 0u;
    dq = q ? -f.scale : f.scale;
  }
  DILOCO_HD static bool normal(const factor_terms&) { return true; }
  DILOCO_HD static void encode_normal(float v, const factor_terms& f, float u, code& q, float& dq) {
    encode(v, f, u, q, dq);
  }
  DILOCO_HD static float decode(code q, const factor_terms& f) { return q ? -f.scale : f.scale; }
  DILOCO_HD static bool plain(const factor_terms&) { return true; }
  DILOCO_HD static float decode_plain(code q, const factor_terms& f) { return decode(q, f); }

  DILOCO_HD static void put_codes(std::byte* blk, std::size_t j0, const code (&q)[group]) {
    unsigned byte = 0;
    for (std::size_t i = 0; i < group; ++i) byte |= (q[i] & 1u) << i;
    blk[4 + j0 / 8] = static_cast<std::byte>(byte);
  }
  DILOCO_HD static void codes(const std::byte* blk, std::size_t j0, code (&q)[group]) {
    const auto byte = static_cast<unsigned>(blk[4 + j0 / 8]);
    for (std::size_t i = 0; i < group; ++i) q[i] = (byte >> i) & 1u;
  }

  // Every sign pattern is a value; the scale is never negative (an amax),
  // and a partial block's bits past its end are zero.
  DILOCO_HD static const char* check(const std::byte* blk, std::size_t len) {
    if (static_cast<unsigned>(blk[3]) & 0x80u) return "negative scale";
    for (std::size_t j = len; j < B; ++j)
      if ((static_cast<unsigned>(blk[4 + j / 8]) >> (j % 8)) & 1u) return "non-zero padding bits after a partial block";
    return nullptr;
  }
};

template <std::size_t B>
using scaled_sign_codec = cp::element_codec<scaled_sign_elements<B>>;

// The compressor policy: a stateless codec (no options to validate), named.
template <std::size_t B = 64>
struct scaled_sign : cp::stateless_codec_policy<scaled_sign_codec<B>, cp::round_nearest> {
  static constexpr const char* name = "scaled_sign";
};

// What the library knows of it, all from the policy itself.
static_assert(cp::block_codec<scaled_sign_codec<64>>);
static_assert(dc::compressor<scaled_sign<64>>);
static_assert(dc::compressor<cp::error_feedback<scaled_sign<64>>>);
static_assert(k::codec_elements<scaled_sign_codec<64>>::supported);
static_assert(std::is_same_v<dc::reduce::reducer_t<scaled_sign<64>, dc::comm::threads, dc::host_space, dc::exec::host>,
                             dc::reduce::compressed<scaled_sign<64>, dc::comm::threads, dc::host_space, dc::exec::host>>);

// ------------------------------------------------- the definition, in fp32
float amax_of(const float* v, std::size_t n) {
  float s = 0.0f;
  for (std::size_t j = 0; j < n; ++j) s = std::max(s, std::fabs(v[j]));
  return s;
}
// dq of every element of a tensor, block by block.
std::vector<float> sign_times_amax(const std::vector<float>& v, std::size_t block) {
  std::vector<float> dq(v.size());
  for (std::size_t b0 = 0; b0 < v.size(); b0 += block) {
    const std::size_t n = std::min(block, v.size() - b0);
    const float s = amax_of(v.data() + b0, n);
    for (std::size_t j = b0; j < b0 + n; ++j) dq[j] = v[j] < 0.0f ? -s : s;
  }
  return dq;
}

const std::vector<std::size_t> sizes = {1, 37, 300, 129, 64};
constexpr std::size_t B = 64;

float grad(int rank, int step, std::size_t t, std::size_t i) {
  // Normals of a magnitude per tensor and rank, fixed by (rank, step, t).
  std::mt19937 rng(static_cast<unsigned>(1000 * rank + 100 * step) + static_cast<unsigned>(t));
  std::normal_distribution<float> n01(0.0f, 1.0f);
  float x = 0.0f;
  for (std::size_t j = 0; j <= i; ++j) x = n01(rng);
  return x * std::ldexp(1.0f, -static_cast<int>(t)) * static_cast<float>(rank + 1);
}

struct expected {
  std::vector<std::vector<float>> theta;               // [t]: theta_global (= every replica)
  std::vector<std::vector<std::vector<float>>> residual;  // [rank][t]
};

// `rounds` rounds of one inner SGD step (lr 1) from theta = 0 and outer SGD
// (lr 1), with error feedback when `feedback`.
expected reference(int m, int rounds, bool feedback) {
  const auto mm = static_cast<std::size_t>(m);
  expected e;
  for (auto n : sizes) e.theta.emplace_back(n, 0.0f);
  e.residual.assign(mm, {});
  for (auto& r : e.residual)
    for (auto n : sizes) r.emplace_back(n, 0.0f);
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::vector<float> acc(sizes[t], 0.0f);
      for (int r = 0; r < m; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        std::vector<float> v(sizes[t]);
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          const float local = e.theta[t][i] - grad(r, round, t, i);  // the inner step
          const float delta = e.theta[t][i] - local;                  // the pseudo-gradient
          v[i] = feedback ? delta + e.residual[ri][t][i] : delta;
        }
        const auto dq = sign_times_amax(v, B);
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          if (feedback) e.residual[ri][t][i] = v[i] - dq[i];
          acc[i] = r == 0 ? dq[i] : acc[i] + dq[i];  // rank order
        }
      }
      for (auto& a : acc) a = a / static_cast<float>(m);
      const auto mean = sign_times_amax(acc, B);  // stage 2 re-encodes the shard's mean
      for (std::size_t i = 0; i < sizes[t]; ++i) e.theta[t][i] = e.theta[t][i] - mean[i];
    }
  }
  return e;
}

// ------------------------------------------------------ the library's run
struct run_result {
  std::vector<std::vector<std::vector<float>>> replica, global, residual;  // [rank][t]
};

template <class C>
using trainer_options = dc::algorithm_options<dc::inner::sgd, dc::outer::sgd, C>;

template <class Space, class C, bool DeviceLink = false>
run_result train(int m, int rounds) {
  const auto mm = static_cast<std::size_t>(m);
  run_result out;
  out.replica.resize(mm);
  out.global.resize(mm);
  out.residual.resize(mm);
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& threads) {
    const auto ri = static_cast<std::size_t>(threads.rank());
    using link = std::conditional_t<DeviceLink, threads_device_link, threads_host_link>;
    link comm(threads);
    std::vector<dc::host_buffer<float>> storage, grad_storage;
    std::vector<dc::tensor_view<float, Space>> params, grads;
    for (auto n : sizes) {
      storage.emplace_back(n);
      grad_storage.emplace_back(n);
      std::fill(storage.back().data(), storage.back().data() + n, 0.0f);
      params.emplace_back(storage.back().data(), n);
      grads.emplace_back(grad_storage.back().data(), n);
    }
    const trainer_options<C> opts{.inner_steps = 1, .inner = {.lr = 1.0f}, .outer = {.lr = 1.0f}};
    dc::algorithm<dc::inner::sgd, dc::outer::sgd, C, link> t(params, comm, opts);
    for (int s = 0; s < rounds; ++s) {
      for (std::size_t k2 = 0; k2 < sizes.size(); ++k2)
        for (std::size_t i = 0; i < sizes[k2]; ++i) grads[k2].data()[i] = grad(threads.rank(), s, k2, i);
      t.step(grads);
    }
    t.finish();
    const auto g = t.template global_parameters<Space>();
    const auto e = t.template compression_residual<Space>();
    for (std::size_t k2 = 0; k2 < sizes.size(); ++k2) {
      const float* p = storage[k2].data();
      out.replica[ri].emplace_back(p, p + sizes[k2]);
      out.global[ri].emplace_back(g.data() + t.global_offset(k2), g.data() + t.global_offset(k2) + sizes[k2]);
      if (e.size()) out.residual[ri].emplace_back(e.data() + t.global_offset(k2), e.data() + t.global_offset(k2) + sizes[k2]);
    }
  });
  return out;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void check_against_definition(const run_result& got, const expected& want, int m, bool feedback) {
  for (int r = 0; r < m; ++r) {
    CAPTURE(r);
    const auto ri = static_cast<std::size_t>(r);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      CAPTURE(t);
      CHECK(same(got.global[ri][t], want.theta[t]));
      CHECK(same(got.replica[ri][t], want.theta[t]));
      if (feedback) {
        REQUIRE(got.residual[ri].size() == sizes.size());
        CHECK(same(got.residual[ri][t], want.residual[ri][t]));
      }
    }
  }
}

void check_same(const run_result& a, const run_result& b) {
  REQUIRE(a.global.size() == b.global.size());
  for (std::size_t r = 0; r < a.global.size(); ++r)
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      CHECK(same(a.global[r][t], b.global[r][t]));
      CHECK(same(a.replica[r][t], b.replica[r][t]));
      if (!a.residual[r].empty()) CHECK(same(a.residual[r][t], b.residual[r][t]));
    }
}

}  // namespace

TEST_CASE("scaled sign codec: a block's bytes are its scale and its signs, and check() refuses what encode never writes") {
  const scaled_sign_codec<16> codec{};
  CHECK(codec.stride() == 4 + 2);
  // 11 elements (a partial block): amax 3.5, signs of 1.0 -2.0 0 -0 3.5 ...
  const float v[11] = {1.0f, -2.0f, 0.0f, -0.0f, 3.5f, -3.5f, 0.25f, -1e-30f, 2.0f, -0.5f, 0.125f};
  std::byte out[6];
  std::memset(out, 0xff, sizeof out);
  float dq[11];
  codec.encode(v, 11, out, dq, 0, 0);
  float scale;
  std::memcpy(&scale, out, 4);
  CHECK(scale == 3.5f);
  // Bits (element j in bit j % 8 of byte j / 8): negative at 1, 5, 7, 9
  // (-0 is not below zero); bits past the 11th are zero.
  CHECK(static_cast<unsigned>(out[4]) == ((1u << 1) | (1u << 5) | (1u << 7)));
  CHECK(static_cast<unsigned>(out[5]) == (1u << 1));
  for (std::size_t j = 0; j < 11; ++j) CHECK(dq[j] == (v[j] < 0.0f ? -3.5f : 3.5f));
  float back[11];
  codec.decode(out, 11, back);
  CHECK(std::memcmp(back, dq, sizeof dq) == 0);
  CHECK(codec.check(out, 11) == nullptr);
  out[5] |= std::byte{0x80};  // element 15: past the block's end
  CHECK(std::string(codec.check(out, 11)) == "non-zero padding bits after a partial block");
  out[5] = std::byte{0x02};
  out[3] |= std::byte{0x80};
  CHECK(std::string(codec.check(out, 11)) == "negative scale");
}

TEST_CASE("scaled sign codec: named by the library's rules, with the id it declares") {
  CHECK(cp::fingerprint<scaled_sign<64>>() == "scaled_sign, block 64, round to nearest");
  CHECK(cp::fingerprint<cp::error_feedback<scaled_sign<64>>>() == "scaled_sign, block 64, round to nearest, error feedback");
  CHECK(static_cast<unsigned>(scaled_sign_codec<64>::id) == 0x80u);
}

TEST_CASE("scaled sign codec through the host compressed mean: the definition's theta, replicas and residuals, M = 2, 3, 4") {
  for (int m : {2, 3, 4}) {
    CAPTURE(m);
    check_against_definition(train<dc::host_space, scaled_sign<B>>(m, 3), reference(m, 3, false), m, false);
    check_against_definition(train<dc::host_space, cp::error_feedback<scaled_sign<B>>>(m, 3), reference(m, 3, true), m,
                             true);
  }
}

TEST_CASE("scaled sign codec through the device team programs (replayed): the definition's bits, the host's bits") {
  for (int m : {2, 3, 4}) {
    CAPTURE(m);
    using C = cp::error_feedback<scaled_sign<B>>;
    sim::team_launches = 0;
    const auto device = train<dc::device_space, C>(m, 3);
    CHECK(sim::team_launches > 0);  // the team programs ran
    check_against_definition(device, reference(m, 3, true), m, true);
    check_same(device, train<dc::host_space, C>(m, 3));
    // Device views through a device communicator: the same bits.
    check_same(train<dc::device_space, C, true>(m, 2), train<dc::host_space, C>(m, 2));
  }
}
