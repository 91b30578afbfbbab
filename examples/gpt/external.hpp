// SPDX-License-Identifier: Apache-2.0
#pragma once

// The example's training loop when its own optimizer takes the inner steps
// (train_gpt --inner adamw-external, the default): each worker's model owns
// a torch::optim::AdamW (gpt::worker_model::inner_step: the schedule's lr,
// clip_grad_norm_, step) and diloco wraps it through inner::external, the
// way a libtorch trainer uses the library (docs/getting-started.md, "You
// keep your optimizer"):
//
//   loss = model.train(step);   // forward, backward
//   model.inner_step(step);     // the user's lr, clipping and AdamW step
//   t.step();                   // diloco counts; at a round it reads the
//                               // tensors and writes the merge back in place
//
// diloco::experiment::run drives the library's own inner optimizers
// (t.step(gradients)); this runs the same variant types (any outer
// optimizer, compressor and schedule, on any launcher) with that loop and
// returns the same rows, so the report, CSV and JSON are unchanged. Data
// parallel all-reduces the gradients into their mean, writes it back into
// the gradient tensors and takes the torch step on it (clipping the mean,
// as the library's path does); one worker alone takes the torch step on
// its own gradient.
//
// Groups (train_gpt --group-size G > 1, external_groups): the W ranks form
// R = W / G replica groups of G ranks (diloco::mesh). Each rank computes
// the gradient of its share of the step's batch (the W-way split, as data
// parallel's), the group averages them over intra (all_reduce_gradients),
// every rank takes the torch step on its full replica with the group's mean
// gradient (so the group's replicas stay identical), and
// diloco::replicated runs DiLoCo across the groups with theta_global, the
// outer state and the residuals sharded over the group (1/G per rank). The
// row counts the R groups as its workers and a group's bytes sent over
// inter as a worker's.

#include <cstdint>
#include <cstring>
#include <diloco/experiment.hpp>
#include <diloco/inner/external.hpp>
#include <diloco/replicated.hpp>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace gpt {

namespace dx = diloco::experiment;

// The `inner` column of the rows this loop produces.
inline constexpr const char* torch_adamw_label = "torch-adamw (external)";

namespace detail {

template <class V, class Comm, class Problem, class Configure>
dx::row external_diloco(Comm& comm, const Problem& problem, const dx::settings& s, Configure& configure) {
  auto model = problem(dx::worker{comm.rank(), comm.size(), s.seed});
  typename V::options o{};
  o.inner_steps = s.inner_steps;
  configure(o, V::name());
  typename V::template algorithm_for<Comm> t(model.parameters(), comm, o);
  dx::row r = dx::detail::row_header<V>(s, comm.size());
  r.inner = torch_adamw_label;
  r.inner_steps = o.inner_steps;
  dx::detail::recorder rec(s, r.variant, comm.rank() == 0);
  std::vector<float> saved;
  auto eval = [&] { return dx::detail::evaluate_global(t, model, saved); };
  for (std::uint64_t step = 0; step < s.steps; ++step) {
    const double loss = model.train(step);
    model.inner_step(step);
    t.step();
    rec.after_step(step + 1, loss, eval);
  }
  // As experiment::run: a blocking run ends with a round, the others apply
  // what is in flight.
  if constexpr (std::is_same_v<typename V::sync_type, diloco::sync::blocking>) {
    if (t.steps_in_round() != 0) t.outer_round();
  } else {
    t.finish();
  }
  rec.finish(eval);
  dx::detail::fill_diloco_row(r, t.stats(), t.stats().bytes_sent, rec);
  return r;
}

template <class V, class Comm, class Problem>
dx::row external_baseline(Comm& comm, const Problem& problem, const dx::settings& s) {
  constexpr bool alone = V::kind == dx::method::single_worker;
  dx::row r = dx::detail::row_header<V>(s, comm.size());
  r.inner = torch_adamw_label;
  if (alone && comm.rank() != 0) return r;
  auto model = problem(dx::worker{alone ? 0 : comm.rank(), comm.size(), s.seed});
  std::vector<float> flat;
  const auto traffic0 = comm.traffic();
  dx::detail::recorder rec(s, r.variant, comm.rank() == 0);
  double blocked = 0.0;
  for (std::uint64_t step = 0; step < s.steps; ++step) {
    const double loss = model.train(step);
    if constexpr (!alone) {
      // The mean gradient: one all-reduce of a flat copy, written back.
      const auto& grads = model.gradients();
      flat.clear();
      for (const auto& g : grads) {
        const float* p = g.template data_ptr<float>();
        flat.insert(flat.end(), p, p + g.numel());
      }
      const auto t0 = dx::detail::clock::now();
      comm.all_reduce(std::span<float>(flat), diloco::reduce_op::mean);
      blocked += dx::detail::since(t0);
      std::size_t off = 0;
      for (const auto& g : grads) {
        std::memcpy(g.template data_ptr<float>(), flat.data() + off, sizeof(float) * static_cast<std::size_t>(g.numel()));
        off += static_cast<std::size_t>(g.numel());
      }
    }
    model.inner_step(step);
    rec.after_step(step + 1, loss, [&] { return model.evaluate(); });
  }
  rec.finish([&] { return model.evaluate(); });
  if constexpr (!alone) {
    r.bytes_sent = comm.traffic().bytes_sent - traffic0.bytes_sent;
    r.rounds = s.steps;
  }
  r.seconds = rec.seconds();
  r.blocked_seconds = blocked;
  r.curve = std::move(rec.curve());
  return r;
}

template <class V, class Comm, class Problem, class Configure>
dx::row external_groups(Comm& comm, const Problem& problem, const dx::settings& s, Configure& configure,
                        int group_size) {
  diloco::mesh<Comm> m(comm, {.group_size = group_size});
  auto model = problem(dx::worker{comm.rank(), comm.size(), s.seed});
  typename V::options o{};
  o.inner_steps = s.inner_steps;
  configure(o, V::name());
  diloco::replicated<diloco::inner::external, typename V::outer_type, typename V::compressor_type, Comm,
                     typename V::sync_type>
      t(model.parameters(), m, o);
  dx::row r = dx::detail::row_header<V>(s, m.groups());
  r.variant += " (" + std::to_string(m.groups()) + " groups of " + std::to_string(group_size) + ")";
  r.inner = torch_adamw_label;
  r.inner_steps = o.inner_steps;
  dx::detail::recorder rec(s, r.variant, comm.rank() == 0);
  // theta_global is gathered over intra at the recorder's curve points (a
  // collective: every rank gathers, rank 0 evaluates).
  std::vector<std::vector<float>> global;
  for (const auto& p : model.parameters()) global.emplace_back(static_cast<std::size_t>(p.numel()));
  auto due = [&](std::uint64_t done) { return s.eval_every > 0 && done % s.eval_every == 0 && done < s.steps; };
  std::vector<float> saved;
  auto eval = [&] {
    auto& params = model.parameters();
    dx::detail::save_flat(params, saved);
    for (std::size_t k = 0; k < params.size(); ++k)
      std::copy_n(global[k].data(), global[k].size(), params[k].template data_ptr<float>());
    const double loss = model.evaluate();
    dx::detail::load_flat(params, saved.data());
    return loss;
  };
  for (std::uint64_t step = 0; step < s.steps; ++step) {
    const double loss = model.train(step);
    std::vector<torch::Tensor> grads = model.gradients();  // handles: the model's gradient tensors
    diloco::all_reduce_gradients(m, grads);
    model.inner_step(step);
    t.step();
    if (due(step + 1)) t.copy_global_to(global);
    rec.after_step(step + 1, loss, eval);
  }
  if constexpr (std::is_same_v<typename V::sync_type, diloco::sync::blocking>) {
    if (t.shard_algorithm().steps_in_round() != 0) t.outer_round();
  } else {
    t.finish();
  }
  t.copy_global_to(global);
  rec.finish(eval);
  // A group's bytes over inter: the sum of its ranks' (each sends its shard).
  const std::uint64_t mine = t.shard_algorithm().stats().bytes_sent;
  std::vector<std::uint64_t> each(static_cast<std::size_t>(group_size));
  m.intra().all_gather(std::as_bytes(std::span<const std::uint64_t>(&mine, 1)),
                       std::as_writable_bytes(std::span<std::uint64_t>(each)));
  std::uint64_t bytes = 0;
  for (const std::uint64_t b : each) bytes += b;
  dx::detail::fill_diloco_row(r, t.shard_algorithm().stats(), bytes, rec);
  return r;
}

}  // namespace detail

/// experiment::run's contract for variants whose inner optimizer is
/// inner::external and a problem whose models have inner_step(step).
/// group_size > 1: DiLoCo variants run over groups of that many ranks
/// (detail::external_groups; not sync::streaming, which diloco::replicated
/// does not support yet: a config_error).
template <class Variants, class Problem, class Launch, class Configure>
std::vector<dx::row> run_external(const Problem& problem, Launch& launch, const dx::settings& s, Configure&& configure,
                                  int group_size = 1) {
  std::vector<dx::row> rows;
  [&]<class... V>(dx::variants<V...>*) {
    auto one = [&]<class Variant>() {
      static_assert(std::is_same_v<typename Variant::inner_type, diloco::inner::external>,
                    "gpt::run_external: the variants' inner optimizer must be inner::external");
      dx::row out;
      launch([&](auto& comm) {
        dx::row r;
        if constexpr (Variant::kind == dx::method::diloco) {
          if (group_size <= 1) {
            r = detail::external_diloco<Variant>(comm, problem, s, configure);
          } else if constexpr (std::is_same_v<typename Variant::sync_type, diloco::sync::streaming>) {
            throw diloco::config_error("train_gpt: --group-size " + std::to_string(group_size) + " with '" +
                                       Variant::name() +
                                       "': diloco::replicated does not support sync::streaming yet (use blocking, "
                                       "one-step delay or eager)");
          } else {
            r = detail::external_groups<Variant>(comm, problem, s, configure, group_size);
          }
        } else {
          r = detail::external_baseline<Variant>(comm, problem, s);
        }
        if (comm.rank() == 0) {
          r.final_loss = r.curve.empty() ? std::numeric_limits<double>::quiet_NaN() : r.curve.back().held_out_loss;
          r.final_train_loss = r.curve.empty() ? std::numeric_limits<double>::quiet_NaN() : r.curve.back().train_loss;
          out = std::move(r);
        }
      });
      rows.push_back(std::move(out));
    };
    (one.template operator()<V>(), ...);
  }(static_cast<Variants*>(nullptr));
  return rows;
}

}  // namespace gpt
