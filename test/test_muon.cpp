// SPDX-License-Identifier: Apache-2.0
// inner::muon (inner/muon.hpp) against the same update written with libtorch
// tensor operations in this file: momentum, Newton-Schulz with the
// reference's quintic coefficients on the short side, the shape scale, and
// AdamW for the tensors that are not matrices. The reference runs in double,
// so what is measured is the library's own rounding (fp32 iteration); the
// same reference in fp32 is reported beside it. Also: the slots are visited
// and a restored copy continues with the same bits; bad options are refused
// by name; and DiLoCo with Muon inside over comm::threads follows the
// algorithm's definition written with the same reference.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <diloco/diloco.hpp>
#include <diloco/tensor/torch.hpp>
#include <mutex>
#include <string>
#include <vector>

// Debian's libtorch brings glog, whose CHECK (abort on failure) replaces
// doctest's: take doctest's back, so a failed check is reported and counted.
#undef CHECK
#define CHECK DOCTEST_CHECK

namespace dc = diloco;

namespace {

// Muon as the reference muon.py writes it (SGD-form momentum: see
// inner/muon.hpp), with AdamW for tensors that are not matrices, in
// libtorch tensor operations at `dtype`.
struct torch_muon {
  dc::inner::muon::options o;
  torch::Dtype dtype;
  std::vector<torch::Tensor> p, buf, m, v;
  int t = 0;

  torch_muon(const std::vector<torch::Tensor>& params, dc::inner::muon::options opts, torch::Dtype dt)
      : o(opts), dtype(dt) {
    for (const auto& x : params) {
      p.push_back(x.detach().to(dtype).clone());
      buf.push_back(torch::zeros_like(p.back()));
      m.push_back(torch::zeros_like(p.back()));
      v.push_back(torch::zeros_like(p.back()));
    }
  }

  // PyTorch's matrix view: shape[0] rows, the rest flattened; both above 1.
  static bool is_matrix(const torch::Tensor& x) { return x.dim() >= 2 && x.size(0) > 1 && x.numel() / x.size(0) > 1; }

  static torch::Tensor newton_schulz(const torch::Tensor& g, int steps, double eps) {
    const double a = 3.4445, b = -4.7750, c = 2.0315;
    const bool tall = g.size(0) > g.size(1);
    torch::Tensor x = tall ? g.t() : g;
    x = x / (x.norm() + eps);
    for (int k = 0; k < steps; ++k) {
      const auto A = x.mm(x.t());
      const auto B = b * A + c * A.mm(A);
      x = a * x + B.mm(x);
    }
    return tall ? x.t() : x;
  }

  void step(const std::vector<torch::Tensor>& grads) {
    ++t;
    double scale = 1.0;
    if (o.max_grad_norm > 0.0f) {
      double sq = 0.0;
      for (const auto& g : grads) sq += g.to(torch::kDouble).pow(2).sum().item<double>();
      scale = std::min(1.0, static_cast<double>(o.max_grad_norm) / (std::sqrt(sq) + 1e-6));
    }
    const double lr = o.lr, mu = o.momentum;
    for (std::size_t k = 0; k < p.size(); ++k) {
      const auto g = grads[k].detach().to(dtype) * scale;
      if (is_matrix(p[k])) {
        const auto g2 = g.reshape({p[k].size(0), -1});
        auto b2 = buf[k].view({p[k].size(0), -1});
        b2.mul_(mu).add_(g2);
        const auto u = o.nesterov ? g2 + mu * b2 : b2;
        const auto update = newton_schulz(u, o.ns_steps, o.ns_eps);
        const double shape = std::sqrt(std::max(1.0, static_cast<double>(g2.size(0)) / static_cast<double>(g2.size(1))));
        p[k].mul_(1.0 - lr * o.weight_decay).add_(update.reshape(p[k].sizes()), -lr * shape);
      } else {
        const double alr = static_cast<double>(static_cast<float>(lr * o.adamw_lr_scale));
        const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
        const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
        m[k].lerp_(g, 1.0 - o.beta1);
        v[k].mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
        const auto denom = v[k].sqrt() / std::sqrt(bc2) + o.eps;
        p[k].mul_(1.0 - alr * o.adamw_weight_decay).addcdiv_(m[k], denom, -alr / bc1);
      }
    }
  }
};

// ||a - b||_inf / ||b||_inf over one tensor, in double.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  const auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  const double scale = bd.abs().max().item<double>();
  return (ad - bd).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// The shapes under test: wide, tall (transposed), square, a conv-like 3-D
// tensor (4 x 6 as a matrix), a vector, a 1 x n tensor (not a matrix: AdamW).
// Small values, of the order of a few steps: the parameters are stored in
// fp32, and rounding a large value would swamp the change being compared.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(3);
  std::vector<torch::Tensor> p{torch::randn({8, 16}), torch::randn({24, 6}), torch::randn({10, 10}),
                               torch::randn({4, 3, 2}), torch::randn({7}),     torch::randn({1, 5})};
  for (auto& x : p) x.mul_(0.02);
  return p;
}

std::vector<torch::Tensor> make_grads(const std::vector<torch::Tensor>& like, int step) {
  torch::manual_seed(100 + step);
  std::vector<torch::Tensor> g;
  double s = 0.5;
  for (const auto& x : like) {
    g.push_back(torch::randn(x.sizes()) * s);
    s *= 1.7;
  }
  return g;
}

constexpr int steps = 6;

dc::inner::muon::options test_options() {
  return {.lr = 0.02f, .weight_decay = 0.1f, .adamw_lr_scale = 0.05f, .adamw_weight_decay = 0.01f};
}

// Steps ours (through diloco::optimizer over the libtorch tensors themselves)
// and the reference side by side; returns the worst relative difference of
// the change p_t - p_0 over all tensors and steps, against the double
// reference and (second) against the same reference run in fp32.
std::pair<double, double> run_against_torch(const dc::inner::muon::options& opts) {
  auto ours = make_params();
  std::vector<torch::Tensor> start;
  for (const auto& x : ours) start.push_back(x.clone());
  torch_muon ref64(ours, opts, torch::kDouble), ref32(ours, opts, torch::kFloat);
  dc::optimizer<dc::inner::muon> opt(ours, opts);
  double worst64 = 0.0, worst32 = 0.0;
  for (int s = 0; s < steps; ++s) {
    const auto g = make_grads(ours, s);
    opt.step(g);
    ref64.step(g);
    ref32.step(g);
    for (std::size_t k = 0; k < ours.size(); ++k) {
      CAPTURE(k);
      CAPTURE(s);
      const auto mine = ours[k].to(torch::kDouble) - start[k].to(torch::kDouble);
      const double r64 = relative(mine, ref64.p[k] - start[k].to(torch::kDouble));
      const double r32 = relative(mine, ref32.p[k].to(torch::kDouble) - start[k].to(torch::kDouble));
      CHECK(r64 < 1e-5);
      CHECK(r32 < 1e-5);
      worst64 = std::max(worst64, r64);
      worst32 = std::max(worst32, r32);
    }
  }
  CHECK(opt.steps() == static_cast<std::uint64_t>(steps));
  return {worst64, worst32};
}

// The visitor the checkpoint uses, reduced to copying buffers out or in.
struct slot_copy {
  bool restore = false;
  std::vector<std::vector<float>> buffers;
  std::vector<std::uint64_t> scalars;
  std::vector<std::string> names;
  std::size_t next_buffer = 0, next_scalar = 0;
  void buffer(const std::string& name, float* data, std::size_t n, bool /*device*/) {
    if (restore) {
      REQUIRE(buffers[next_buffer].size() == n);
      std::copy(buffers[next_buffer].begin(), buffers[next_buffer].end(), data);
      ++next_buffer;
    } else {
      names.push_back(name);
      buffers.emplace_back(data, data + n);
    }
  }
  void scalar(const std::string& name, std::uint64_t& x) {
    if (restore) {
      x = scalars[next_scalar++];
    } else {
      names.push_back(name);
      scalars.push_back(x);
    }
  }
};

std::vector<float> flat(const std::vector<torch::Tensor>& ts) {
  std::vector<float> out;
  for (const auto& t : ts) out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  return out;
}

}  // namespace

TEST_CASE("inner::muon follows Muon written with libtorch ops (Nesterov, weight decay, AdamW for non-matrices)") {
  const auto [r64, r32] = run_against_torch(test_options());
  MESSAGE("max relative difference of p_t - p_0: " << r64 << " vs the double reference, " << r32
                                                     << " vs the fp32 reference");
}

TEST_CASE("inner::muon without Nesterov, with clipping, more Newton-Schulz steps") {
  auto o = test_options();
  o.nesterov = false;
  o.momentum = 0.8f;
  o.max_grad_norm = 1.0f;  // the gradients' norm is far above: every step is clipped
  o.ns_steps = 7;
  const auto [r64, r32] = run_against_torch(o);
  MESSAGE("max relative difference of p_t - p_0: " << r64 << " vs the double reference, " << r32
                                                     << " vs the fp32 reference");
}

TEST_CASE("inner::muon: the slots are the reference's buffers, and a restored copy continues with the same bits") {
  using core = dc::detail::optimizer_core<dc::inner::muon, dc::host_space>;
  const auto opts = test_options();
  auto params = make_params();
  torch_muon ref(params, opts, torch::kDouble);
  const dc::parameter_set<float, dc::host_space> set(params);
  dc::exec::host exec;
  core a(set.total(), opts);
  auto raw = [](const std::vector<torch::Tensor>& g) {
    std::vector<dc::detail::raw_tensor> r;
    for (const auto& t : g) r.push_back({t.data_ptr<float>(), static_cast<std::size_t>(t.numel())});
    return r;
  };
  for (int s = 0; s < 3; ++s) {
    const auto g = make_grads(params, s);
    a.step(exec, set, raw(g));
    ref.step(g);
  }
  slot_copy saved;
  a.visit_state(saved, "inner");
  REQUIRE(saved.names == std::vector<std::string>{"inner.slots", "inner.steps"});
  REQUIRE(saved.buffers[0].size() == 2 * set.total());
  CHECK(saved.scalars[0] == 3);
  const float* slots = saved.buffers[0].data();
  for (std::size_t k = 0; k < params.size(); ++k) {
    CAPTURE(k);
    const auto n = static_cast<std::int64_t>(params[k].numel());
    auto slot = [&](std::size_t s) {
      return torch::from_blob(const_cast<float*>(slots + s * set.total() + set.offset(k)), {n}, torch::kFloat).clone();
    };
    if (torch_muon::is_matrix(params[k])) {
      CHECK(relative(slot(0), ref.buf[k].reshape({n})) < 1e-6);
      CHECK(slot(1).abs().max().item<float>() == 0.0f);  // unused by a matrix
    } else {
      CHECK(relative(slot(0), ref.m[k].reshape({n})) < 1e-6);
      CHECK(relative(slot(1), ref.v[k].reshape({n})) < 1e-6);
    }
  }

  // A fresh optimizer over a copy of the parameters, restored from the
  // visit, then both take the same steps: the same bits.
  std::vector<torch::Tensor> copy;
  for (const auto& x : params) copy.push_back(x.clone());
  const dc::parameter_set<float, dc::host_space> copy_set(copy);
  core b(copy_set.total(), opts);
  saved.restore = true;
  b.visit_state(saved, "inner");
  CHECK(b.steps() == 3);
  for (int s = 3; s < 5; ++s) {
    const auto g = make_grads(params, s);
    a.step(exec, set, raw(g));
    b.step(exec, copy_set, raw(g));
  }
  CHECK(flat(params) == flat(copy));
}

TEST_CASE("inner::muon: options out of range are refused by name") {
  auto refused = [](dc::inner::muon::options o, const char* what) {
    CAPTURE(what);
    std::vector<float> w(6, 1.0f);
    CHECK_THROWS_AS_MESSAGE(dc::optimizer<dc::inner::muon>(dc::matrix_view<float>(w.data(), 2, 3), o), dc::config_error,
                            what);
    try {
      dc::inner::muon::validate(o);
    } catch (const dc::config_error& e) {
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  refused({.ns_steps = 0}, "muon: ns_steps must lie in [1, 100]");
  refused({.momentum = 1.0f}, "muon: momentum must lie in [0, 1)");
  refused({.ns_eps = 0.0f}, "muon: ns_eps must be a finite number > 0");
  refused({.lr = -1.0f}, "muon: lr");
  refused({.beta2 = 1.5f}, "muon: beta2");
  refused({.adamw_lr_scale = -0.1f}, "muon: adamw_lr_scale");
  refused({.max_grad_norm = -1.0f}, "muon: max_grad_norm");
  // A gradient list that does not match the parameters.
  std::vector<float> w(6, 1.0f), g(5, 1.0f);
  dc::optimizer<dc::inner::muon> opt(dc::matrix_view<float>(w.data(), 2, 3));
  CHECK_THROWS_AS(opt.step(g), dc::config_error);
}

TEST_CASE("DiLoCo with inner::muon over comm::threads follows the algorithm written with the libtorch reference") {
  constexpr int workers = 2, h = 3, rounds = 2;
  const dc::inner::muon::options inner = test_options();
  const double outer_lr = 0.7, outer_mu = 0.9;
  // Worker m's loss: 0.5 * ||p - target_m||^2 per tensor, so its gradient is
  // p - target_m. Drawn here: the generator's seed is global, not per thread.
  std::vector<std::vector<torch::Tensor>> target(workers);
  for (int m = 0; m < workers; ++m) {
    torch::manual_seed(50 + m);
    target[static_cast<std::size_t>(m)] = {torch::randn({6, 4}), torch::randn({4})};
  }
  auto targets = [&](int m) { return target[static_cast<std::size_t>(m)]; };
  torch::manual_seed(9);
  const std::vector<torch::Tensor> init{torch::randn({6, 4}) * 0.02, torch::randn({4}) * 0.02};

  // The definition: each worker's reference Muon, its state kept across
  // rounds; every H steps the mean pseudo-gradient drives Nesterov (PyTorch's
  // SGD form) on theta_global, and the replicas restart from it.
  std::vector<torch::Tensor> global;
  for (const auto& x : init) global.push_back(x.to(torch::kDouble));
  std::vector<torch::Tensor> outer_b(global.size());
  std::vector<torch_muon> ref;
  for (int m = 0; m < workers; ++m) ref.emplace_back(init, inner, torch::kDouble);
  std::vector<std::vector<torch::Tensor>> want;  // theta_global after each round
  for (int r = 0; r < rounds; ++r) {
    for (int m = 0; m < workers; ++m) {
      const auto tg = targets(m);
      for (int s = 0; s < h; ++s) {
        std::vector<torch::Tensor> g;
        for (std::size_t k = 0; k < tg.size(); ++k) g.push_back(ref[m].p[k] - tg[k].to(torch::kDouble));
        ref[m].step(g);
      }
    }
    for (std::size_t k = 0; k < global.size(); ++k) {
      auto delta = torch::zeros_like(global[k]);
      for (int m = 0; m < workers; ++m) delta += global[k] - ref[m].p[k];
      delta /= workers;
      outer_b[k] = r == 0 ? delta : outer_mu * outer_b[k] + delta;
      global[k] = global[k] - outer_lr * (delta + outer_mu * outer_b[k]);
      for (int m = 0; m < workers; ++m) ref[m].p[k] = global[k].clone();
    }
    std::vector<torch::Tensor> snapshot;
    for (const auto& x : global) snapshot.push_back(x.clone());
    want.push_back(snapshot);
  }

  std::vector<std::vector<std::vector<torch::Tensor>>> seen(workers);  // [rank][round]
  std::mutex mu;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    std::vector<torch::Tensor> params;
    for (const auto& x : init) params.push_back(x.clone());
    dc::algorithm<dc::inner::muon, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
        params, comm,
        {.inner_steps = h,
         .inner = inner,
         .outer = {.lr = static_cast<float>(outer_lr), .momentum = static_cast<float>(outer_mu)}});
    const auto tg = targets(m);
    for (int s = 0; s < h * rounds; ++s) {
      std::vector<torch::Tensor> g;
      for (std::size_t k = 0; k < tg.size(); ++k) g.push_back(params[k] - tg[k]);
      if (t.step(g)) {
        std::vector<torch::Tensor> snapshot;
        for (const auto& x : params) snapshot.push_back(x.clone());
        std::lock_guard lock(mu);
        seen[static_cast<std::size_t>(m)].push_back(snapshot);
      }
    }
    CHECK(t.stats().rounds == static_cast<std::uint64_t>(rounds));
  });

  double worst = 0.0;
  for (int m = 0; m < workers; ++m) {
    REQUIRE(seen[static_cast<std::size_t>(m)].size() == static_cast<std::size_t>(rounds));
    for (int r = 0; r < rounds; ++r)
      for (std::size_t k = 0; k < init.size(); ++k) {
        CAPTURE(m);
        CAPTURE(r);
        CAPTURE(k);
        const auto start = init[k].to(torch::kDouble);
        const double rel = relative(seen[static_cast<std::size_t>(m)][static_cast<std::size_t>(r)][k].to(torch::kDouble) - start,
                                    want[static_cast<std::size_t>(r)][k] - start);
        CHECK(rel < 1e-5);
        worst = std::max(worst, rel);
      }
  }
  MESSAGE("DiLoCo + Muon, 2 workers x 2 rounds: max relative difference of theta - theta_0: " << worst);
}

TEST_CASE("DiLoCo with inner::muon: a run resumed from a checkpoint ends with the bits of one that never saved") {
  using trainer = dc::algorithm<dc::inner::muon, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  const trainer::options opts{.inner_steps = 3, .inner = test_options()};
  const auto target = make_grads(make_params(), 7);  // the loss 0.5 * ||p - target||^2 per tensor
  auto train = [&](trainer& t, std::vector<torch::Tensor>& params, int from, int to) {
    for (int s = from; s < to; ++s) {
      std::vector<torch::Tensor> g;
      for (std::size_t k = 0; k < params.size(); ++k) g.push_back(params[k] - target[k]);
      t.step(g);
    }
  };
  dc::comm::local comm_a, comm_b, comm_c;
  auto straight = make_params();
  trainer a(straight, comm_a, opts);
  train(a, straight, 0, 10);

  // Saved mid-round (step 4 of 10: the momentum buffers and AdamW moments
  // are in the file), then resumed by a fresh trainer over fresh tensors.
  auto first = make_params();
  std::vector<std::byte> bytes;
  {
    trainer b(first, comm_b, opts);
    train(b, first, 0, 4);
    bytes = b.save_bytes();
  }
  auto resumed = make_params();
  trainer c(resumed, comm_c, opts);
  c.load(bytes);
  for (std::size_t k = 0; k < resumed.size(); ++k) CHECK(torch::equal(resumed[k], first[k]));
  train(c, resumed, 4, 10);
  CHECK(flat(resumed) == flat(straight));
  CHECK(c.stats().rounds == 3);
}
