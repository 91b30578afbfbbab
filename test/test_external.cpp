// SPDX-License-Identifier: Apache-2.0
// Wrapper mode (inner::external, issue 40 item 1): the user's own libtorch
// optimizer takes the inner steps on the model's tensors and t.step() only
// counts and runs the schedule. The reference is the library's own fused
// inner optimizer on an identical copy, itself checked against torch::optim
// in test_torch: torch::optim::SGD (momentum) and AdamW wrapped reproduce
// inner::sgd and inner::adamw over several rounds of every schedule (two
// workers, comm::threads) to 1e-6 relative; the user's optimizer state
// carries across rounds untouched; a checkpoint carries the user's state in
// the same file (save(path, writer) / load(path, reader)) and a resumed run
// continues bit for bit; misuse is refused by name.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/tensor/torch.hpp>
#include <filesystem>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "torch_classifier.hpp"

// Debian's libtorch brings glog, whose CHECK (abort on failure) replaces
// doctest's: take doctest's back, so a failed check is reported and counted.
#undef CHECK
#define CHECK DOCTEST_CHECK

namespace dc = diloco;

namespace {

constexpr int M = 2;      // workers
constexpr int H = 4;      // inner steps per round
constexpr int steps = 14;  // three rounds and a half; finish() then applies what is in flight

using torch_classifier::batches;
using torch_classifier::forward_backward;
using torch_classifier::make_model;
using torch_classifier::max_relative_difference;

// Each worker's batches, made before the threads start (torch's generator is global).
std::vector<batches> make_data() {
  torch::manual_seed(11);
  std::vector<batches> d;
  for (int m = 0; m < M; ++m) d.emplace_back(2 * steps);
  return d;
}

std::vector<torch::Tensor> snapshot(torch::nn::Sequential& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

constexpr double sgd_lr = 0.05, sgd_momentum = 0.9;
constexpr double adam_lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;

enum class inner_kind { sgd, adamw };

template <class Inner, class Sync>
using trainer = dc::algorithm<Inner, dc::outer::nesterov, dc::compress::none, dc::comm::threads, Sync>;

template <class Inner, class Sync>
typename trainer<Inner, Sync>::options options_for(typename Inner::options inner, typename Sync::options so) {
  return {.inner_steps = H, .inner = inner, .outer = {.lr = 0.7f, .momentum = 0.9f}, .sync = so};
}

dc::inner::sgd::options fused_sgd() {
  return {.lr = static_cast<float>(sgd_lr), .momentum = static_cast<float>(sgd_momentum)};
}
dc::inner::adamw::options fused_adamw() {
  return {.lr = static_cast<float>(adam_lr),
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .eps = static_cast<float>(eps),
          .weight_decay = static_cast<float>(weight_decay)};
}
std::unique_ptr<torch::optim::Optimizer> torch_optimizer(inner_kind k, torch::nn::Sequential& m) {
  if (k == inner_kind::sgd)
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(sgd_lr).momentum(sgd_momentum));
  return std::make_unique<torch::optim::AdamW>(
      m->parameters(), torch::optim::AdamWOptions(adam_lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay));
}

struct outcome {
  std::vector<std::vector<torch::Tensor>> replica;  // per worker, after finish()
  std::vector<std::vector<float>> global;           // per worker
  std::vector<std::uint64_t> rounds;
};

// Two workers train `steps` inner steps and finish(): the library's own
// inner optimizer (fused) or the user's torch optimizer (external).
template <class Sync>
outcome run(inner_kind k, bool external, typename Sync::options so) {
  const auto data = make_data();
  std::vector<torch::nn::Sequential> models;
  for (int m = 0; m < M; ++m) models.push_back(make_model());
  outcome out{std::vector<std::vector<torch::Tensor>>(M), std::vector<std::vector<float>>(M),
              std::vector<std::uint64_t>(M)};
  dc::comm::threads::world world(M);
  world.run([&](dc::comm::threads& comm) {
    const auto m = static_cast<std::size_t>(comm.rank());
    auto& model = models[m];
    dc::torch_parameters params(model);
    auto finish = [&](auto& t) {
      t.finish();
      out.replica[m] = snapshot(model);
      const auto g = t.global_parameters();
      out.global[m].assign(g.data(), g.data() + g.size());
      out.rounds[m] = t.stats().rounds;
    };
    if (external) {
      auto opt = torch_optimizer(k, model);
      trainer<dc::inner::external, Sync> t(params.tensors(), comm, options_for<dc::inner::external, Sync>({}, so));
      for (int s = 0; s < steps; ++s) {
        forward_backward(model, data[m], s);
        opt->step();
        t.step();
      }
      finish(t);
    } else if (k == inner_kind::sgd) {
      trainer<dc::inner::sgd, Sync> t(params.tensors(), comm, options_for<dc::inner::sgd, Sync>(fused_sgd(), so));
      for (int s = 0; s < steps; ++s) {
        forward_backward(model, data[m], s);
        t.step(params.gradients());
      }
      finish(t);
    } else {
      trainer<dc::inner::adamw, Sync> t(params.tensors(), comm, options_for<dc::inner::adamw, Sync>(fused_adamw(), so));
      for (int s = 0; s < steps; ++s) {
        forward_backward(model, data[m], s);
        t.step(params.gradients());
      }
      finish(t);
    }
  });
  return out;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

template <class Sync>
void compare(typename Sync::options so = {}) {
  for (inner_kind k : {inner_kind::sgd, inner_kind::adamw}) {
    const std::string which = k == inner_kind::sgd ? "torch::optim::SGD (momentum 0.9) vs inner::sgd"
                                                   : "torch::optim::AdamW vs inner::adamw";
    CAPTURE(which);
    const outcome fused = run<Sync>(k, false, so);
    const outcome wrapped = run<Sync>(k, true, so);
    // The outer steps ran: theta_global moved far beyond the tolerance.
    auto start = make_model();
    std::vector<float> flat0;
    for (auto& p : start->parameters()) {
      auto c = p.detach().contiguous();
      flat0.insert(flat0.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    for (int m = 0; m < M; ++m) {
      CAPTURE(m);
      const auto um = static_cast<std::size_t>(m);
      CHECK(wrapped.rounds[um] == fused.rounds[um]);
      CHECK(fused.rounds[um] >= 3);
      const double rel_replica = max_relative_difference(wrapped.replica[um], fused.replica[um]);
      const double rel_global = max_relative_difference(wrapped.global[um], fused.global[um]);
      MESSAGE(std::string(Sync::name) << ", " << which << ", worker " << m << ": replica " << rel_replica
                                      << ", theta_global " << rel_global);
      CHECK(rel_replica <= 1e-6);
      CHECK(rel_global <= 1e-6);
      CHECK(max_relative_difference(fused.global[um], flat0) > 1e-2);
    }
  }
}

}  // namespace

TEST_CASE("inner::external: the user's torch optimizer reproduces the fused inner optimizer, sync::blocking") {
  compare<dc::sync::blocking>();
}
TEST_CASE("inner::external: the user's torch optimizer reproduces the fused inner optimizer, sync::streaming") {
  compare<dc::sync::streaming>({.fragments = 2, .delay = 1, .alpha = 0.5f});
}
TEST_CASE("inner::external: the user's torch optimizer reproduces the fused inner optimizer, sync::one_step_delay") {
  compare<dc::sync::one_step_delay>();
}
TEST_CASE("inner::external: the user's torch optimizer reproduces the fused inner optimizer, sync::eager") {
  compare<dc::sync::eager>({.outer_lr = 0.4f});
}
TEST_CASE("inner::external: the user's torch optimizer reproduces the fused inner optimizer, sync::delayed") {
  compare<dc::sync::delayed>();
}

TEST_CASE("inner::external: the user's optimizer state is untouched by a round (momentum carries across it)") {
  // One worker, H = 2, outer SGD lr 1: theta_g - (theta_g - local) is the
  // replica up to fp32 rounding, so DiLoCo with one worker and plain
  // averaging is the inner trajectory. Wrapped torch SGD follows torch SGD
  // alone, whose momentum buffer runs through the round boundaries, and not
  // one whose momentum restarts at every round.
  using T = dc::algorithm<dc::inner::external, dc::outer::sgd, dc::compress::none, dc::comm::local>;
  const auto data = make_data();
  auto alone = make_model(), wrapped = make_model(), restarted = make_model();
  const auto sgd = torch::optim::SGDOptions(sgd_lr).momentum(sgd_momentum);
  torch::optim::SGD a(alone->parameters(), sgd), b(wrapped->parameters(), sgd);
  auto c = std::make_unique<torch::optim::SGD>(restarted->parameters(), sgd);
  dc::torch_parameters params(wrapped);
  dc::comm::local comm;
  T t(params.tensors(), comm, {.inner_steps = 2});
  int rounds = 0;
  for (int s = 0; s < 20; ++s) {
    forward_backward(alone, data[0], s);
    a.step();
    forward_backward(wrapped, data[0], s);
    b.step();
    rounds += t.step() ? 1 : 0;
    forward_backward(restarted, data[0], s);
    c->step();
    if (s % 2 == 1) c = std::make_unique<torch::optim::SGD>(restarted->parameters(), sgd);  // momentum forgotten
  }
  CHECK(rounds == 10);
  const double kept = max_relative_difference(snapshot(wrapped), snapshot(alone));
  const double forgotten = max_relative_difference(snapshot(restarted), snapshot(alone));
  MESSAGE("wrapped vs torch alone " << kept << ", momentum restarted each round vs torch alone " << forgotten);
  CHECK(kept <= 1e-6);
  CHECK(forgotten > 1e-3);
}

TEST_CASE("inner::external: a checkpoint holds the user's optimizer state in the same file; a resumed run continues "
          "bit for bit") {
  using T = trainer<dc::inner::external, dc::sync::one_step_delay>;
  const auto data = make_data();
  const std::string dir = (std::filesystem::temp_directory_path() / "diloco_test_external").string();
  std::filesystem::create_directories(dir);
  constexpr int saved_at = 6;  // mid-phase, a reduction in flight
  std::vector<std::vector<torch::Tensor>> straight(M), resumed(M), without_user(M);
  // mode 0: train straight through, saving at saved_at; 1: resume from the
  // file with the user's state; 2: resume without it (fresh torch momentum).
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<torch::nn::Sequential> models;
    for (int m = 0; m < M; ++m) models.push_back(make_model());
    dc::comm::threads::world world(M);
    world.run([&](dc::comm::threads& comm) {
      const auto m = static_cast<std::size_t>(comm.rank());
      auto& model = models[m];
      dc::torch_parameters params(model);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(sgd_lr).momentum(sgd_momentum));
      T t(params.tensors(), comm, options_for<dc::inner::external, dc::sync::one_step_delay>({}, {}));
      const std::string path = dir + "/rank" + std::to_string(m) + ".ckpt";
      int s = 0;
      if (mode == 0) {
        for (; s < saved_at; ++s) {
          forward_backward(model, data[m], s);
          opt.step();
          t.step();
        }
        t.save(path, [&](std::ostream& out) { torch::save(opt, out); });
      } else {
        if (mode == 1)
          t.load(path, [&](std::istream& in) { torch::load(opt, in); });
        else
          t.load(path);  // the user's section is there and left alone
        s = saved_at;
      }
      for (; s < steps; ++s) {
        forward_backward(model, data[m], s);
        opt.step();
        t.step();
      }
      t.finish();
      (mode == 0 ? straight : mode == 1 ? resumed : without_user)[m] = snapshot(model);
    });
  }
  for (std::size_t m = 0; m < M; ++m) {
    CAPTURE(m);
    bool all_same = true, any_differs = false;
    for (std::size_t k = 0; k < straight[m].size(); ++k) {
      all_same = all_same && torch::equal(straight[m][k], resumed[m][k]);
      any_differs = any_differs || !torch::equal(straight[m][k], without_user[m][k]);
    }
    CHECK(all_same);
    CHECK(any_differs);  // the momentum in the file mattered
  }
  // A reader for a file saved without the user's state: a format_error naming it.
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    auto model = make_model();
    dc::torch_parameters params(model);
    T t(params.tensors(), comm, options_for<dc::inner::external, dc::sync::one_step_delay>({}, {}));
    const std::string path = dir + "/plain.ckpt";
    t.save(path);
    bool called = false;
    try {
      t.load(path, [&](std::istream&) { called = true; });
      FAIL("load with a reader of a file without the user's state did not throw");
    } catch (const dc::format_error& e) {
      CHECK(std::string(e.what()).find("no user state") != std::string::npos);
    }
    CHECK_FALSE(called);
  });
  std::filesystem::remove_all(dir);
}

TEST_CASE("inner::external: the inner learning rate is the user's; asking the library for it is a config_error") {
  using T = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  std::vector<float> w(4, 1.0f);
  dc::comm::local comm;
  T t(w, comm, {.inner_steps = 2});
  CHECK_THROWS_WITH_AS(t.set_inner_lr(0.1f), doctest::Contains("inner::external"), dc::config_error);
  CHECK_THROWS_WITH_AS((void)t.inner_lr(), doctest::Contains("your optimizer"), dc::config_error);
  // The replica changes only where the user changes it: a round with no
  // progress leaves it (and theta_global) as they were.
  CHECK_FALSE(t.step());
  CHECK(t.step());
  CHECK(w == std::vector<float>(4, 1.0f));
}

// bf16 torch tensors (docs/algorithms.md section 6a): torch::optim::SGD steps
// the model's bf16 parameters, torch_low_precision_views hands them to the
// library. The same run over std::vector<diloco::bfloat16> copies of torch's
// values gives the same bits (the adapter is the plain bf16 path), every
// round's merge reaches the torch tensors as RNE(theta_global), and tensors
// of another dtype are refused by name.
TEST_CASE("inner::external with bf16 torch tensors: torch::optim::SGD steps them and the merges reach them") {
  using T = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;
  const dc::algorithm_options<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::sync::blocking> o{
      .inner_steps = 3, .outer = {.lr = 0.7f, .momentum = 0.9f}};
  constexpr int workers = 2, rounds = 3;
  std::vector<int> merged_ok(workers, 0);
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    torch::manual_seed(7);  // the same start on every worker
    std::vector<at::Tensor> params{torch::randn({3, 4}).to(torch::kBFloat16), torch::randn({5}).to(torch::kBFloat16)};
    for (auto& p : params) p.set_requires_grad(true);
    torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.5));
    std::vector<std::vector<dc::bfloat16>> copies;
    auto copy_out = [&] {
      copies.resize(params.size());
      for (std::size_t k = 0; k < params.size(); ++k) {
        const auto* src = reinterpret_cast<const dc::bfloat16*>(params[k].data_ptr());
        copies[k].assign(src, src + params[k].numel());
      }
    };
    copy_out();
    T via_torch(dc::torch_low_precision_views<dc::bfloat16>(params), comm, o);
    T via_vectors(copies, comm, o);
    const std::vector<float> start(via_torch.global_parameters().begin(), via_torch.global_parameters().end());
    for (std::size_t s = 0; s < rounds * o.inner_steps; ++s) {
      sgd.zero_grad();
      torch::NoGradGuard no_grad;
      for (std::size_t k = 0; k < params.size(); ++k)  // loss 1/2 ||p - c_m||^2: gradient p - c_m, in bf16
        params[k].mutable_grad() = params[k] - (0.25 * (m + 1) - 0.1 * static_cast<double>(k));
      sgd.step();
      copy_out();
      const bool round = via_torch.step();
      CHECK(via_vectors.step() == round);
      for (std::size_t k = 0; k < params.size(); ++k)
        CHECK(std::memcmp(params[k].data_ptr(), copies[k].data(), copies[k].size() * sizeof(dc::bfloat16)) == 0);
      if (round) {  // the merge: every element is RNE(theta_global)
        const auto g = via_torch.global_parameters();
        bool all = true;
        for (std::size_t k = 0; k < params.size(); ++k) {
          const auto* p = reinterpret_cast<const dc::bfloat16*>(params[k].data_ptr());
          for (std::size_t i = 0; i < copies[k].size(); ++i)
            all = all && p[i] == dc::bfloat16::round(g[via_torch.global_offset(k) + i]);
        }
        merged_ok[static_cast<std::size_t>(m)] += all ? 1 : 0;
      }
    }
    const auto ga = via_torch.global_parameters(), gb = via_vectors.global_parameters();
    CHECK(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)) == 0);
    CHECK(std::vector<float>(ga.begin(), ga.end()) != start);  // the rounds moved theta_global
  });
  CHECK(merged_ok == std::vector<int>(workers, rounds));

  std::vector<at::Tensor> wrong{torch::zeros({4})};
  CHECK_THROWS_WITH_AS(dc::torch_low_precision_views<dc::bfloat16>(wrong), doctest::Contains("expected BFloat16"),
                       dc::config_error);
  std::vector<at::Tensor> half{torch::zeros({4}).to(torch::kHalf)};
  CHECK(dc::torch_low_precision_views<dc::float16>(half).size() == 1);
}
