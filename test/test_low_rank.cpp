// SPDX-License-Identifier: Apache-2.0
// low_rank (PowerSGD-style) over the threads communicator: a rank-R matrix
// held by every worker is reproduced, error feedback stays bounded, vectors
// travel exactly, replicas agree bit for bit for M = 1, 2, 3, 4, 7, a
// corrupt factor segment is refused on every rank, three workers with
// different matrices follow PowerSGD's round computed in double, and a
// checkpoint round trip continues with the uninterrupted run's bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "random_inputs.hpp"
#include "resume_check.hpp"
#include "threads_link.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {


// A rows x cols matrix of rank R: sum of R outer products.
std::vector<float> rank_r(std::size_t rows, std::size_t cols, std::size_t r, unsigned seed) {
  const auto u = random_normals(rows * r, seed), v = random_normals(cols * r, seed + 1);
  std::vector<float> a(rows * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      for (std::size_t c = 0; c < r; ++c) a[i * cols + j] += u[i * r + c] * v[j * r + c];
  return a;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want, float sign = 1.0f) {
  double e = 0.0, n = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    e += (sign * static_cast<double>(got[i]) - want[i]) * (sign * static_cast<double>(got[i]) - want[i]);
    n += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(e / n);
}

template <class Comm>
using trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, cp::low_rank, Comm>;

}  // namespace

TEST_CASE("low_rank: a rank-R matrix on every worker is reproduced (rel. err <= 1e-5), ranks 2 and 4") {
  const auto a = rank_r(40, 30, 2, 5);
  for (std::uint32_t r : {2u, 4u}) {
    for (int m : {1, 3}) {
      CAPTURE(r);
      CAPTURE(m);
      std::vector<std::vector<float>> got(static_cast<std::size_t>(m));
      dc::comm::threads::world world(m);
      world.run([&](dc::comm::threads& comm) {
        std::vector<float> w(40 * 30, 0.0f);
        std::vector<dc::matrix_view<float>> params{{w.data(), 40, 30}};
        trainer<dc::comm::threads> t(params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = r}});
        CHECK(t.step(std::vector<std::vector<float>>{a}));  // delta = a: theta = -mean = -a
        got[static_cast<std::size_t>(comm.rank())] = w;
      });
      for (const auto& g : got) CHECK(rel_err(g, a, -1.0f) <= 1e-5);
    }
  }
}

TEST_CASE("low_rank: vectors and matrices too small for the rank travel exactly; the bytes are 4 r (rows + cols)") {
  constexpr int m = 3;
  std::vector<std::vector<std::vector<float>>> grads(m);
  for (int k = 0; k < m; ++k)
    grads[static_cast<std::size_t>(k)] = {random_normals(20 * 10, 10 + static_cast<unsigned>(k)), random_normals(7, 20 + static_cast<unsigned>(k)),
                                          random_normals(3 * 2, 30 + static_cast<unsigned>(k))};
  std::vector<std::vector<float>> vec(m), small(m);
  std::vector<double> bytes(m);
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(200, 0.0f), b(7, 0.0f), s(6, 0.0f);
    std::vector<dc::matrix_view<float>> params{{w.data(), 20, 10}, {b.data(), 7, 1}, {s.data(), 3, 2}};
    trainer<dc::comm::threads> t(params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = 2}});
    CHECK(t.step(grads[static_cast<std::size_t>(comm.rank())]));
    vec[static_cast<std::size_t>(comm.rank())] = b;
    small[static_cast<std::size_t>(comm.rank())] = s;
    bytes[static_cast<std::size_t>(comm.rank())] = t.stats().encoded_bytes_per_parameter;
  });
  for (int k = 0; k < m; ++k) {
    for (std::size_t i = 0; i < 7; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < m; ++r) sum = r == 0 ? grads[0][1][i] : sum + grads[static_cast<std::size_t>(r)][1][i];
      CHECK(vec[static_cast<std::size_t>(k)][i] == 0.0f - 1.0f * (sum / static_cast<float>(m)));
    }
    for (std::size_t i = 0; i < 6; ++i) {  // 3 x 2 at rank 2: not smaller than min(rows, cols), sent whole
      float sum = 0.0f;
      for (int r = 0; r < m; ++r) sum = r == 0 ? grads[0][2][i] : sum + grads[static_cast<std::size_t>(r)][2][i];
      CHECK(small[static_cast<std::size_t>(k)][i] == 0.0f - 1.0f * (sum / static_cast<float>(m)));
    }
    // P (20 x 2) + the vector (7) + the small matrix (6) in exchange 1, Q
    // (10 x 2) in exchange 2, fp32, plus two 64-byte headers.
    CHECK(bytes[static_cast<std::size_t>(k)] == doctest::Approx((4.0 * (40 + 7 + 6 + 20) + 128) / 213.0));
  }
}

TEST_CASE("low_rank: error feedback stays bounded over 40 rounds of full-rank pseudo-gradients") {
  constexpr int m = 2;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(32 * 24, 0.0f);
    std::vector<dc::matrix_view<float>> params{{w.data(), 32, 24}};
    trainer<dc::comm::threads> t(params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = 2}});
    double delta_norm = 0.0, at10 = 0.0, worst = 0.0;
    for (int round = 0; round < 40; ++round) {
      const auto g = random_normals(32 * 24, 100 + static_cast<unsigned>(round * 7 + comm.rank()), 0.1f);
      double n = 0.0;
      for (float x : g) n += static_cast<double>(x) * x;
      delta_norm = std::max(delta_norm, std::sqrt(n));
      REQUIRE(t.step(std::vector<std::vector<float>>{g}));
      double e = 0.0;
      const auto res = t.compression_residual();
      for (std::size_t i = 0; i < res.size(); ++i) e += static_cast<double>(res[i]) * res[i];
      if (round == 10) at10 = std::sqrt(e);
      worst = std::max(worst, std::sqrt(e));
    }
    // The residual collects what rank 2 cannot say, but the power iteration
    // sends its largest directions every round: it levels off rather than
    // growing with the rounds (a sum of 40 unsent deltas would be ~6x one).
    MESSAGE("residual at round 10 ", at10, ", worst ", worst, ", largest delta ", delta_norm);
    CHECK(at10 > 0.0);
    CHECK(worst <= 5.0 * delta_norm);
    CHECK(worst <= 2.0 * at10);
  });
}

TEST_CASE("low_rank: replicas agree bit for bit, M = 1, 2, 3, 4, 7, and the residual and Q are checkpoint state") {
  for (int m : {1, 2, 3, 4, 7}) {
    CAPTURE(m);
    std::vector<std::vector<float>> seen(static_cast<std::size_t>(m));
    dc::comm::threads::world world(m);
    world.run([&](dc::comm::threads& comm) {
      std::vector<float> w(24 * 16, 0.0f), b(16, 0.0f);
      std::vector<dc::matrix_view<float>> params{{w.data(), 24, 16}, {b.data(), 16, 1}};
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, cp::low_rank, dc::comm::threads> t(
          params, comm, {.inner_steps = 2, .inner = {.lr = 0.5f}, .compress = {.rank = 3, .seed = 9}});
      for (int s = 0; s < 6; ++s)
        t.step(std::vector<std::vector<float>>{random_normals(24 * 16, 50 + static_cast<unsigned>(s * 11 + comm.rank())),
                                               random_normals(16, 60 + static_cast<unsigned>(s + comm.rank()))});
      const auto g = t.global_parameters();
      seen[static_cast<std::size_t>(comm.rank())].assign(g.data(), g.data() + g.size());
      bool residual = false, q = false;
      for (const auto& e : t.state()) {
        residual = residual || e.name.find(".residual") != std::string::npos;
        q = q || e.name.find(".low_rank_q") != std::string::npos;
      }
      CHECK(residual);
      CHECK(q);
    });
    for (int r = 1; r < m; ++r)
      CHECK(std::memcmp(seen[static_cast<std::size_t>(r)].data(), seen[0].data(), seen[0].size() * 4) == 0);
  }
}

TEST_CASE("low_rank orthonormalisation passes: Gram-Schmidt's orthonormal columns, a dependent column dropped") {
  namespace lr = diloco::kernels::low_rank;
  // Two matrices' P at r = 3: 150 rows (more than the 64 lanes) of normals,
  // and 5 rows whose third column is the sum of the first two (exactly, in
  // small integers): it lies in their span and must come out as zeros.
  constexpr std::size_t r = 3, rows_a = 150, rows_b = 5;
  std::vector<float> p = random_normals(rows_a * r, 41);
  const float b[rows_b][r] = {{1, 1, 2}, {2, 0, 2}, {3, 1, 4}, {4, 0, 4}, {5, 1, 6}};
  for (const auto& row : b) p.insert(p.end(), row, row + r);
  const std::vector<float> original = p;
  const std::vector<lr::factor_matrix> mats = {{rows_a, 0, 0}, {rows_b, rows_a * r, rows_a * r}};
  std::vector<double> basis((rows_a + rows_b) * r), before(2 * lr::gram_schmidt_lanes), sums(4 * lr::gram_schmidt_lanes);
  dc::exec::host exec(1);
  lr::orthonormalise(exec, lr::gram_schmidt{mats.data(), p.data(), basis.data(), before.data(), sums.data(), 2, r});

  // The definition (Golub & Van Loan, modified Gram-Schmidt), in long
  // double, one matrix at a time, with the same rule for a dropped column.
  auto reference = [&](std::size_t at, std::size_t rows) {
    std::vector<std::vector<long double>> q;
    std::vector<long double> out(rows * r, 0.0L);
    for (std::size_t c = 0; c < r; ++c) {
      std::vector<long double> x(rows);
      long double before_norm = 0.0L;
      for (std::size_t i = 0; i < rows; ++i) x[i] = original[at + i * r + c], before_norm += x[i] * x[i];
      for (const auto& u : q) {
        long double dot = 0.0L;
        for (std::size_t i = 0; i < rows; ++i) dot += u[i] * x[i];
        for (std::size_t i = 0; i < rows; ++i) x[i] -= dot * u[i];
      }
      long double norm = 0.0L;
      for (std::size_t i = 0; i < rows; ++i) norm += x[i] * x[i];
      norm = std::sqrt(norm);
      if (norm <= 1e-6L * std::sqrt(before_norm)) continue;
      for (std::size_t i = 0; i < rows; ++i) x[i] /= norm, out[i * r + c] = x[i];
      q.push_back(x);
    }
    return out;
  };
  const auto want_a = reference(0, rows_a), want_b = reference(rows_a * r, rows_b);
  for (std::size_t i = 0; i < rows_a * r; ++i) CHECK(p[i] == doctest::Approx(static_cast<double>(want_a[i])).epsilon(1e-6));
  for (std::size_t i = 0; i < rows_b * r; ++i)
    CHECK(p[rows_a * r + i] == doctest::Approx(static_cast<double>(want_b[i])).epsilon(1e-6));
  for (std::size_t i = 0; i < rows_b; ++i) CHECK(p[rows_a * r + i * r + 2] == 0.0f);
  // Invariants: orthonormal columns (to float rounding), and projecting P
  // onto them gives P back (the same span).
  for (std::size_t c = 0; c < r; ++c)
    for (std::size_t d = 0; d < r; ++d) {
      double dot = 0.0;
      for (std::size_t i = 0; i < rows_a; ++i) dot += static_cast<double>(p[i * r + c]) * p[i * r + d];
      CHECK(dot == doctest::Approx(c == d ? 1.0 : 0.0).epsilon(1e-6).scale(1.0));
    }
  for (std::size_t c = 0; c < r; ++c)
    for (std::size_t i = 0; i < rows_b; ++i) {
      double projected = 0.0;
      for (std::size_t d = 0; d < r; ++d) {
        double coef = 0.0;
        for (std::size_t k = 0; k < rows_b; ++k) coef += static_cast<double>(p[rows_a * r + k * r + d]) * original[rows_a * r + k * r + c];
        projected += coef * p[rows_a * r + i * r + d];
      }
      CHECK(projected == doctest::Approx(original[rows_a * r + i * r + c]).epsilon(1e-5));
    }
}

TEST_CASE("low_rank options: rank 0 is a config_error") {
  CHECK_THROWS_WITH_AS(cp::low_rank::validate({.rank = 0}), doctest::Contains("rank must lie in [1, 4096]"),
                       dc::config_error);
}


TEST_CASE("low_rank: a corrupt P or Q segment is refused with format_error on every rank, theta_global unchanged") {
  for (int which : {1, 2}) {
    CAPTURE(which);
    constexpr int m = 3;
    std::atomic<int> precise{0};
    dc::comm::threads::world world(m);
    world.run([&](dc::comm::threads& inner) {
      flaky_gather comm(inner, 2, which, 70);
      std::vector<float> w(30 * 20, 0.0f);
      std::vector<dc::matrix_view<float>> params{{w.data(), 30, 20}};
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, cp::low_rank, flaky_gather> t(
          params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = 2}});
      const auto g = random_normals(600, 80 + static_cast<unsigned>(comm.rank()));
      CHECK(t.step(std::vector<std::vector<float>>{g}));
      const auto gl = t.global_parameters();
      const std::vector<float> before(gl.data(), gl.data() + gl.size());
      comm.arm();
      expect_corrupt_round(comm.rank(), 2, [&] { t.step(std::vector<std::vector<float>>{g}); }, precise);
      CHECK(std::memcmp(gl.data(), before.data(), before.size() * 4) == 0);
      CHECK(t.step(std::vector<std::vector<float>>{g}));
    });
    CHECK(precise.load() == 1);
  }
}

namespace {

// PowerSGD's round (Vogels et al. 2019, arXiv 1905.13727, Algorithm 1 with
// the error feedback of its Algorithm 2), in double, for one rows x cols
// matrix and M workers: M_w = delta_w + e_w; P = mean_w M_w Q;
// P^ = orthogonalize(P) (Gram-Schmidt on the columns); Q_w = M_w^T P^;
// Q = mean_w Q_w; the update is P^ Q^T; e_w = M_w - P^ Q_w^T (the worker's
// own decompression); Q warm-starts the next round.
struct power_sgd_reference {
  std::size_t rows, cols, r;
  std::vector<double> q;                    // cols x r, row-major
  std::vector<std::vector<double>> errors;  // per worker, rows x cols
  // The mean update P^ Q^T of one round, given each worker's delta.
  std::vector<double> round(const std::vector<std::vector<double>>& deltas) {
    const std::size_t m = deltas.size();
    if (errors.empty()) errors.assign(m, std::vector<double>(rows * cols, 0.0));
    std::vector<std::vector<double>> mw(m, std::vector<double>(rows * cols));
    for (std::size_t w = 0; w < m; ++w)
      for (std::size_t i = 0; i < rows * cols; ++i) mw[w][i] = deltas[w][i] + errors[w][i];
    std::vector<double> p(rows * r, 0.0);
    for (std::size_t w = 0; w < m; ++w)
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t c = 0; c < r; ++c) {
          double s = 0.0;
          for (std::size_t j = 0; j < cols; ++j) s += mw[w][i * cols + j] * q[j * r + c];
          p[i * r + c] += s / static_cast<double>(m);
        }
    for (std::size_t c = 0; c < r; ++c) {  // Gram-Schmidt, column by column
      for (std::size_t d = 0; d < c; ++d) {
        double dot = 0.0;
        for (std::size_t i = 0; i < rows; ++i) dot += p[i * r + d] * p[i * r + c];
        for (std::size_t i = 0; i < rows; ++i) p[i * r + c] -= dot * p[i * r + d];
      }
      double norm = 0.0;
      for (std::size_t i = 0; i < rows; ++i) norm += p[i * r + c] * p[i * r + c];
      for (std::size_t i = 0; i < rows; ++i) p[i * r + c] /= std::sqrt(norm);
    }
    std::vector<double> q_mean(cols * r, 0.0);
    for (std::size_t w = 0; w < m; ++w) {
      std::vector<double> qw(cols * r, 0.0);
      for (std::size_t j = 0; j < cols; ++j)
        for (std::size_t c = 0; c < r; ++c)
          for (std::size_t i = 0; i < rows; ++i) qw[j * r + c] += mw[w][i * cols + j] * p[i * r + c];
      for (std::size_t k = 0; k < cols * r; ++k) q_mean[k] += qw[k] / static_cast<double>(m);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
          double approx = 0.0;
          for (std::size_t c = 0; c < r; ++c) approx += p[i * r + c] * qw[j * r + c];
          errors[w][i * cols + j] = mw[w][i * cols + j] - approx;
        }
    }
    q = q_mean;
    std::vector<double> update(rows * cols, 0.0);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j)
        for (std::size_t c = 0; c < r; ++c) update[i * cols + j] += p[i * r + c] * q[j * r + c];
    return update;
  }
};

}  // namespace

TEST_CASE("low_rank: three workers with different matrices follow PowerSGD's update computed in double, 4 rounds") {
  // Inner SGD at lr 1, one step, outer SGD at lr 1: worker w's
  // pseudo-gradient in round k is its gradient G_{w,k} (theta - (theta -
  // G), exact to fp32 rounding), and theta_global moves by minus the mean
  // update. Q's first value is the library's seeded draw, read from the
  // state before the first round (an input, like a seed); everything after
  // it is the reference's own arithmetic.
  constexpr int m = 3, rounds = 4;
  constexpr std::size_t rows = 12, cols = 9, r = 2;
  auto grad = [](int w, int k) { return random_normals(rows * cols, 500 + static_cast<unsigned>(17 * k + w)); };
  std::vector<std::vector<std::vector<float>>> globals(m);  // per worker, per round
  std::vector<float> q0;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(rows * cols, 0.0f);
    std::vector<dc::matrix_view<float>> params{{w.data(), rows, cols}};
    trainer<dc::comm::threads> t(params, comm, {.inner_steps = 1, .inner = {.lr = 1.0f}, .compress = {.rank = r, .seed = 3}});
    if (comm.rank() == 0)
      for (const auto& e : t.state())
        if (e.name.find(".low_rank_q") != std::string::npos) q0.assign(e.data, e.data + e.size);
    for (int k = 0; k < rounds; ++k) {
      REQUIRE(t.step(std::vector<std::vector<float>>{grad(comm.rank(), k)}));
      const auto g = t.global_parameters();
      globals[static_cast<std::size_t>(comm.rank())].emplace_back(g.data(), g.data() + g.size());
    }
  });
  REQUIRE(q0.size() == cols * r);
  power_sgd_reference ref{rows, cols, r, std::vector<double>(q0.begin(), q0.end()), {}};
  std::vector<double> theta(rows * cols, 0.0);
  for (int k = 0; k < rounds; ++k) {
    CAPTURE(k);
    std::vector<std::vector<double>> deltas;
    for (int w = 0; w < m; ++w) {
      const auto g = grad(w, k);
      deltas.emplace_back(g.begin(), g.end());
    }
    const auto update = ref.round(deltas);
    double largest = 0.0;
    for (std::size_t i = 0; i < theta.size(); ++i) theta[i] -= update[i], largest = std::max(largest, std::fabs(theta[i]));
    for (int w = 0; w < m; ++w) {
      CAPTURE(w);
      const auto& got = globals[static_cast<std::size_t>(w)][static_cast<std::size_t>(k)];
      double worst = 0.0;
      for (std::size_t i = 0; i < theta.size(); ++i) worst = std::max(worst, std::fabs(got[i] - theta[i]));
      // fp32 arithmetic against double: a few ulps of the largest entry.
      CHECK(worst <= 1e-5 * largest);
    }
  }
}

TEST_CASE("low_rank: save_bytes, a fresh instance loads it and continues with the bits of the uninterrupted run") {
  // sync::blocking: save has no side effects (nothing in flight).
  constexpr int m = 2;
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    using T = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, cp::low_rank, dc::comm::threads>;
    const T::options opts{.inner_steps = 2, .inner = {.lr = 0.5f}, .compress = {.rank = 2, .seed = 4}};
    std::vector<float> a(16 * 10, 0.0f), b(16 * 10, 1.0f);
    std::vector<dc::matrix_view<float>> pa{{a.data(), 16, 10}}, pb{{b.data(), 16, 10}};
    T t(pa, comm, opts), u(pb, comm, opts);
    auto grads = [&](int s) {
      return std::vector<std::vector<float>>{random_normals(160, 900 + static_cast<unsigned>(7 * s + comm.rank()))};
    };
    check_resume_bits(t, u, a, b, grads, 5, 11);  // saved after 2 rounds and one inner step of the third
  });
}
