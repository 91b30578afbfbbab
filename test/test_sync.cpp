// SPDX-License-Identifier: Apache-2.0
// The sync schedules (the fifth policy): blocking equals streaming with one
// fragment bit for bit; every fragment begins and is applied at exactly the
// steps the definition gives; streaming, one-step delay and eager follow a
// double-precision reference written from their definitions
// (docs/algorithms.md); overlap hides a slow exchange; refused rounds keep
// theta_global; bad options are config_errors; with one worker eager is
// blocking DiLoCo.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <diloco/diloco.hpp>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "same_bits.hpp"
#include "threads_link.hpp"

namespace dc = diloco;

namespace {

// ------------------------------------------------------------ a problem
// Worker m's loss: 1/2 ||w - c_m||^2 over tensors of the given sizes, so its
// gradient is w - c_m (c_m differs per worker and element).
float target(int m, std::size_t tensor, std::size_t i) {
  return 0.5f + 0.25f * static_cast<float>(m) - 0.125f * static_cast<float>(tensor) + 0.03125f * static_cast<float>(i);
}

struct model {
  std::vector<std::vector<float>> w;
  explicit model(const std::vector<std::size_t>& sizes) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) w[k][i] = 0.1f * static_cast<float>(k + 1) - 0.01f * static_cast<float>(i);
    }
  }
  std::vector<std::vector<float>> grads(int m) const {
    auto g = w;
    for (std::size_t k = 0; k < w.size(); ++k)
      for (std::size_t i = 0; i < w[k].size(); ++i) g[k][i] = w[k][i] - target(m, k, i);
    return g;
  }
};

template <class Sync, class Compressor = dc::compress::none>
using sgd_trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, Compressor, dc::comm::threads, Sync>;

// theta_global of each tensor after every step, and the final replicas.
struct run_result {
  std::vector<std::vector<float>> global_after_step;  // flat, model order
  std::vector<std::vector<float>> replica;            // final, model order
};

template <class Trainer>
run_result train(Trainer& t, model& mdl, int m, int steps) {
  run_result r;
  for (int s = 0; s < steps; ++s) {
    t.step(mdl.grads(m));
    const auto g = t.global_parameters();
    std::vector<float> flat;
    for (std::size_t k = 0; k < mdl.w.size(); ++k)
      flat.insert(flat.end(), g.data() + t.global_offset(k), g.data() + t.global_offset(k) + mdl.w[k].size());
    r.global_after_step.push_back(flat);
  }
  for (auto& w : mdl.w) r.replica.push_back(w);
  return r;
}

}  // namespace

TEST_CASE("streaming with P = 1, tau = 0, alpha = 0 is sync::blocking bit for bit (4 workers, fp32 and int8+EF)") {
  const std::vector<std::size_t> sizes{3, 130, 7, 64};
  const int workers = 4, h = 5, steps = 3 * h + 2;
  auto compare = [&]<class Compressor>(Compressor) {
    std::vector<run_result> blocking(workers), streaming(workers);
    dc::comm::threads::world world(workers);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model a(sizes), b(sizes);
      sgd_trainer<dc::sync::blocking, Compressor> tb(a.w, comm, {.inner_steps = h, .inner = {.lr = 0.1f}});
      sgd_trainer<dc::sync::streaming, Compressor> ts(
          b.w, comm, {.inner_steps = h, .inner = {.lr = 0.1f}, .sync = {.fragments = 1, .delay = 0, .alpha = 0.0f}});
      blocking[static_cast<std::size_t>(m)] = train(tb, a, m, steps);
      streaming[static_cast<std::size_t>(m)] = train(ts, b, m, steps);
      CHECK(tb.stats().rounds == 3);
      CHECK(ts.stats().rounds == 3);
      CHECK(tb.stats().bytes_sent == ts.stats().bytes_sent);
    });
    for (int m = 0; m < workers; ++m) {
      const auto& x = blocking[static_cast<std::size_t>(m)];
      const auto& y = streaming[static_cast<std::size_t>(m)];
      for (int s = 0; s < steps; ++s)
        CHECK(std::memcmp(x.global_after_step[static_cast<std::size_t>(s)].data(),
                          y.global_after_step[static_cast<std::size_t>(s)].data(),
                          x.global_after_step[static_cast<std::size_t>(s)].size() * sizeof(float)) == 0);
      for (std::size_t k = 0; k < sizes.size(); ++k)
        CHECK(std::memcmp(x.replica[k].data(), y.replica[k].data(), sizes[k] * sizeof(float)) == 0);
    }
    // The outer step moved theta_global: the comparison is not of constants.
    CHECK(blocking[0].global_after_step.back() != blocking[0].global_after_step.front());
  };
  SUBCASE("fp32") { compare(dc::compress::none{}); }
  SUBCASE("int8 + error feedback") { compare(dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>{}); }
}

namespace {

// Records, per fp32 all-reduce (blocking or not), the step it was started
// in and its length: one reduction of fragment p is one all-reduce of
// (its elements + M) floats.
class recording_link : public threads_host_link {
 public:
  recording_link(dc::comm::threads& c, const std::atomic<int>& step) : threads_host_link(c), step_(step) {}
  void all_reduce(std::span<float> b, dc::reduce_op op) {
    calls.emplace_back(step_.load(), b.size());
    threads_host_link::all_reduce(b, op);
  }
  request iall_reduce(std::span<float> b, dc::reduce_op op) {
    calls.emplace_back(step_.load(), b.size());
    return threads_host_link::iall_reduce(b, op);
  }
  std::vector<std::pair<int, std::size_t>> calls;

 private:
  const std::atomic<int>& step_;
};

}  // namespace

TEST_CASE("streaming: every fragment begins and is applied exactly at the steps of the definition") {
  // Sizes whose subset sums differ, so a reduction's length names its fragment.
  const std::vector<std::size_t> sizes{1, 2, 4, 8};
  const int workers = 2;
  int checked = 0, refused = 0;
  for (std::size_t P : {1u, 2u, 3u, 4u})
    for (std::size_t H : {4u, 6u, 10u})
      for (std::size_t tau : {0u, 1u, 2u}) {
        CAPTURE(P);
        CAPTURE(H);
        CAPTURE(tau);
        const bool valid = P <= H && P <= sizes.size() && tau + 1 <= H / P;
        const dc::sync::streaming::options so{.fragments = P, .delay = tau, .alpha = 0.0f};
        if (!valid) {
          dc::comm::threads::world world(1);
          world.run([&](dc::comm::threads& comm) {
            model mdl(sizes);
            CHECK_THROWS_AS(sgd_trainer<dc::sync::streaming>(mdl.w, comm, {.inner_steps = H, .sync = so}),
                            dc::config_error);
          });
          ++refused;
          continue;
        }
        // The definition: s_p = floor((p+1) H / P); applied after t = s_p + kH,
        // begun after t = s_p + kH - tau.
        const int steps = static_cast<int>(3 * H);
        std::map<std::size_t, std::vector<int>> want_begin, want_apply;  // keyed by fragment
        for (std::size_t p = 0; p < P; ++p) {
          const std::size_t sp = (p + 1) * H / P;
          for (std::size_t t = sp; t <= static_cast<std::size_t>(steps); t += H) {
            want_apply[p].push_back(static_cast<int>(t));
            want_begin[p].push_back(static_cast<int>(t - tau));
          }
        }
        std::vector<std::map<std::size_t, std::vector<int>>> got_begin(workers), got_apply(workers);
        std::vector<std::vector<std::size_t>> owner(workers);
        dc::comm::threads::world world(workers);
        world.run([&](dc::comm::threads& comm) {
          const int m = comm.rank();
          std::atomic<int> step{0};
          recording_link link(comm, step);
          model mdl(sizes);
          dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, recording_link, dc::sync::streaming>
              t(mdl.w, link, {.inner_steps = H, .inner = {.lr = 0.1f}, .sync = so});
          REQUIRE(t.fragment_count() == P);
          // Each tensor in exactly one fragment; a fragment's all-reduce has
          // its elements + M floats.
          std::map<std::size_t, std::size_t> length_to_fragment;
          std::vector<std::size_t> elements(P, 0);
          for (std::size_t k = 0; k < sizes.size(); ++k) {
            REQUIRE(t.fragment_of(k) < P);
            elements[t.fragment_of(k)] += sizes[k];
            owner[static_cast<std::size_t>(m)].push_back(t.fragment_of(k));
          }
          for (std::size_t p = 0; p < P; ++p) {
            REQUIRE(elements[p] > 0);
            length_to_fragment[elements[p] + workers] = p;
          }
          link.calls.clear();  // the initial broadcast is not an all-reduce, but be sure
          std::vector<std::uint64_t> sent(P, 0);
          for (int s = 1; s <= steps; ++s) {
            step = s;
            const bool applied = t.step(mdl.grads(m));
            bool any = false;
            for (std::size_t p = 0; p < P; ++p)
              if (t.stats().fragment_bytes_sent[p] != sent[p]) {
                got_apply[static_cast<std::size_t>(m)][p].push_back(s);
                sent[p] = t.stats().fragment_bytes_sent[p];
                any = true;
              }
            CHECK(applied == any);
          }
          for (auto [s, len] : link.calls) {
            REQUIRE(length_to_fragment.count(len) == 1);
            got_begin[static_cast<std::size_t>(m)][length_to_fragment[len]].push_back(s);
          }
        });
        for (int m = 0; m < workers; ++m) {
          CHECK(got_begin[static_cast<std::size_t>(m)] == want_begin);
          CHECK(got_apply[static_cast<std::size_t>(m)] == want_apply);
        }
        CHECK(owner[0] == owner[1]);
        ++checked;
      }
  // The grid has both kinds.
  CHECK(checked > 10);
  CHECK(refused > 5);
}

TEST_CASE("streaming: contiguous and strided assignment of tensors to fragments") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    auto assignment = [&](std::vector<std::size_t> sizes, std::size_t P, dc::sync::fragment_assignment a) {
      model mdl(sizes);
      sgd_trainer<dc::sync::streaming> t(mdl.w, comm, {.inner_steps = 8, .sync = {.fragments = P, .assignment = a}});
      std::vector<std::size_t> out;
      for (std::size_t k = 0; k < sizes.size(); ++k) out.push_back(t.fragment_of(k));
      return out;
    };
    using fa = dc::sync::fragment_assignment;
    // Totals 16: cuts where the running size first reaches 8 (P = 2), or
    // 16/3 and 32/3 (P = 3).
    CHECK(assignment({4, 4, 4, 4}, 2, fa::contiguous) == std::vector<std::size_t>{0, 0, 1, 1});
    CHECK(assignment({4, 4, 4, 4}, 3, fa::contiguous) == std::vector<std::size_t>{0, 0, 1, 2});
    CHECK(assignment({1, 1, 6, 8}, 2, fa::contiguous) == std::vector<std::size_t>{0, 0, 0, 1});
    // A large first tensor would take every cut: each fragment keeps one.
    CHECK(assignment({100, 1, 1}, 3, fa::contiguous) == std::vector<std::size_t>{0, 1, 2});
    CHECK(assignment({4, 4, 4, 4, 4}, 2, fa::strided) == std::vector<std::size_t>{0, 1, 0, 1, 0});
  });
}

namespace {

// ------------------------------------------- double-precision references
// Two workers, inner SGD (lr eta) on 1/2 ||w - c_m||^2, outer Nesterov (lr,
// mu) exactly as torch.optim.SGD(nesterov=True): b = d on a fragment's
// first step, else b = mu b + d; theta -= lr (d + mu b).
constexpr double eta = 0.1, outer_lr = 0.7, mu = 0.9;
constexpr int M = 2;

struct nesterov_ref {
  std::vector<double> b;
  std::uint64_t steps = 0;
  void step(std::vector<double>& theta, const std::vector<double>& d, std::size_t lo, std::size_t hi) {
    if (b.size() < theta.size()) b.assign(theta.size(), 0.0);
    for (std::size_t i = lo; i < hi; ++i) {
      b[i] = steps == 0 ? d[i] : mu * b[i] + d[i];
      theta[i] -= outer_lr * (d[i] + mu * b[i]);
    }
    ++steps;
  }
};

using vec = std::vector<double>;

vec flat_targets(int m, const std::vector<std::size_t>& sizes) {
  vec c;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::size_t i = 0; i < sizes[k]; ++i) c.push_back(target(m, k, i));
  return c;
}
vec flat_init(const std::vector<std::size_t>& sizes) {
  model mdl(sizes);
  vec w;
  for (auto& t : mdl.w) w.insert(w.end(), t.begin(), t.end());
  return w;
}
void inner_step(vec& w, const vec& c) {
  for (std::size_t i = 0; i < w.size(); ++i) w[i] -= eta * (w[i] - c[i]);
}

// The library's theta_global and replica of worker m after every step.
struct observed {
  std::vector<vec> global, local;
};

template <class Sync>
std::vector<observed> run_library(const std::vector<std::size_t>& sizes, int steps, std::size_t H,
                                  typename Sync::options so) {
  std::vector<observed> out(M);
  dc::comm::threads::world world(M);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    model mdl(sizes);
    sgd_trainer<Sync> t(mdl.w, comm,
                        {.inner_steps = H, .inner = {.lr = static_cast<float>(eta)},
                         .outer = {.lr = static_cast<float>(outer_lr), .momentum = static_cast<float>(mu)}, .sync = so});
    for (int s = 1; s <= steps; ++s) {
      t.step(mdl.grads(m));
      vec g, l;
      const auto gp = t.global_parameters();
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        for (std::size_t i = 0; i < sizes[k]; ++i) g.push_back(gp.data()[t.global_offset(k) + i]);
        l.insert(l.end(), mdl.w[k].begin(), mdl.w[k].end());
      }
      out[static_cast<std::size_t>(m)].global.push_back(g);
      out[static_cast<std::size_t>(m)].local.push_back(l);
    }
  });
  return out;
}

double rel_err(const vec& want, const vec& got) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (want[i] - got[i]) * (want[i] - got[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

void check_against(const std::vector<observed>& lib, const std::vector<vec>& ref_global,
                   const std::vector<std::vector<vec>>& ref_local) {
  for (std::size_t s = 0; s < ref_global.size(); ++s) {
    CAPTURE(s + 1);
    for (int m = 0; m < M; ++m) {
      CHECK(rel_err(ref_global[s], lib[static_cast<std::size_t>(m)].global[s]) <= 1e-5);
      CHECK(rel_err(ref_local[static_cast<std::size_t>(m)][s], lib[static_cast<std::size_t>(m)].local[s]) <= 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("streaming (P = 2, tau = 1, alpha = 0.5): three rounds against the definition in double precision") {
  // Two tensors, contiguous: fragment 0 = tensor 0, fragment 1 = tensor 1.
  const std::vector<std::size_t> sizes{3, 3};
  const std::size_t H = 4, tau = 1;
  const double alpha = 0.5;
  const int steps = 3 * static_cast<int>(H);
  const std::size_t cut = 3;
  // s_0 = 2, s_1 = 4: fragment 0 begins after steps 1, 5, 9 and is applied
  // after 2, 6, 10; fragment 1 begins after 3, 7, 11, applied after 4, 8, 12.
  vec global = flat_init(sizes);
  std::vector<vec> w(M, global), snap(M);
  std::vector<vec> c{flat_targets(0, sizes), flat_targets(1, sizes)};
  nesterov_ref outer;
  std::vector<nesterov_ref> frag(2);
  std::vector<vec> ref_global;
  std::vector<std::vector<vec>> ref_local(M);
  for (int t = 1; t <= steps; ++t) {
    for (int m = 0; m < M; ++m) inner_step(w[static_cast<std::size_t>(m)], c[static_cast<std::size_t>(m)]);
    for (std::size_t p = 0; p < 2; ++p) {
      const std::size_t lo = p == 0 ? 0 : cut, hi = p == 0 ? cut : 2 * cut;
      const int sp = static_cast<int>((p + 1) * H / 2);
      if ((t + static_cast<int>(tau) - sp) % static_cast<int>(H) == 0)  // begin: snapshot Δ_m,p
        for (int m = 0; m < M; ++m) {
          auto& d = snap[static_cast<std::size_t>(m)];
          d.resize(global.size());
          for (std::size_t i = lo; i < hi; ++i) d[i] = global[i] - w[static_cast<std::size_t>(m)][i];
        }
      if ((t - sp) % static_cast<int>(H) == 0) {  // apply
        vec mean(global.size(), 0.0);
        for (std::size_t i = lo; i < hi; ++i) mean[i] = (snap[0][i] + snap[1][i]) / M;
        frag[p].step(global, mean, lo, hi);
        for (int m = 0; m < M; ++m)
          for (std::size_t i = lo; i < hi; ++i)
            w[static_cast<std::size_t>(m)][i] = alpha * w[static_cast<std::size_t>(m)][i] + (1 - alpha) * global[i];
      }
    }
    ref_global.push_back(global);
    for (int m = 0; m < M; ++m) ref_local[static_cast<std::size_t>(m)].push_back(w[static_cast<std::size_t>(m)]);
  }
  const auto lib = run_library<dc::sync::streaming>(sizes, steps, H, {.fragments = 2, .delay = tau, .alpha = 0.5f});
  check_against(lib, ref_global, ref_local);
  CHECK(ref_global.back() != flat_init(sizes));
}

TEST_CASE("one-step delay and eager: three rounds against the definitions in double precision") {
  const std::vector<std::size_t> sizes{2, 3};
  const std::size_t H = 3;
  const int steps = 4 * static_cast<int>(H);  // four phases: three applied rounds
  // Eager with the paper's fresh weight 1/M (fresh_weight 0), then with
  // w = 0.75 (exact in float): the worker's step along mean − w·own + w·fresh.
  for (const double fresh_weight : {-1.0, 0.0, 0.75}) {
    const bool is_eager = fresh_weight >= 0.0;
    const double wf = fresh_weight > 0.0 ? fresh_weight : 1.0 / M;
    CAPTURE(fresh_weight);
    vec global = flat_init(sizes);
    const std::size_t n = global.size();
    std::vector<vec> w(M, global), start(M, global), own(M, vec(n, 0.0));
    std::vector<vec> c{flat_targets(0, sizes), flat_targets(1, sizes)};
    nesterov_ref outer;
    std::vector<nesterov_ref> worker(M);  // eager: each worker's own outer state
    bool in_flight = false;
    vec mean(n, 0.0);
    std::vector<vec> ref_global;
    std::vector<std::vector<vec>> ref_local(M);
    for (int t = 1; t <= steps; ++t) {
      for (int m = 0; m < M; ++m) inner_step(w[static_cast<std::size_t>(m)], c[static_cast<std::size_t>(m)]);
      if (t % static_cast<int>(H) == 0) {
        std::vector<vec> fresh(M, vec(n));
        for (int m = 0; m < M; ++m)
          for (std::size_t i = 0; i < n; ++i)
            fresh[static_cast<std::size_t>(m)][i] = start[static_cast<std::size_t>(m)][i] - w[static_cast<std::size_t>(m)][i];
        if (is_eager) {
          // Every phase end (the first too, with nothing owed): the worker
          // steps its replica from where the phase started with its own
          // outer state along mean - own/M + fresh/M (mean and own zero
          // while nothing is in flight); theta_g takes the delayed mean.
          for (int m = 0; m < M; ++m) {
            const auto um = static_cast<std::size_t>(m);
            vec x = start[um], ge(n);
            for (std::size_t i = 0; i < n; ++i) ge[i] = mean[i] - wf * own[um][i] + wf * fresh[um][i];
            worker[um].step(x, ge, 0, n);
            w[um] = x;
          }
          if (in_flight) outer.step(global, mean, 0, n);
        } else if (in_flight) {
          outer.step(global, mean, 0, n);
          for (int m = 0; m < M; ++m)
            for (std::size_t i = 0; i < n; ++i)
              w[static_cast<std::size_t>(m)][i] = global[i] - fresh[static_cast<std::size_t>(m)][i];
        }
        for (int m = 0; m < M; ++m) {
          start[static_cast<std::size_t>(m)] = w[static_cast<std::size_t>(m)];
          own[static_cast<std::size_t>(m)] = fresh[static_cast<std::size_t>(m)];
        }
        for (std::size_t i = 0; i < n; ++i) mean[i] = (fresh[0][i] + fresh[1][i]) / M;
        in_flight = true;
      }
      ref_global.push_back(global);
      for (int m = 0; m < M; ++m) ref_local[static_cast<std::size_t>(m)].push_back(w[static_cast<std::size_t>(m)]);
    }
    // outer_lr names the reference's 0.7: eager's default follows M.
    const auto lib = is_eager ? run_library<dc::sync::eager>(sizes, steps, H,
                                                             {.outer_lr = static_cast<float>(outer_lr),
                                                              .fresh_weight = static_cast<float>(fresh_weight)})
                              : run_library<dc::sync::one_step_delay>(sizes, steps, H, {});
    check_against(lib, ref_global, ref_local);
    CHECK(outer.steps == 3);
    if (is_eager) CHECK(worker[0].steps == 4);
  }
}

TEST_CASE("finish() applies the reduction in flight; step() says when something was applied") {
  const std::vector<std::size_t> sizes{4, 4};
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    model mdl(sizes);
    sgd_trainer<dc::sync::one_step_delay> t(mdl.w, comm, {.inner_steps = 3, .inner = {.lr = 0.1f}});
    std::vector<bool> applied;
    for (int s = 0; s < 6; ++s) applied.push_back(t.step(mdl.grads(comm.rank())));
    // Phase 1 only begins; phase 2 applies round 1.
    CHECK(applied == std::vector<bool>{false, false, false, false, false, true});
    CHECK(t.stats().rounds == 1);
    CHECK(t.steps_in_round() == 0);
    t.step(mdl.grads(comm.rank()));
    CHECK(t.steps_in_round() == 1);
    const std::vector<float> before(t.global_parameters().data(), t.global_parameters().data() + 8);
    t.finish();  // round 2 (begun after step 6) is applied now
    CHECK(t.stats().rounds == 2);
    const std::vector<float> after(t.global_parameters().data(), t.global_parameters().data() + 8);
    CHECK(before != after);
    t.finish();  // nothing in flight: no change
    CHECK(t.stats().rounds == 2);
    // Training goes on: the next phase end only begins (nothing in flight).
    CHECK_FALSE(t.step(mdl.grads(comm.rank())));
    CHECK_FALSE(t.step(mdl.grads(comm.rank())));
    CHECK(t.stats().rounds == 2);
    for (int s = 0; s < 3; ++s) t.step(mdl.grads(comm.rank()));
    CHECK(t.stats().rounds == 3);
  });
}

TEST_CASE("state(): every stateful part by name") {
  const std::vector<std::size_t> sizes{5, 3};
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    model mdl(sizes);
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>,
                  dc::comm::threads, dc::sync::eager>
        t(mdl.w, comm, {.inner_steps = 2});
    for (int s = 0; s < 4; ++s) t.step(mdl.grads(0));
    std::map<std::string, dc::state_entry> by_name;
    for (auto& e : t.state()) by_name[e.name] = e;
    for (const char* b : {"theta_global", "outer.slots", "inner.slots", "fragment.0.residual", "schedule.anchor",
                          "schedule.own", "schedule.eager_slots"}) {
      CAPTURE(b);
      REQUIRE(by_name.count(b) == 1);
      CHECK_FALSE(by_name[b].is_scalar);
    }
    CHECK(by_name["theta_global"].size == 8);
    CHECK(by_name["outer.slots"].size == 8);       // Nesterov: one slot
    CHECK(by_name["inner.slots"].size == 16);      // AdamW: two slots
    CHECK(by_name["theta_global"].data == t.global_parameters().data());
    CHECK(by_name["inner.steps"].value == 4);
    CHECK(by_name["schedule.position"].value == 4);
    CHECK(by_name["rounds"].value == 1);
    CHECK(by_name["fragment.0.outer_steps"].value == 1);
    CHECK(by_name["schedule.eager_steps"].value == 2);  // one per phase end
    CHECK(by_name["schedule.eager_slots"].size == 8);
  });
}

namespace {

// Blocked seconds per applied round of sync::blocking over slow_link (d per
// collective, on the caller's thread), H = 4, 4 phases.
double blocking_blocked_per_round(std::chrono::milliseconds d) {
  constexpr std::size_t H = 4;
  std::vector<double> per_round(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    slow_link<false> link(comm, d);
    model mdl({16, 16});
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, slow_link<false>, dc::sync::blocking> t(
        mdl.w, link, {.inner_steps = H, .inner = {.lr = 0.1f}});
    for (std::size_t s = 0; s < 4 * H; ++s) t.step(mdl.grads(comm.rank()));
    per_round[static_cast<std::size_t>(comm.rank())] =
        t.stats().blocked_seconds / static_cast<double>(t.stats().rounds);
    t.finish();
  });
  return std::max(per_round[0], per_round[1]);
}

// What overlap_gate (threads_link.hpp) counted on one rank: before finish()
// and after it.
struct gate_counts {
  int overlapped = 0, waited = 0, hung = 0;
  std::uint64_t rounds = 0;
};

// Two workers over gated_link, H = 4, 4 phases, then finish(): each inner
// step is announced to the gate before step() (and lasts until what it
// released has completed).
template <class Sync>
std::vector<std::pair<gate_counts, gate_counts>> gated_run() {
  constexpr std::size_t H = 4;
  std::vector<std::pair<gate_counts, gate_counts>> out(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    overlap_gate gate;
    gated_link<false> link(comm, gate);
    model mdl({16, 16});
    dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, gated_link<false>, Sync> t(
        mdl.w, link, {.inner_steps = H, .inner = {.lr = 0.1f}});
    gate.restart_counts();
    for (std::size_t s = 0; s < 4 * H; ++s) {
      gate.step();
      t.step(mdl.grads(comm.rank()));
    }
    auto& mine = out[static_cast<std::size_t>(comm.rank())];
    mine.first = {gate.overlapped(), gate.waited(), gate.hung(), t.stats().rounds};
    t.finish();
    mine.second = {gate.overlapped(), gate.waited(), gate.hung(), t.stats().rounds};
  });
  return out;
}

}  // namespace

TEST_CASE("overlap is real: one-step delay hides an exchange that a blocking round waits for") {
  // The exchange is hidden when its collective (fp32: one all-reduce a
  // round) runs while the worker takes inner steps: counted by the gate, an
  // event, not a time. one_step_delay begins rounds after steps 4, 8, 12
  // and 16 and applies each at the next phase end: rounds 1-3 were released
  // by an inner step (overlapped) and nothing was waited for; round 4 is
  // begun by the last step, so finish() waits for it (nothing is left to
  // hide it behind).
  SUBCASE("one_step_delay: every round's collective overlaps an inner step") {
    const auto ranks = gated_run<dc::sync::one_step_delay>();
    for (std::size_t m = 0; m < 2; ++m) {
      CAPTURE(m);
      const gate_counts& before = ranks[m].first;
      const gate_counts& after = ranks[m].second;
      CHECK(before.rounds == 3);
      CHECK(before.overlapped == 3);
      CHECK(before.waited == 0);
      CHECK(after.rounds == 4);
      CHECK(after.overlapped == 3);
      CHECK(after.waited == 1);
      CHECK(after.hung == 0);
    }
  }
  // The same link sees the opposite when the schedule waits for its
  // exchange: sync::blocking runs each round's all-reduce at the phase end
  // with no inner step beside it.
  SUBCASE("blocking: every round's collective is waited for") {
    const auto ranks = gated_run<dc::sync::blocking>();
    for (std::size_t m = 0; m < 2; ++m) {
      CAPTURE(m);
      const gate_counts& after = ranks[m].second;
      CHECK(after.rounds == 4);
      CHECK(after.overlapped == 0);
      CHECK(after.waited == 4);
      CHECK(after.hung == 0);
    }
  }
  // A blocking round's wait is accounted: the link sleeps d = 60 ms inside
  // each round's all-reduce, on the caller's thread (a lower bound that
  // the sleep guarantees, whatever the scheduler does).
  SUBCASE("blocking: blocked_seconds holds the link's wait") {
    const double blocking = blocking_blocked_per_round(std::chrono::milliseconds(60));
    MESSAGE("blocked per round: blocking ", blocking, " s");
    CHECK(blocking >= 0.055);
  }
}

TEST_CASE("a non-finite pseudo-gradient under streaming and one-step delay: refused on every rank, training goes on") {
  const std::vector<std::size_t> sizes{4, 4};
  SUBCASE("streaming: only the fragment's tensors are reset") {
    // The reference, in double, from docs/algorithms.md §2 and §6: H = 4,
    // P = 2 (contiguous: fragment 0 = tensor 0, fragment 1 = tensor 1), τ = 1,
    // α = 0 (the default), outer Nesterov at its documented defaults (lr 0.7,
    // μ 0.9: nesterov_ref), inner SGD at lr 0.1. s = (2, 4): fragment 0 begins
    // after 1, 5, 9, 13 and is applied after 2, 6, 10, 14; fragment 1 begins
    // after 3, 7, 11, 15 and is applied after 4, 8, 12, 16. Before step 7 rank
    // 1's tensor 1 element 2 becomes NaN, so fragment 1's reduction begun
    // after step 7 is refused at step 8: θ_g and S_1 (its step count too) stay,
    // both ranks' tensor 1 becomes θ_g,1, and tensor 0 is left alone.
    const std::size_t H = 4, tau = 1, half = 4;
    std::vector<vec> ref_global;                     // after every step
    std::vector<std::vector<vec>> ref_local(M);      // after every step
    {
      vec global = flat_init(sizes);
      std::vector<vec> w(M, global), snap(M, vec(global.size(), 0.0));
      const std::vector<vec> c{flat_targets(0, sizes), flat_targets(1, sizes)};
      std::vector<nesterov_ref> frag(2);
      for (int t = 1; t <= 16; ++t) {
        if (t == 7) w[1][half + 2] = std::numeric_limits<double>::quiet_NaN();
        for (std::size_t um = 0; um < M; ++um) inner_step(w[um], c[um]);
        for (std::size_t p = 0; p < 2; ++p) {
          const std::size_t lo = p * half, hi = lo + half;
          const int sp = static_cast<int>((p + 1) * H / 2);
          if ((t + static_cast<int>(tau) - sp) % static_cast<int>(H) == 0)  // begin: Δ_m,p = θ_g,p − θ_m,p
            for (std::size_t um = 0; um < M; ++um)
              for (std::size_t i = lo; i < hi; ++i) snap[um][i] = global[i] - w[um][i];
          if ((t - sp) % static_cast<int>(H) != 0) continue;
          bool finite = true;
          for (std::size_t um = 0; um < M; ++um)
            for (std::size_t i = lo; i < hi; ++i) finite = finite && std::isfinite(snap[um][i]);
          if (finite) {
            vec mean(global.size(), 0.0);
            for (std::size_t i = lo; i < hi; ++i) mean[i] = (snap[0][i] + snap[1][i]) / M;
            frag[p].step(global, mean, lo, hi);
          }
          for (std::size_t um = 0; um < M; ++um)  // α = 0 merge, or the refusal's reset: both θ_m,p ← θ_g,p
            for (std::size_t i = lo; i < hi; ++i) w[um][i] = global[i];
        }
        ref_global.push_back(global);
        for (std::size_t um = 0; um < M; ++um) ref_local[um].push_back(w[um]);
      }
      REQUIRE(frag[0].steps == 4);
      REQUIRE(frag[1].steps == 3);  // the refused application did not count
    }
    auto part = [](const vec& x, std::size_t k) {
      return vec(x.begin() + static_cast<std::ptrdiff_t>(k * half), x.begin() + static_cast<std::ptrdiff_t>((k + 1) * half));
    };
    auto as_vec = [](const float* p, std::size_t n) { return vec(p, p + n); };
    // A wrong reset of fragment 0 at step 8 would put tensor 0 at θ_g,0, which
    // the reference puts far outside the tolerance used below (1e-5).
    for (std::size_t um = 0; um < M; ++um)
      CHECK(rel_err(part(ref_local[um][7], 0), part(ref_global[7], 0)) > 1e-2);
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl(sizes);
      sgd_trainer<dc::sync::streaming> t(mdl.w, comm,
                                         {.inner_steps = 4, .inner = {.lr = 0.1f}, .sync = {.fragments = 2, .delay = 1}});
      const auto um = static_cast<std::size_t>(m);
      for (int s = 0; s < 4; ++s) t.step(mdl.grads(m));  // fragments 0 and 1 applied once
      REQUIRE(t.stats().rounds == 2);
      auto global_flat = [&] {  // theta_global in model order
        vec g;
        for (std::size_t k = 0; k < 2; ++k) {
          const vec x = as_vec(t.global_parameters().data() + t.global_offset(k), half);
          g.insert(g.end(), x.begin(), x.end());
        }
        return g;
      };
      const vec g0 = global_flat();
      CHECK(rel_err(ref_global[3], g0) <= 1e-5);
      auto replica = [&] {
        vec r(mdl.w[0].begin(), mdl.w[0].end());
        r.insert(r.end(), mdl.w[1].begin(), mdl.w[1].end());
        return r;
      };
      CHECK(rel_err(ref_local[um][3], replica()) <= 1e-5);
      t.step(mdl.grads(m));  // step 5: fragment 0 begins
      // Fragment 0 (tensor 0) went bad on rank 1 before it began? No: after.
      // Poison before the next begin instead: step 6 applies fragment 0 fine.
      t.step(mdl.grads(m));
      REQUIRE(t.stats().rounds == 3);
      if (m == 1) mdl.w[1][2] = std::numeric_limits<float>::quiet_NaN();  // tensor 1 = fragment 1
      t.step(mdl.grads(m));  // step 7: fragment 1 begins with a NaN on rank 1
      const std::vector<float> before(t.global_parameters().data(), t.global_parameters().data() + 8);
      const std::vector<float> tensor0 = mdl.w[0];
      CHECK_THROWS_AS(t.step(mdl.grads(m)), dc::numeric_error);  // step 8: applied -> refused everywhere
      const std::vector<float> after(t.global_parameters().data(), t.global_parameters().data() + 8);
      CHECK(std::memcmp(before.data(), after.data(), 8 * sizeof(float)) == 0);
      CHECK(t.stats().rejected_rounds == 1);
      // Fragment 1's tensor is theta_global again; fragment 0's kept its step 8 progress.
      for (std::size_t i = 0; i < 4; ++i) CHECK(mdl.w[1][i] == after[t.global_offset(1) + i]);
      CHECK(mdl.w[0] != tensor0);  // step 8's inner step ran
      // Exactly: tensor 0 is step 7's value after one inner SGD step
      // (p − lr·(p − c), each operation rounded in fp32; volatile keeps the
      // compiler from fusing them), and not reset.
      for (std::size_t i = 0; i < 4; ++i) {
        const volatile float grad = tensor0[i] - target(m, 0, i);
        const volatile float move = 0.1f * grad;
        const float want = tensor0[i] - move;
        CAPTURE(i);
        CHECK(mdl.w[0][i] == want);
      }
      // theta_global as step 6 left it, and both tensors where the reference
      // puts them (tensor 0 with its progress, tensor 1 reset to θ_g,1).
      CHECK(rel_err(ref_global[7], global_flat()) <= 1e-5);
      CHECK(rel_err(part(ref_local[um][7], 0), part(replica(), 0)) <= 1e-5);
      CHECK(rel_err(part(ref_local[um][7], 1), part(replica(), 1)) <= 1e-5);
      for (int s = 0; s < 8; ++s) t.step(mdl.grads(m));
      CHECK(t.stats().rounds == 7);
      for (float v : mdl.w[1]) CHECK(std::isfinite(v));
      // Training went on by step number, S_1's count untouched by the refusal.
      CHECK(rel_err(ref_global[15], global_flat()) <= 1e-5);
      CHECK(rel_err(ref_local[um][15], replica()) <= 1e-5);
    });
  }
  SUBCASE("one-step delay: the replica is reset and nothing stays in flight") {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl(sizes);
      sgd_trainer<dc::sync::one_step_delay> t(mdl.w, comm, {.inner_steps = 3, .inner = {.lr = 0.1f}});
      for (int s = 0; s < 6; ++s) t.step(mdl.grads(m));
      REQUIRE(t.stats().rounds == 1);
      if (m == 0) mdl.w[0][0] = std::numeric_limits<float>::infinity();
      for (int s = 0; s < 2; ++s) t.step(mdl.grads(m));
      // Phase 3 ends: round 2 is applied, and round 3 (with the Inf) is
      // refused as it begins, not a phase later (issue 38, item 5).
      CHECK_THROWS_AS(t.step(mdl.grads(m)), dc::numeric_error);
      REQUIRE(t.stats().rounds == 2);
      const std::vector<float> after(t.global_parameters().data(), t.global_parameters().data() + 8);
      for (std::size_t k = 0; k < 2; ++k)
        for (std::size_t i = 0; i < 4; ++i) CHECK(mdl.w[k][i] == after[t.global_offset(k) + i]);
      for (int s = 0; s < 2; ++s) t.step(mdl.grads(m));  // nothing in flight: theta_global stays
      CHECK(std::memcmp(t.global_parameters().data(), after.data(), 8 * sizeof(float)) == 0);
      t.finish();  // nothing in flight
      CHECK(t.stats().rounds == 2);
      for (int s = 0; s < 6; ++s) t.step(mdl.grads(m));  // begins, then applies
      CHECK(t.stats().rounds == 3);
    });
  }
  SUBCASE("eager: the replica and the worker's own outer state re-join the shared ones") {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl(sizes);
      sgd_trainer<dc::sync::eager> t(mdl.w, comm, {.inner_steps = 3, .inner = {.lr = 0.1f}});
      for (int s = 0; s < 6; ++s) t.step(mdl.grads(m));
      REQUIRE(t.stats().rounds == 1);
      if (m == 1) mdl.w[1][2] = std::numeric_limits<float>::quiet_NaN();
      for (int s = 0; s < 2; ++s) t.step(mdl.grads(m));
      // Round 2 applied, round 3 (NaN) refused as it begins (issue 38, item 5).
      CHECK_THROWS_AS(t.step(mdl.grads(m)), dc::numeric_error);
      REQUIRE(t.stats().rounds == 2);
      const std::vector<float> after(t.global_parameters().data(), t.global_parameters().data() + 8);
      for (std::size_t k = 0; k < 2; ++k)
        for (std::size_t i = 0; i < 4; ++i) CHECK(mdl.w[k][i] == after[t.global_offset(k) + i]);
      std::map<std::string, dc::state_entry> st;
      for (auto& e : t.state()) st[e.name] = e;
      CHECK(st["schedule.eager_steps"].value == st["fragment.0.outer_steps"].value);
      REQUIRE(st["schedule.eager_slots"].size == st["outer.slots"].size);
      CHECK(std::memcmp(st["schedule.eager_slots"].data, st["outer.slots"].data, 8 * sizeof(float)) == 0);
      for (int s = 0; s < 6; ++s) t.step(mdl.grads(m));  // begins, then applies
      CHECK(t.stats().rounds == 3);
      for (auto& v : mdl.w)
        for (float x : v) CHECK(std::isfinite(x));
    });
  }
}

TEST_CASE("eager finish(): the replica re-joins theta_global keeping its progress since the phase began") {
  const std::vector<std::size_t> sizes{4, 4};
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    model mdl(sizes);
    sgd_trainer<dc::sync::eager> t(mdl.w, comm, {.inner_steps = 3, .inner = {.lr = 0.1f}});
    for (int s = 0; s < 6; ++s) t.step(mdl.grads(m));
    REQUIRE(t.stats().rounds == 1);
    // At a phase end the replica sits at its eager point, where the next
    // phase starts: finishing now leaves no progress to keep, so the
    // replica becomes theta_global (up to the rounding of the start point,
    // kept as anchor − own: a few ulp).
    t.finish();
    CHECK(t.stats().rounds == 2);
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t i = 0; i < 4; ++i)
        CHECK(mdl.w[k][i] ==
              doctest::Approx(t.global_parameters().data()[t.global_offset(k) + i]).epsilon(1e-6));
    std::map<std::string, const float*> buf;
    std::map<std::string, std::uint64_t> scalar;
    for (auto& e : t.state()) (e.is_scalar ? (void)(scalar[e.name] = e.value) : (void)(buf[e.name] = e.data));
    CHECK(scalar["schedule.eager_steps"] == 2);
    CHECK(std::memcmp(buf["schedule.eager_slots"], buf["outer.slots"], 8 * sizeof(float)) == 0);
    // Mid-phase: one inner step, then finish with nothing in flight is a
    // no-op; the next phase end takes the eager step from theta_global.
    const std::vector<float> g(t.global_parameters().data(), t.global_parameters().data() + 8);
    t.step(mdl.grads(m));
    t.finish();
    CHECK(t.stats().rounds == 2);
    for (int s = 0; s < 2; ++s) t.step(mdl.grads(m));
    CHECK(t.stats().rounds == 2);  // nothing was in flight: this phase end only begins
    CHECK(std::memcmp(g.data(), t.global_parameters().data(), 8 * sizeof(float)) == 0);
  });
}

TEST_CASE("schedule options out of range are config_errors naming the option and its range") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    model mdl({2, 2, 2});
    auto message = [&](std::size_t H, dc::sync::streaming::options so) {
      try {
        sgd_trainer<dc::sync::streaming> t(mdl.w, comm, {.inner_steps = H, .sync = so});
      } catch (const dc::config_error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    CHECK(message(8, {.fragments = 0}).find("fragments (P) must be in [1, min(H, tensor count)] = [1, 3]") !=
          std::string::npos);
    CHECK(message(2, {.fragments = 3}).find("[1, 2]") != std::string::npos);   // P > H
    CHECK(message(8, {.fragments = 4}).find("[1, 3]") != std::string::npos);   // P > tensors
    CHECK(message(8, {.fragments = 2, .delay = 4}).find("delay (tau) must be in [0, floor(H/P) - 1] = [0, 3]") !=
          std::string::npos);
    CHECK(message(8, {.fragments = 2, .delay = 3}) == "no error");
    CHECK(message(8, {.alpha = 1.5f}).find("alpha must be in [0, 1], got 1.5") != std::string::npos);
    CHECK(message(8, {.alpha = -0.1f}).find("alpha must be in [0, 1]") != std::string::npos);
    CHECK(message(8, {.alpha = std::numeric_limits<float>::quiet_NaN()}).find("alpha") != std::string::npos);
  });
}

namespace {

// Non-blocking collectives that complete before they return (the blocking
// operation runs inside the i-call), and a record of the fragment id in
// every stage-1 segment header that is sent.
class eager_link : public threads_host_link {
 public:
  using threads_host_link::threads_host_link;
  request iall_reduce(std::span<float> b, dc::reduce_op op) { return all_reduce(b, op), request{}; }
  request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) {
    record(s);
    return all_to_all(s, r), request{};
  }
  request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) {
    if (record_gathers) record(s);  // a gathered (sparse) exchange's one segment
    return all_gather(s, r), request{};
  }
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) { threads_host_link::all_to_all(s, r); }
  std::vector<std::uint32_t> fragments;
  bool record_gathers = false;

 private:
  void record(std::span<const std::byte> s) {
    std::uint32_t f;
    std::memcpy(&f, s.data() + 56, 4);
    fragments.push_back(f);
  }
};

}  // namespace

TEST_CASE_TEMPLATE("compressed streaming: the staged non-blocking exchange gives the bits of the exchange run at once; "
                   "headers carry the fragment",
                   codec, dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>,
                   dc::compress::error_feedback<dc::compress::blockwise<dc::fp4_e3m0, 32>>,
                   dc::compress::error_feedback<dc::compress::chunk_topk<32, 4>>) {
  const std::vector<std::size_t> sizes{40, 70, 33};
  const std::size_t H = 6;
  const int steps = 4 * static_cast<int>(H);
  const dc::sync::streaming::options so{.fragments = 3, .delay = 1, .alpha = 0.25f};
  // comm::threads runs each exchange as one task on its progress thread
  // (a task_communicator); the same threads behind a link without submit()
  // take the poll-driven path (each stage run by the step that finds its
  // collective complete); eager_link completes every collective at once.
  static_assert(dc::task_communicator<dc::comm::threads> && !dc::task_communicator<threads_host_link>);
  std::vector<std::vector<std::vector<float>>> staged(2), polled(2), at_once(2);
  std::vector<std::uint32_t> seen;
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    {
      model mdl(sizes);
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, codec, dc::comm::threads, dc::sync::streaming> t(
          mdl.w, comm, {.inner_steps = H, .inner = {.lr = 0.1f}, .sync = so});
      for (int s = 0; s < steps; ++s) t.step(mdl.grads(m));
      t.finish();
      staged[static_cast<std::size_t>(m)] = mdl.w;
      CHECK(t.stats().rounds == 12);
      for (std::size_t p = 0; p < 3; ++p) CHECK(t.stats().fragment_bytes_sent[p] > 0);
    }
    {
      threads_host_link link(comm);
      model mdl(sizes);
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, codec, threads_host_link, dc::sync::streaming> t(
          mdl.w, link, {.inner_steps = H, .inner = {.lr = 0.1f}, .sync = so});
      for (int s = 0; s < steps; ++s) t.step(mdl.grads(m));
      t.finish();
      polled[static_cast<std::size_t>(m)] = mdl.w;
    }
    {
      eager_link link(comm);
      link.record_gathers = dc::compress::gathered_v<codec>;
      model mdl(sizes);
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, codec, eager_link, dc::sync::streaming> t(
          mdl.w, link, {.inner_steps = H, .inner = {.lr = 0.1f}, .sync = so});
      for (int s = 0; s < steps; ++s) t.step(mdl.grads(m));
      t.finish();
      at_once[static_cast<std::size_t>(m)] = mdl.w;
      if (m == 0) seen = link.fragments;
    }
  });
  for (int m = 0; m < 2; ++m)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      CHECK(std::memcmp(staged[static_cast<std::size_t>(m)][k].data(), at_once[static_cast<std::size_t>(m)][k].data(),
                        sizes[k] * sizeof(float)) == 0);
      CHECK(std::memcmp(polled[static_cast<std::size_t>(m)][k].data(), at_once[static_cast<std::size_t>(m)][k].data(),
                        sizes[k] * sizeof(float)) == 0);
    }
  // Fragments 0, 1, 2 in turn, four rounds each.
  std::vector<std::uint32_t> want;
  for (int r = 0; r < 4; ++r)
    for (std::uint32_t p = 0; p < 3; ++p) want.push_back(p);
  CHECK(seen == want);
}

TEST_CASE("a chained exchange (comm::threads) runs every stage on the progress thread, with no poll from the trainer") {
  // The exchange's task is queued on the progress thread before the barrier,
  // and a blocking operation runs behind what was queued before it: once the
  // barrier returns, the all-to-all, the shard reduction, the all-gather and
  // the vote have all run, and the first poll finds the exchange complete.
  // (Poll-driven, the first poll would only start the all-gather.) The
  // verdict and the applied step equal an exchange run at once.
  using codec = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>;
  using reducer = dc::reduce::compressed<codec, dc::comm::threads, dc::host_space, dc::exec::host>;
  const std::vector<std::size_t> sizes{100, 1, 37};
  std::vector<std::vector<float>> result(4);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    for (const bool overlap : {true, false}) {
      std::vector<std::vector<float>> local;
      std::size_t n = 0;
      for (const std::size_t size : sizes) {
        local.emplace_back(size);
        for (std::size_t i = 0; i < size; ++i)
          local.back()[i] = 0.01f * static_cast<float>((i * 7 + n) % 13) - 0.05f * static_cast<float>(m);
        n += size;
      }
      dc::parameter_set<float, dc::host_space> set(local);
      dc::exec::host exec(1);
      reducer r(set, 2, m, {}, 0, exec);
      reducer::transport link(0);
      std::vector<float> ref(n, 0.5f);
      r.begin(exec, comm, link, ref.data(), 1, overlap);
      comm.barrier();
      CHECK(r.poll(exec, comm, link));
      const dc::reduce::verdict v = r.wait(exec, comm, link);
      CHECK(v.accepted);
      std::vector<float> global(n, 0.5f);
      r.apply(exec, dc::kernels::sgd_update{1.0f}, global.data(), nullptr, 0, dc::kernels::merge::overwrite{});
      result[static_cast<std::size_t>(2 * m + (overlap ? 0 : 1))] = global;
    }
  });
  for (int m = 0; m < 2; ++m)
    CHECK(std::memcmp(result[static_cast<std::size_t>(2 * m)].data(), result[static_cast<std::size_t>(2 * m + 1)].data(),
                      result[0].size() * sizeof(float)) == 0);
  CHECK(std::memcmp(result[0].data(), result[2].data(), result[0].size() * sizeof(float)) == 0);
}

// ------------------------------------------- eager's outer lr and its bound
// docs/algorithms.md section 4: with M identical workers on f(θ) = θ²/2 and
// inner phases that reach the optimum (inner SGD at lr 1, H = 1: k = 1
// exactly), eager's round is the linear recurrence whose characteristic
// polynomial z(z − 1)(z − μ) + a(z/M + 1 − 1/M)((1 + μ)z − μ) has all roots
// inside the unit circle for η < the bound. The bounds below are from
// scripts/eager_stability.py (numpy.roots and bisection), independently of
// the library's Jury test; M = 1 is blocking DiLoCo's 2(1 + μ)/(1 + 2μ).
namespace {

constexpr double bound_m1 = 1.357142857142857, bound_m2 = 0.7697122038674128, bound_m4 = 0.4159738691908294,
                 bound_m8 = 0.3202523863996654;

using quad_trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads,
                                   dc::sync::eager>;

struct quad_run {
  double first = 0.0;  // |θ| at the start
  double tail = 0.0;   // max |θ| over the replica and θ_g in the last 20 rounds
  std::vector<dc::event> warnings;  // rank 0's warning events
};

// M workers, θ = 1, `rounds` rounds of one inner SGD step at lr 1 on θ²/2.
quad_run run_quadratic(int workers, int rounds, dc::algorithm_options<dc::inner::sgd, dc::outer::nesterov, dc::compress::none,
                                                                 dc::sync::eager>
                                              opts) {
  quad_run out;
  std::mutex lock_warnings;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w{1.0f};
    auto o = opts;
    o.inner_steps = 1;
    o.inner = {.lr = 1.0f};
    o.on_event = [&](const dc::event& e) {
      if (e.kind != dc::event_kind::warning || comm.rank() != 0) return;
      const std::lock_guard lock(lock_warnings);
      out.warnings.push_back(e);
    };
    quad_trainer t(w, comm, o);
    double tail = 0.0;
    for (int r = 0; r < rounds; ++r) {
      t.step(std::vector<float>{w[0]});
      if (r >= rounds - 20)
        tail = std::max({tail, std::abs(static_cast<double>(w[0])),
                         std::abs(static_cast<double>(t.global_parameters().data()[0]))});
    }
    if (comm.rank() == 0) {
      out.first = 1.0;
      out.tail = tail;
    }
  });
  return out;
}

bool converges(const quad_run& r) { return r.tail < 1e-2 * r.first; }
bool diverges(const quad_run& r) { return r.tail > 1e2 * r.first; }

}  // namespace

TEST_CASE("eager's stability bound on the quadratic matches numpy.roots (Nesterov 0.9; plain SGD: M/(M - 1))") {
  const dc::sync::outer_momentum nest{.momentum = 0.9, .nesterov = true};
  CHECK(dc::sync::eager_lr_bound(1, nest) == doctest::Approx(bound_m1).epsilon(1e-9));
  CHECK(dc::sync::eager_lr_bound(2, nest) == doctest::Approx(bound_m2).epsilon(1e-9));
  CHECK(dc::sync::eager_lr_bound(4, nest) == doctest::Approx(bound_m4).epsilon(1e-9));
  CHECK(dc::sync::eager_lr_bound(8, nest) == doctest::Approx(bound_m8).epsilon(1e-9));
  CHECK(dc::sync::eager_lr_bound(1, nest) == doctest::Approx(2.0 * 1.9 / 2.8).epsilon(1e-9));
  // The fresh weight w enters the polynomial alone (1/M by default): w = 1
  // is blocking DiLoCo's bound at any M, w = 1/2 at M = 8 is M = 2's, and
  // w = 1/4 at M = 2 is M = 4's.
  for (const std::size_t n : {2u, 4u, 8u}) {
    CAPTURE(n);
    CHECK(dc::sync::eager_lr_bound(n, nest, 1.0) == doctest::Approx(bound_m1).epsilon(1e-9));
    CHECK(dc::sync::eager_lr_bound(n, nest, 1.0 / double(n)) == dc::sync::eager_lr_bound(n, nest));
  }
  CHECK(dc::sync::eager_lr_bound(8, nest, 0.5) == doctest::Approx(bound_m2).epsilon(1e-9));
  CHECK(dc::sync::eager_lr_bound(2, nest, 0.25) == doctest::Approx(bound_m4).epsilon(1e-9));
  // Without momentum the round is z² − (1 − a/M)z + a(1 − 1/M): stable for a < M/(M − 1), and a < 2 at M = 1.
  const dc::sync::outer_momentum plain{};
  CHECK(dc::sync::eager_lr_bound(1, plain) == doctest::Approx(2.0).epsilon(1e-9));
  for (const std::size_t n : {2u, 4u, 8u})
    CHECK(dc::sync::eager_lr_bound(n, plain) == doctest::Approx(double(n) / double(n - 1)).epsilon(1e-9));
}

TEST_CASE("eager on the quadratic: M = 2 converges and M = 4 diverges at outer lr 0.7; M = 4 converges at 0.35") {
  CHECK(converges(run_quadratic(2, 300, {.sync = {.outer_lr = 0.7f}})));
  CHECK(diverges(run_quadratic(4, 300, {.sync = {.outer_lr = 0.7f}})));
  CHECK(converges(run_quadratic(4, 300, {.outer = {.lr = 0.35f}})));
}

TEST_CASE("eager's fresh weight on the quadratic: w = 1 converges at 0.7 (M = 4, 8); w = 1/2, M = 8 has M = 2's bound") {
  // At w = 1/M (the default) M = 4 diverges at 0.7 (the case above).
  CHECK(converges(run_quadratic(4, 300, {.sync = {.outer_lr = 0.7f, .fresh_weight = 1.0f}})));
  CHECK(converges(run_quadratic(8, 300, {.sync = {.outer_lr = 0.7f, .fresh_weight = 1.0f}})));
  const auto at_half = [](double lr) {
    return run_quadratic(8, 2000, {.sync = {.outer_lr = static_cast<float>(lr), .fresh_weight = 0.5f}});
  };
  CHECK(converges(at_half(0.95 * bound_m2)));
  CHECK(diverges(at_half(1.05 * bound_m2)));
  // Unset, the lr is 0.8 x the bound at w, capped at the default: 0.7 at w = 1.
  using dc::sync::resolve_eager_outer_lr;
  CHECK(resolve_eager_outer_lr<dc::outer::nesterov>({.fresh_weight = 1.0f}, {}, 8).lr == 0.7f);
  CHECK(resolve_eager_outer_lr<dc::outer::nesterov>({.fresh_weight = 0.5f}, {}, 8).lr ==
        doctest::Approx(0.8 * bound_m2).epsilon(1e-6));
  CHECK(run_quadratic(8, 40, {.sync = {.fresh_weight = 1.0f}}).warnings.empty());
  // A set lr above the bound at w is reported with w, and with the default
  // it would have had at that w (0.8 x M = 2's bound), not at 1/M.
  const quad_run above = run_quadratic(8, 40, {.sync = {.outer_lr = 0.9f, .fresh_weight = 0.5f}});
  REQUIRE(above.warnings.size() == 1);
  const std::string& said = above.warnings[0].problem;
  CHECK(said.find("stability bound 0.769712 for 8 workers at fresh weight 0.5") != std::string::npos);
  char unset[64];
  std::snprintf(unset, sizeof unset, "Unset, the lr would be %.6g",
                static_cast<double>(static_cast<float>(0.8 * bound_m2)));
  CHECK(said.find(unset) != std::string::npos);
  // A weight outside [0, 1] is refused, naming it.
  for (const float bad : {-0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(run_quadratic(2, 1, {.sync = {.fresh_weight = bad}}),
                         doctest::Contains("sync::eager: fresh_weight must be in [0, 1]"), dc::config_error);
  }
}

TEST_CASE("eager on the quadratic: 5 % below the bound converges, 5 % above diverges (M = 2 and 4)") {
  for (const auto& point : {std::pair{2, bound_m2}, std::pair{4, bound_m4}}) {
    const int workers = point.first;  // not a structured binding: CAPTURE's lambda takes it (Clang 14)
    const double bound = point.second;
    CAPTURE(workers);
    CHECK(converges(run_quadratic(workers, 2000, {.outer = {.lr = static_cast<float>(0.95 * bound)}})));
    CHECK(diverges(run_quadratic(workers, 2000, {.outer = {.lr = static_cast<float>(1.05 * bound)}})));
  }
}

TEST_CASE("eager's default outer lr: 0.8 x the bound for M, capped at the optimizer's default; it converges") {
  using dc::sync::resolve_eager_outer_lr;
  const auto at = [](std::size_t n) { return resolve_eager_outer_lr<dc::outer::nesterov>({}, {}, n); };
  CHECK(at(1).lr == 0.7f);  // 0.8 x 1.357 is above 0.7: DiLoCo's default stays
  CHECK(at(1).automatic);
  CHECK(at(2).lr == doctest::Approx(0.8 * bound_m2).epsilon(1e-6));
  CHECK(at(4).lr == doctest::Approx(0.8 * bound_m4).epsilon(1e-6));
  CHECK(at(8).lr == doctest::Approx(0.8 * bound_m8).epsilon(1e-6));
  // Set lrs are honoured, above the bound too; outer_lr wins over outer.lr.
  CHECK(resolve_eager_outer_lr<dc::outer::nesterov>({}, {.lr = 0.5f}, 4).lr == 0.5f);
  CHECK_FALSE(resolve_eager_outer_lr<dc::outer::nesterov>({}, {.lr = 0.5f}, 4).automatic);
  CHECK(resolve_eager_outer_lr<dc::outer::nesterov>({.outer_lr = 0.7f}, {.lr = 0.5f}, 4).lr == 0.7f);
  // Outer SGD (lr 1, no momentum: averaging) keeps lr 1 while 0.8 M/(M - 1) is above it.
  CHECK(resolve_eager_outer_lr<dc::outer::sgd>({}, {}, 4).lr == 1.0f);
  CHECK(resolve_eager_outer_lr<dc::outer::sgd>({}, {}, 8).lr == doctest::Approx(0.8 * 8.0 / 7.0).epsilon(1e-6));
  // The runs: before the default followed M, M = 4 and 8 ran at 0.7 and diverged.
  for (const int workers : {2, 4, 8}) {
    CAPTURE(workers);
    const quad_run r = run_quadratic(workers, 300, {});
    CHECK(converges(r));
    CHECK(r.warnings.empty());
  }
}

TEST_CASE("eager: a set outer lr above the bound runs as set and is reported as a warning event") {
  const quad_run above = run_quadratic(4, 40, {.sync = {.outer_lr = 0.7f}});
  REQUIRE(above.warnings.size() == 1);
  const dc::event& e = above.warnings[0];
  CHECK(e.world == 4);
  CHECK(e.inner_step == 0);  // at construction
  CHECK(e.problem.find("outer lr 0.7") != std::string::npos);
  CHECK(e.problem.find("stability bound 0.41597") != std::string::npos);
  CHECK(e.problem.find("4 workers") != std::string::npos);
  CHECK(run_quadratic(4, 40, {.outer = {.lr = 0.5f}}).warnings.size() == 1);
  CHECK(run_quadratic(4, 40, {.outer = {.lr = 0.35f}}).warnings.empty());
  CHECK(run_quadratic(2, 40, {.sync = {.outer_lr = 0.7f}}).warnings.empty());
  CHECK_THROWS_WITH_AS(run_quadratic(2, 1, {.sync = {.outer_lr = -1.0f}}),
                       doctest::Contains("sync::eager: outer_lr must be finite and >= 0"), dc::config_error);
}

namespace {

// One worker, one tensor of f(w) = |w − c|²/2, sync::blocking and
// sync::eager side by side on the same data: the replica after every step,
// and at every phase end theta_global of both.
struct one_worker_run {
  std::vector<std::vector<float>> blocking_replica, eager_replica;  // after every step
  std::vector<std::vector<float>> blocking_global, eager_global;    // after every phase end
};

one_worker_run run_one_worker(const std::vector<float>& init, const std::vector<float>& c, std::size_t H, int rounds,
                              float inner_lr, dc::outer::nesterov::options outer, bool eager_outer_default) {
  one_worker_run out;
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> wb = init, we = init;
    sgd_trainer<dc::sync::blocking> tb(wb, comm, {.inner_steps = H, .inner = {.lr = inner_lr}, .outer = outer});
    sgd_trainer<dc::sync::eager> te(we, comm, {.inner_steps = H, .inner = {.lr = inner_lr},
                                               .outer = eager_outer_default ? dc::outer::nesterov::options{} : outer});
    auto grad = [&](const std::vector<float>& w) {
      std::vector<float> g(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i] - c[i];
      return g;
    };
    for (std::size_t s = 1; s <= H * static_cast<std::size_t>(rounds); ++s) {
      tb.step(grad(wb));
      te.step(grad(we));
      out.blocking_replica.push_back(wb);
      out.eager_replica.push_back(we);
      if (s % H == 0) {
        out.blocking_global.emplace_back(tb.global_parameters().data(), tb.global_parameters().data() + init.size());
        out.eager_global.emplace_back(te.global_parameters().data(), te.global_parameters().data() + init.size());
      }
    }
  });
  return out;
}


}  // namespace

// Why the identity holds (docs/algorithms.md §1 and §4): with M = 1 the mean
// of one is the worker's own pseudo-gradient, Δ̄^(r) = Δ^(r) = own, so eager's
// step direction g = Δ̄^(r) − own/M + Δ^(r+1)/M is Δ^(r+1): the progress of the
// phase just ended, taken from where the phase began (s). Eager's replica is
// Outer(s, E, Δ^(r+1)) and becomes the next phase's start; blocking's θ_g is
// Outer(θ_g, S, Δ^(r+1)) with Δ taken from θ_g, and the replica restarts there.
// Both start at θ_0 with a fresh outer state stepped once per phase end (the
// first eager step takes b ← g like blocking's first round: nothing is in
// flight, g = Δ^(1)), and both run the same inner steps from the same start:
// by induction eager's replica is blocking's θ_g at every phase end and
// blocking's replica after every step. Eager's θ_g takes the same means one
// round late, so it is blocking's θ_g of the round before. The outer lr must
// be the same: at M = 1 eager's default, min(0.7, 0.8 × 1.357), is blocking's
// 0.7.
//
// Bit for bit needs fp32 arithmetic that does not round: the library keeps
// eager's start as anchor = start + own and recovers it as anchor − own, and
// forms g as Δ̄ + (fresh − own)/M; in real arithmetic both are exact, in fp32
// each may be off by an ulp. So the identity is checked bit for bit with
// dyadic values that every operation represents exactly (inner lr 1/2,
// outer lr 1/2 and momentum 1/2, values on a 2^-4 grid, four rounds of
// H = 2; the test checks the exactness itself against a double-precision
// replay of blocking), and at the defaults (inner lr 0.1, outer lr 0.7,
// μ 0.9) to a few ulp.
TEST_CASE("eager with one worker is blocking DiLoCo: its replica is blocking's theta_global at every phase end") {
  SUBCASE("bit for bit where fp32 does not round (dyadic values, lr 1/2, momentum 1/2)") {
    const std::vector<float> init{0.5f, -0.75f, 0.25f, 1.0f}, c{1.0f, 0.25f, -0.5f, 0.0625f};
    const std::size_t H = 2;
    const int rounds = 4;
    const dc::outer::nesterov::options outer{.lr = 0.5f, .momentum = 0.5f};
    const auto r = run_one_worker(init, c, H, rounds, 0.5f, outer, false);
    // Blocking's θ_g by docs/algorithms.md §1 in double: every value must be
    // a float (no rounding happened), and blocking gives exactly those.
    std::vector<double> g(init.begin(), init.end()), b(init.size(), 0.0);
    for (int k = 0; k < rounds; ++k) {
      std::vector<double> w = g;
      for (std::size_t s = 0; s < H; ++s)
        for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.5 * (w[i] - c[i]);
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double d = g[i] - w[i];
        b[i] = k == 0 ? d : 0.5 * b[i] + d;
        g[i] -= 0.5 * (d + 0.5 * b[i]);
      }
      CAPTURE(k);
      for (std::size_t i = 0; i < g.size(); ++i) {
        REQUIRE(static_cast<double>(static_cast<float>(g[i])) == g[i]);
        CHECK(r.blocking_global[static_cast<std::size_t>(k)][i] == static_cast<float>(g[i]));
      }
    }
    CHECK_FALSE(same_bits(r.blocking_global.back(), init));  // θ_g moved
    for (std::size_t s = 0; s < r.eager_replica.size(); ++s) {
      CAPTURE(s + 1);
      CHECK(same_bits(r.eager_replica[s], r.blocking_replica[s]));
    }
    for (std::size_t k = 0; k < r.blocking_global.size(); ++k) {
      CAPTURE(k + 1);
      CHECK(same_bits(r.eager_replica[(k + 1) * H - 1], r.blocking_global[k]));
      CHECK(same_bits(r.eager_global[k], k == 0 ? init : r.blocking_global[k - 1]));
    }
  }
  SUBCASE("at the defaults (eager's own outer lr at M = 1): to a few ulp") {
    const std::vector<float> init{0.5f, -0.3f, 0.2f, 1.1f, -0.9f}, c{1.0f, 0.25f, -0.45f, 0.07f, 0.6f};
    const std::size_t H = 3;
    const int rounds = 6;
    const auto r = run_one_worker(init, c, H, rounds, 0.1f, {}, true);
    // Each phase end may round the start (anchor − own) and g by an ulp of
    // values below 2 in magnitude (2.4e-7); the dynamics contract (inner
    // SGD, outer step below the bound), so the gap stays at a few of them.
    auto gap = [](const std::vector<float>& a, const std::vector<float>& b) {
      double d = 0.0;
      for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
      return d;
    };
    const double tol = 2e-6;
    CHECK(gap(r.blocking_global.back(), init) > 1e3 * tol);  // θ_g moved far more than the tolerance
    for (std::size_t k = 0; k < r.blocking_global.size(); ++k) {
      CAPTURE(k + 1);
      CHECK(gap(r.eager_replica[(k + 1) * H - 1], r.blocking_global[k]) <= tol);
      CHECK(gap(r.eager_global[k], k == 0 ? init : r.blocking_global[k - 1]) <= tol);
    }
    for (std::size_t s = 0; s < r.eager_replica.size(); ++s) {
      CAPTURE(s + 1);
      CHECK(gap(r.eager_replica[s], r.blocking_replica[s]) <= tol);
    }
  }
}

// ------------------------------------------------------------ sync::delayed
// The naive delayed step (sync/delayed.hpp), a schedule written as one
// header against the runtime seam (sync/runtime.hpp).

TEST_CASE("delayed: one scalar, two workers, the sequence worked by hand (and finish())") {
  // Worker m minimises 1/2 (w - c_m)^2 with c = {0, 2}; inner SGD lr 1/2,
  // H = 1; outer SGD lr 1 (theta_g -= mean). By the definition: at each phase
  // end theta_g takes the previous round's mean, the phase's own
  // pseudo-gradient is s - w (s: theta_g as the phase began), and the
  // replica restarts from theta_g.
  //   phase 1: w = {0, 1}; nothing to apply; d1 = 0 - w = {0, -1}; w <- 0
  //   phase 2: w = {0, 1}; g = 0 - mean(d1) = 0.5;  d2 = 0 - w = {0, -1};    w <- 0.5
  //   phase 3: w = {0.25, 1.25}; g = 0.5 + 0.5 = 1; d3 = 0.5 - w = {0.25, -0.75}; w <- 1
  //   phase 4: w = {0.5, 1.5}; g = 1 + 0.25 = 1.25; d4 = 1 - w = {0.5, -0.5}; w <- 1.25
  //   finish(): g = 1.25 - mean(d4) = 1.25, replica 1.25.
  // Every value is dyadic: fp32 holds them exactly.
  using T = dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::threads, dc::sync::delayed>;
  const std::vector<float> want_global{0.0f, 0.5f, 1.0f, 1.25f}, want_replica{0.0f, 0.5f, 1.0f, 1.25f};
  std::vector<std::vector<float>> global(2), replica(2), trained(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const auto m = static_cast<std::size_t>(comm.rank());
    const float c = m == 0 ? 0.0f : 2.0f;
    std::vector<float> w{0.0f};
    T t(w, comm, {.inner_steps = 1, .inner = {.lr = 0.5f}, .outer = {.lr = 1.0f}});
    for (int s = 0; s < 4; ++s) {
      const std::vector<std::vector<float>> g{{w[0] - c}};
      const bool applied = t.step(g);
      CHECK(applied == (s > 0));
      global[m].push_back(t.global_parameters().data()[0]);
      replica[m].push_back(w[0]);
    }
    t.finish();
    global[m].push_back(t.global_parameters().data()[0]);
    replica[m].push_back(w[0]);
    CHECK(t.stats().rounds == 4);
  });
  for (std::size_t m = 0; m < 2; ++m) {
    CAPTURE(m);
    CHECK(std::vector<float>(global[m].begin(), global[m].end() - 1) == want_global);
    CHECK(std::vector<float>(replica[m].begin(), replica[m].end() - 1) == want_replica);
    CHECK(global[m].back() == 1.25f);
    CHECK(replica[m].back() == 1.25f);
  }
}

TEST_CASE("delayed: four phases against the definition in double precision; one_step_delay keeps what delayed loses") {
  const std::vector<std::size_t> sizes{2, 3};
  const std::size_t H = 3;
  const int steps = 4 * static_cast<int>(H);  // four phases: three applied rounds
  vec global = flat_init(sizes);
  const std::size_t n = global.size();
  std::vector<vec> w(M, global);
  std::vector<vec> c{flat_targets(0, sizes), flat_targets(1, sizes)};
  vec start = global, mean(n, 0.0);
  nesterov_ref outer;
  bool in_flight = false;
  std::vector<vec> ref_global;
  std::vector<std::vector<vec>> ref_local(M);
  for (int t = 1; t <= steps; ++t) {
    for (int m = 0; m < M; ++m) inner_step(w[static_cast<std::size_t>(m)], c[static_cast<std::size_t>(m)]);
    if (t % static_cast<int>(H) == 0) {
      // The phase's pseudo-gradients, from theta_g as the phase began.
      vec fresh_mean(n, 0.0);
      for (int m = 0; m < M; ++m)
        for (std::size_t i = 0; i < n; ++i) fresh_mean[i] += (start[i] - w[static_cast<std::size_t>(m)][i]) / M;
      if (in_flight) outer.step(global, mean, 0, n);  // the previous round's mean
      for (int m = 0; m < M; ++m) w[static_cast<std::size_t>(m)] = global;  // restart from theta_g
      start = global;
      mean = fresh_mean;
      in_flight = true;
    }
    ref_global.push_back(global);
    for (int m = 0; m < M; ++m) ref_local[static_cast<std::size_t>(m)].push_back(w[static_cast<std::size_t>(m)]);
  }
  const auto lib = run_library<dc::sync::delayed>(sizes, steps, H, {});
  check_against(lib, ref_global, ref_local);
  CHECK(outer.steps == 3);
  // one_step_delay's replica keeps its last phase (re-based), so the two differ from the second round on.
  const auto osd = run_library<dc::sync::one_step_delay>(sizes, steps, H, {});
  CHECK(rel_err(ref_local[0][2 * H - 1], osd[0].local[2 * H - 1]) > 1e-3);
}

// ------------------------------------------------ delayed Nesterov (outer)

namespace {

template <class Sync = dc::sync::one_step_delay>
using dn_trainer = dc::algorithm<dc::inner::sgd, dc::outer::delayed_nesterov, dc::compress::none, dc::comm::threads, Sync>;

}  // namespace

TEST_CASE("delayed Nesterov under one-step delay: one scalar, two workers, the sequence worked by hand") {
  // Worker m minimises 1/2 (w - c_m)^2 with c = {0, 2}; inner SGD lr 1/2
  // (w <- (w + c)/2), H = 1; outer lr 1, momentum 1/2, period N = 2. By
  // one-step delay's definition the mean of round r is applied at the end
  // of round r + 1 and the replica is re-based on theta_g keeping its own
  // phase (theta_local <- theta_g - (s - w)); by the delayed Nesterov rule
  // odd outer steps apply d/2 alone, even ones also m <- m/2 + a/2 (a the sum
  // of the two means) and mu*m:
  //   step 1: w = {0, 1};      D1 = {0, -1}, mean -1/2; nothing applied; s = w
  //   step 2: w = {0, 3/2};    D2 = {0, -1/2}; t=1: g = 0 + 1/4 = 1/4;
  //           w = 1/4 - D2 = {1/4, 3/4}; mean(D2) = -1/4
  //   step 3: w = {1/8, 11/8}; D3 = {1/8, -5/8}; t=2: a = -3/4, m = -3/8,
  //           g = 1/4 + 1/8 + 3/16 = 9/16; w = {7/16, 19/16}; mean(D3) = -1/4
  //   step 4: w = {7/32, 51/32}; D4 = {7/32, -13/32}; t=3: g = 9/16 + 1/8 = 11/16;
  //           w = {15/32, 35/32}; mean(D4) = -3/32
  //   step 5: w = {15/64, 99/64}; D5 = {15/64, -29/64}; t=4: a = -11/32,
  //           m = -3/16 - 11/64 = -23/64, g = 11/16 + 3/64 + 23/128 = 117/128;
  //           w = {87/128, 175/128}
  // Every value is dyadic: fp32 holds them exactly.
  using T = dn_trainer<>;
  const std::vector<float> want_global{0.0f, 0.25f, 0.5625f, 0.6875f, 117.0f / 128.0f};
  const std::vector<std::vector<float>> want_replica{{0.0f, 0.25f, 7.0f / 16.0f, 15.0f / 32.0f, 87.0f / 128.0f},
                                                     {1.0f, 0.75f, 19.0f / 16.0f, 35.0f / 32.0f, 175.0f / 128.0f}};
  std::vector<std::vector<float>> global(2), replica(2);
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const auto m = static_cast<std::size_t>(comm.rank());
    const float c = m == 0 ? 0.0f : 2.0f;
    std::vector<float> w{0.0f};
    T t(w, comm, {.inner_steps = 1, .inner = {.lr = 0.5f}, .outer = {.lr = 1.0f, .momentum = 0.5f, .period = 2}});
    for (int s = 0; s < 5; ++s) {
      const std::vector<std::vector<float>> g{{w[0] - c}};
      t.step(g);
      global[m].push_back(t.global_parameters().data()[0]);
      replica[m].push_back(w[0]);
    }
  });
  for (std::size_t m = 0; m < 2; ++m) {
    CAPTURE(m);
    CHECK(global[m] == want_global);
    CHECK(replica[m] == want_replica[m]);
  }
}

TEST_CASE("delayed Nesterov with period 1 is outer::nesterov bit for bit (one-step delay, 3 workers, two tensors)") {
  const std::vector<std::size_t> sizes{5, 3};
  const int steps = 12;
  auto run = [&]<class Outer>(typename Outer::options outer) {
    using T = dc::algorithm<dc::inner::sgd, Outer, dc::compress::none, dc::comm::threads, dc::sync::one_step_delay>;
    std::vector<std::vector<float>> out(3);
    dc::comm::threads::world world(3);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl(sizes);
      T t(mdl.w, comm, {.inner_steps = 3, .inner = {.lr = 0.1f}, .outer = outer});
      for (int s = 0; s < steps; ++s) t.step(mdl.grads(m));
      const auto g = t.global_parameters();
      auto& o = out[static_cast<std::size_t>(m)];
      o.assign(g.data(), g.data() + g.size());
      for (const auto& w : mdl.w) o.insert(o.end(), w.begin(), w.end());
    });
    return out;
  };
  const auto dn = run.template operator()<dc::outer::delayed_nesterov>({.lr = 0.7f, .momentum = 0.9f, .period = 1});
  const auto nag = run.template operator()<dc::outer::nesterov>({.lr = 0.7f, .momentum = 0.9f});
  for (std::size_t m = 0; m < 3; ++m) CHECK(same_bits(dn[m], nag[m]));
  // And a period of 2 is another rule: theta_global differs.
  const auto dn2 = run.template operator()<dc::outer::delayed_nesterov>({.lr = 0.7f, .momentum = 0.9f, .period = 2});
  CHECK(!same_bits(dn2[0], nag[0]));
}

TEST_CASE("delayed Nesterov: a checkpoint taken mid-period, a round in flight, resumes to the bits of a run that "
          "never saved; a different period is refused") {
  // H 2, period 3: outer steps at the ends of phases 2, 3, 4, ...; after
  // step 7 two steps of the second period have been applied (a != 0) and
  // phase 4's round is in flight.
  using T = dn_trainer<>;
  const std::vector<std::size_t> sizes{4, 6};
  const T::options opts{.inner_steps = 2, .inner = {.lr = 0.1f}, .outer = {.lr = 0.6f, .momentum = 0.8f, .period = 3}};
  const int total = 16, save_at = 7;
  auto finish_run = [&](T& t, model& mdl, int m, int from) {
    for (int s = from; s <= total; ++s) t.step(mdl.grads(m));
    t.finish();
    const auto g = t.global_parameters();
    std::vector<float> o(g.data(), g.data() + g.size());
    for (const auto& w : mdl.w) o.insert(o.end(), w.begin(), w.end());
    return o;
  };
  std::vector<std::vector<float>> plain(2), restored(2);
  std::vector<std::vector<std::byte>> files(2);
  {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl(sizes);
      T t(mdl.w, comm, opts);
      plain[static_cast<std::size_t>(m)] = finish_run(t, mdl, m, 1);
    });
  }
  {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl(sizes);
      T t(mdl.w, comm, opts);
      for (int s = 1; s <= save_at; ++s) t.step(mdl.grads(m));
      files[static_cast<std::size_t>(m)] = t.save_bytes();
    });
  }
  {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      model mdl({4, 6});
      for (auto& w : mdl.w) std::fill(w.begin(), w.end(), 3.0f);  // overwritten by the load
      T u(mdl.w, comm, opts);
      u.load(files[static_cast<std::size_t>(m)]);
      restored[static_cast<std::size_t>(m)] = finish_run(u, mdl, m, save_at + 1);
      auto other = opts;
      other.outer.period = 2;
      model spare(sizes);
      T v(spare.w, comm, other);
      CHECK_THROWS_WITH(v.load(files[static_cast<std::size_t>(m)]), doctest::Contains("period"));
    });
  }
  for (std::size_t m = 0; m < 2; ++m) {
    CAPTURE(m);
    CHECK(same_bits(restored[m], plain[m]));
  }
}

TEST_CASE("delayed Nesterov options out of range are config_errors naming the option and its range") {
  using O = dc::outer::delayed_nesterov;
  CHECK_THROWS_WITH_AS(O::validate({.period = 0}), doctest::Contains("period (N) must be in [1, 1048576], got 0"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(O::validate({.momentum = 0.0f}), doctest::Contains("momentum must be in (0, 1)"),
                       dc::config_error);
  CHECK_THROWS_WITH_AS(O::validate({.momentum = 1.0f}), doctest::Contains("momentum"), dc::config_error);
  CHECK_THROWS_WITH_AS(O::validate({.lr = -1.0f}), doctest::Contains("lr"), dc::config_error);
  CHECK_NOTHROW(O::validate({}));
}
