// SPDX-License-Identifier: Apache-2.0
// The compressed mean across MPI processes (CTest runs it with -np 4): each
// codec's decoded mean within its error bound of the exact mean (the bounds
// of test_compressed_mean.cpp, derived from the codecs' definitions), every
// rank's replica bitwise identical, and corrupt or non-finite rounds
// rejected on every rank.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <diloco/comm/mpi.hpp>
#include <diloco/diloco.hpp>
#include <limits>
#include <vector>

#include "compressed_mean_bounds.hpp"
#include "random_inputs.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;
using namespace compressed_mean_bounds;

namespace {

// One round from theta = 0 with inner and outer SGD at lr 1, as in the
// threads test: theta afterwards is minus the decoded mean.
template <class C>
std::vector<std::vector<float>> run_round(dc::comm::mpi& comm, unsigned salt, typename C::options opts = {}) {
  std::vector<std::vector<float>> theta;
  for (auto n : sizes) theta.emplace_back(n, 0.0f);
  dc::algorithm<dc::inner::sgd, dc::outer::sgd, C, dc::comm::mpi> t(
      theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = opts});
  CHECK(t.step(deltas(comm.rank(), salt)));
  // Bitwise identical across ranks: every rank compares with rank 0's bytes.
  for (auto& tensor : theta) {
    std::vector<float> root = tensor;
    MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    REQUIRE(std::memcmp(root.data(), tensor.data(), tensor.size() * sizeof(float)) == 0);
  }
  return theta;
}

}  // namespace

TEST_CASE("compressed mean over MPI within the codec's bound of the exact mean") {
  dc::comm::mpi comm(MPI_COMM_WORLD);
  const int m = comm.size();
  check_blockwise(m, 1, run_round<cp::blockwise<dc::int8, B>>(comm, 1), 127.0f);
  check_blockwise(m, 2, run_round<cp::blockwise<dc::int4, B>>(comm, 2), 7.0f);
  check_blockwise(m, 3, run_round<cp::error_feedback<cp::blockwise<dc::int4, B>>>(comm, 3), 7.0f);
  check_cast(m, 4, run_round<cp::cast<dc::bf16>>(comm, 4), 7, 0.0);
  check_cast(m, 5, run_round<cp::cast<dc::fp16>>(comm, 5), 10, std::ldexp(1.0, -25));
  check_cast(m, 6, run_round<cp::topk<64>>(comm, 6, {.fraction = 1.0f}), 22, 0.0);
}

TEST_CASE_TEMPLATE("small formats over MPI within the format's bound", F, dc::fp8_e4m3, dc::fp8_e5m2, dc::fp4_e3m0,
                   dc::int2) {
  dc::comm::mpi comm(MPI_COMM_WORLD);
  const int m = comm.size();
  check_blockwise(m, 11, run_round<cp::blockwise<F, B>>(comm, 11), bound_levels<F>());
  check_blockwise(m, 12, run_round<cp::error_feedback<cp::blockwise<F, B, cp::stochastic_rounding>>>(comm, 12, {.seed = 3}),
                  bound_levels<F>() / 2.0f);
}

TEST_CASE("chunk_topk over MPI: the sparse mean is the dense mean of every rank's decoded segment, on every rank") {
  using P = cp::chunk_topk<128, 8, dc::int2>;
  dc::comm::mpi comm(MPI_COMM_WORLD);
  const int m = comm.size();
  const auto got = run_round<P>(comm, 31);
  // Every rank's pseudo-gradients are known here (deltas(r, salt)): encode
  // each chunk, decode, sum in rank order, divide by M; theta = -mean.
  const P::codec c = P::make_codec({});
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::vector<float> sum(sizes[t], 0.0f);
    for (int r = 0; r < m; ++r) {
      const auto d = deltas(r, 31)[t];
      for (std::size_t s = 0; s < d.size(); s += 128) {
        const std::size_t len = std::min<std::size_t>(128, d.size() - s);
        std::vector<std::byte> bytes(c.stride());
        std::vector<float> dq(len);
        c.encode(d.data() + s, len, bytes.data(), dq.data(), 0, 0);
        for (std::size_t j = 0; j < len; ++j) sum[s + j] = r == 0 ? dq[j] : sum[s + j] + dq[j];
      }
    }
    for (std::size_t i = 0; i < sizes[t]; ++i) REQUIRE(got[t][i] == 0.0f - 1.0f * (sum[i] / static_cast<float>(m)));
  }
}

TEST_CASE("low_rank over MPI: a rank-2 matrix held by every rank is reproduced, the same bits on every rank") {
  dc::comm::mpi comm(MPI_COMM_WORLD);
  const std::size_t rows = 24, cols = 18;
  std::vector<float> a(rows * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      a[i * cols + j] = std::sin(0.3f * static_cast<float>(i)) * std::cos(0.2f * static_cast<float>(j)) +
                        0.5f * std::cos(0.7f * static_cast<float>(i + 1)) * std::sin(0.1f * static_cast<float>(j + 2));
  std::vector<float> w(rows * cols, 0.0f), b(5, 0.0f);
  std::vector<dc::matrix_view<float>> params{{w.data(), rows, cols}, {b.data(), 5, 1}};
  dc::algorithm<dc::inner::sgd, dc::outer::sgd, cp::low_rank, dc::comm::mpi> t(
      params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = 3}});
  std::vector<float> vec{1.0f, 2.0f, 3.0f, 4.0f, static_cast<float>(comm.rank())};
  CHECK(t.step(std::vector<std::vector<float>>{a, vec}));
  double e = 0.0, n = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) e += (w[i] + a[i]) * (w[i] + a[i]), n += a[i] * a[i];
  CHECK(std::sqrt(e / n) <= 1e-5);
  CHECK(b[4] == -static_cast<float>(comm.size() - 1) / 2.0f);  // the exact mean of 0..M-1
  std::vector<float> root = w;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(std::memcmp(root.data(), w.data(), w.size() * 4) == 0);
}

TEST_CASE("adaptive over MPI: crafted budgets choose each rung; a measured budget gives the same choices on every rank") {
  dc::comm::mpi comm(MPI_COMM_WORLD);
  using ladder = cp::adaptive<cp::error_feedback<cp::blockwise<dc::int8, 128>>,
                              cp::error_feedback<cp::blockwise<dc::int4, 128>>,
                              cp::error_feedback<cp::blockwise<dc::int2, 128>>>;
  // Rung of every round, and of the next, for a rule.
  // Normal pseudo-gradients: relative errors about 0.006 (int8), 0.1 (int4)
  // and 0.4 (int2) in blocks of 128.
  const std::vector<std::size_t> shapes{3000, 1000, 37};
  const auto normals = [&](int rank, unsigned salt) {
    std::vector<std::vector<float>> g;
    for (std::size_t k = 0; k < shapes.size(); ++k)
      g.push_back(random_normals(shapes[k], static_cast<std::uint32_t>(1000 * salt + 10 * rank + k)));
    return g;
  };
  const auto run = [&](cp::adaptive_settings rule, int rounds, std::size_t inner_steps) {
    std::vector<std::vector<float>> theta;
    for (auto n : shapes) theta.emplace_back(n, 0.0f);
    dc::algorithm<dc::inner::sgd, dc::outer::sgd, ladder, dc::comm::mpi> t(
        theta, comm, {.inner_steps = inner_steps, .inner = {.lr = 1.0f}, .compress = {.rule = rule}});
    std::vector<std::uint64_t> used;
    for (int r = 1; r <= rounds; ++r)
      for (std::size_t s = 0; s < inner_steps; ++s)
        if (t.step(normals(comm.rank(), static_cast<unsigned>(r * 10 + s)))) {
          const auto& c = t.stats().compression_choices.at(0);
          used.push_back(c.used);
          used.push_back(c.next);
        }
    // The same on every rank: compare with rank 0's.
    std::vector<std::uint64_t> root = used;
    MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_UINT64_T, 0, MPI_COMM_WORLD);
    CHECK(root == used);
    for (auto& tensor : theta) {
      std::vector<float> r0 = tensor;
      MPI_Bcast(r0.data(), static_cast<int>(r0.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      CHECK(std::memcmp(r0.data(), tensor.data(), tensor.size() * sizeof(float)) == 0);
    }
    return used;
  };
  // A generous budget: from int2 up to int8 after the first round.
  CHECK(run({.budget_seconds = 1e9, .start = 2}, 3, 1) == std::vector<std::uint64_t>{2, 0, 0, 0, 0, 0});
  // No rung fits: the most compressed (int2) within a loose bound...
  CHECK(run({.budget_seconds = 1e-12, .error_bound = 0.9}, 3, 1) == std::vector<std::uint64_t>{0, 2, 2, 2, 2, 2});
  // ... and int4 when int2's error (about 0.4) is beyond the bound.
  CHECK(run({.budget_seconds = 1e-12, .error_bound = 0.25, .retry_after = 100, .start = 2}, 3, 1) ==
        std::vector<std::uint64_t>{2, 1, 1, 1, 1, 1});
  // The budget measured from the compute time between rounds: whatever the
  // timings, every rank takes the same rungs (checked inside run).
  run({.budget_share = 0.5, .window = 2}, 6, 3);
}

TEST_CASE("over MPI, a NaN on one rank rejects the compressed round on every rank") {
  dc::comm::mpi comm(MPI_COMM_WORLD);
  std::vector<std::vector<float>> theta;
  for (auto n : sizes) theta.emplace_back(n, 0.0f);
  dc::algorithm<dc::inner::sgd, dc::outer::nesterov, cp::error_feedback<cp::blockwise<dc::int8>>, dc::comm::mpi> t(
      theta, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}});
  CHECK(t.step(deltas(comm.rank(), 7)));
  const auto g = t.global_parameters();
  const std::vector<float> before(g.data(), g.data() + g.size());
  auto bad = deltas(comm.rank(), 8);
  if (comm.rank() == comm.size() - 1) bad[1][5] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(t.step(bad), doctest::Contains("non-finite pseudo-gradient from rank"), dc::numeric_error);
  CHECK(std::memcmp(g.data(), before.data(), before.size() * sizeof(float)) == 0);
  CHECK(t.step(deltas(comm.rank(), 9)));
}
