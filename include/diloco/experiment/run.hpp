// SPDX-License-Identifier: Apache-2.0
#pragma once

// Runs a list of variants (experiment/variants.hpp) on one problem, each on
// a fresh group of workers from the launcher, with the same data and seeds,
// and returns one row per variant.
//
// A problem is a callable: problem(worker{rank, size, seed}) builds one
// worker's model, an object with
//   parameters()     the replica: a range of writable fp32 host tensors
//   gradients()      a range of fp32 tensors, filled by train()
//   train(step)      the loss and gradients of this worker's data of global
//                    step `step` (0-based); returns the training loss
//   evaluate()       the held-out loss of the parameters as they are now
// Every variant builds its models anew, so a problem whose data and
// initialisation are functions of (worker, step, seed) gives every variant
// the same data and the same start.
//
// A launcher runs a per-worker function on each worker of a group:
// on_threads{M} (a comm::threads world of M, new for every variant), or
// on_communicator{comm} (this process is one worker of comm: MPI ranks,
// Gloo processes). Rows are worker 0's view (its losses, bytes and times);
// on other processes run() returns their own.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/comm/threads.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/experiment/variants.hpp"
#include "diloco/optimizer.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco::experiment {

/// Who a model is built for: worker `rank` of `size` (a single_worker
/// baseline is worker 0 of the size it mirrors).
struct worker {
  ///@{
  /// The worker's rank, the group's size and the run's seed.
  int rank = 0;
  int size = 1;
  std::uint64_t seed = 1;
  ///@}
};

/// What a problem builds for a worker: parameters() (the replica, a range of
/// writable fp32 host tensors), gradients() (fp32 tensors that train() fills),
/// train(step) (returns the training loss of this worker's data of global
/// step `step`) and evaluate() (the held-out loss of the parameters now).
template <class M>
concept trainable_model = requires(M& m, std::uint64_t step) {
  requires tensor_range<decltype(m.parameters())>;
  requires mutable_float_tensor<std::ranges::range_reference_t<decltype(m.parameters())>>;
  requires tensor_range<decltype(m.gradients())>;
  { m.train(step) } -> std::convertible_to<double>;
  { m.evaluate() } -> std::convertible_to<double>;
};

/// A name=value label copied into every row (the problem's settings: shards,
/// batch, context, ...), written as a column of the CSV.
using tag = std::pair<std::string, std::string>;

/// How long and how each variant trains, the same for every variant.
struct settings {
  std::uint64_t steps = 1000;      ///< global steps; every worker takes one inner step per global step
  std::size_t inner_steps = 100;   ///< DiLoCo's H (the variant's options.inner_steps before configure)
  std::uint64_t eval_every = 0;    ///< a curve point (held-out loss) every N steps; 0: only at the end
  std::uint64_t seed = 1;          ///< passed to the problem
  std::function<float(std::uint64_t step)> lr{};  ///< the inner lr of each step; empty: the options' lr
  std::FILE* log = nullptr;        ///< a progress line per curve point (worker 0), or quiet
  std::vector<tag> tags{};  ///< name=value labels copied into every row
};

/// One point of a row's learning curve.
struct curve_point {
  std::uint64_t step = 0;       ///< steps done
  double train_loss = 0.0;      ///< worker 0's mean training loss since the previous point
  double held_out_loss = 0.0;   ///< of theta_global (DiLoCo) or the replica (baselines)
};

/// One variant's results: what it was, how it trained, what it cost (worker 0's view).
struct row {
  std::string variant;      ///< the variant's label
  std::string kind;         ///< diloco, data_parallel, single_worker
  ///@{
  /// The policies ("-" where none).
  std::string inner, outer, compressor, sync;
  ///@}
  int workers = 0;          ///< the group the data is split over (single_worker: the one it mirrors)
  std::size_t inner_steps = 0;  ///< H (DiLoCo); 0 for the baselines
  std::uint64_t steps = 0;  ///< global steps taken
  std::vector<tag> tags;  ///< the settings' tags
  double final_loss = 0.0;        ///< held-out, after the last step (and the last round)
  double final_train_loss = 0.0;  ///< the last curve point's
  std::uint64_t bytes_sent = 0;   ///< by worker 0 over the run
  std::uint64_t rounds = 0;       ///< outer rounds (DiLoCo), all-reduces (data parallel)
  double seconds = 0.0;           ///< worker 0's training wall time, evaluations excluded
  double blocked_seconds = 0.0;   ///< of which blocked in communication (stats().blocked_seconds, or the all-reduces)
  double hidden_seconds = 0.0;    ///< exchange time hidden behind inner steps (overlapping schedules)
  std::vector<curve_point> curve;  ///< the learning curve, one point per evaluation
};

/// Every variant's rows are equal in these, whatever the timing: what two
/// runs that must be bitwise equal agree on.
inline bool same_results(const row& a, const row& b) {
  if (a.curve.size() != b.curve.size()) return false;
  for (std::size_t i = 0; i < a.curve.size(); ++i)
    if (a.curve[i].step != b.curve[i].step || a.curve[i].train_loss != b.curve[i].train_loss ||
        a.curve[i].held_out_loss != b.curve[i].held_out_loss)
      return false;
  return a.final_loss == b.final_loss && a.final_train_loss == b.final_train_loss && a.bytes_sent == b.bytes_sent &&
         a.rounds == b.rounds && a.steps == b.steps && a.workers == b.workers;
}

// ------------------------------------------------------------ launchers

/// M workers as threads of this process (comm::threads), a new world per variant.
struct on_threads {
  int workers = 1;  ///< M, the group's size
  std::chrono::milliseconds timeout = std::chrono::minutes(10);  ///< bounds every wait for another worker
  /// The group's size.
  int size() const { return workers; }
  /// Runs per_worker(comm) on every worker of a new world, one thread each, and waits for all.
  template <class F>
  void operator()(F&& per_worker) const {
    comm::threads::world world(workers, timeout);
    world.run(std::forward<F>(per_worker));
  }
};

/// This process is one worker of `comm` (comm::mpi, comm::gloo, ...).
template <class Comm>
struct on_communicator {
  Comm* comm = nullptr;  ///< the communicator this process is a worker of
  /// Over `c`, which must outlive the launcher.
  explicit on_communicator(Comm& c) : comm(&c) {}
  /// The group's size.
  int size() const { return comm->size(); }
  /// Runs per_worker(comm) for this process's worker.
  template <class F>
  void operator()(F&& per_worker) const {
    per_worker(*comm);
  }
};

/// The configure callable that changes nothing.
struct keep_options {
  /// Changes nothing.
  template <class Options>
  void operator()(Options&, std::string_view) const {}
};

namespace detail {

using clock = std::chrono::steady_clock;

inline double since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

// Worker 0's record of a run: the loss curve, progress lines and the
// training time with evaluations taken out.
class recorder {
 public:
  recorder(const settings& s, std::string label, bool lead) : s_(s), label_(std::move(label)), lead_(lead) {}

  // After `done` steps, `loss` the last one's training loss; `eval()` is
  // the held-out loss, called at curve points.
  template <class Eval>
  void after_step(std::uint64_t done, double loss, Eval&& eval) {
    sum_ += loss;
    ++count_;
    if (lead_ && s_.eval_every > 0 && done % s_.eval_every == 0 && done < s_.steps) point(done, eval);
  }

  // The final point, after the last step and round.
  template <class Eval>
  void finish(Eval&& eval) {
    if (lead_) point(s_.steps, eval);
    seconds_ = since(t0_) - eval_seconds_;
  }

  double seconds() const { return seconds_; }
  std::vector<curve_point>& curve() { return curve_; }

 private:
  template <class Eval>
  void point(std::uint64_t done, Eval& eval) {
    const auto e0 = clock::now();
    const double held_out = eval();
    eval_seconds_ += since(e0);
    const double train = count_ ? sum_ / static_cast<double>(count_) : std::numeric_limits<double>::quiet_NaN();
    curve_.push_back({done, train, held_out});
    sum_ = 0.0;
    count_ = 0;
    if (s_.log) {
      std::fprintf(s_.log, "  [%s] step %llu/%llu  train loss %.4f  held-out %.4f  (%.1f s)\n", label_.c_str(),
                   static_cast<unsigned long long>(done), static_cast<unsigned long long>(s_.steps), train, held_out,
                   since(t0_) - eval_seconds_);
      std::fflush(s_.log);
    }
  }

  const settings& s_;
  std::string label_;
  bool lead_;
  clock::time_point t0_ = clock::now();
  double eval_seconds_ = 0.0, seconds_ = 0.0, sum_ = 0.0;
  std::uint64_t count_ = 0;
  std::vector<curve_point> curve_;
};

// The parameters as one flat copy, and back (to evaluate theta_global in a
// replica that holds local progress, then restore it).
template <class Params>
void save_flat(Params& params, std::vector<float>& out) {
  out.clear();
  for (auto&& t : params) {
    const float* p = tensor_data(t);
    out.insert(out.end(), p, p + tensor_size(t));
  }
}
template <class Params>
void load_flat(Params& params, const float* from) {
  for (auto&& t : params) {
    std::copy_n(from, tensor_size(t), tensor_data(t));
    from += tensor_size(t);
  }
}

// The held-out loss of theta_global, evaluated in the replica's tensors.
template <class Trainer, class Model>
double evaluate_global(Trainer& t, Model& m, std::vector<float>& saved) {
  auto&& params = m.parameters();
  save_flat(params, saved);
  const auto g = t.global_parameters();
  std::size_t k = 0;
  for (auto&& p : params) {
    std::copy_n(g.data() + t.global_offset(k), tensor_size(p), tensor_data(p));
    ++k;
  }
  const double loss = m.evaluate();
  load_flat(params, saved.data());
  return loss;
}

template <class V>
row row_header(const settings& s, int workers) {
  row r;
  r.variant = V::name();
  r.kind = method_name(V::kind);
  r.inner = V::inner_type::name;
  r.outer = V::outer_name();
  r.compressor = V::compressor_name();
  r.sync = V::sync_name();
  r.workers = workers;
  r.steps = s.steps;
  r.tags = s.tags;
  return r;
}

// A DiLoCo row's figures from the algorithm's statistics and the
// recorder; `bytes`: a worker's bytes sent (the statistics' own, or a
// group's sum where a worker is a group of ranks).
inline void fill_diloco_row(row& r, const diloco::stats& st, std::uint64_t bytes, recorder& rec) {
  r.bytes_sent = bytes;
  r.rounds = st.rounds;
  r.seconds = rec.seconds();
  r.blocked_seconds = st.blocked_seconds;
  r.hidden_seconds = st.hidden_seconds;
  r.curve = std::move(rec.curve());
}

template <class V, class Comm, class Problem, class Configure>
row train_diloco(Comm& comm, Problem& problem, const settings& s, Configure& configure) {
  auto model = problem(worker{comm.rank(), comm.size(), s.seed});
  static_assert(trainable_model<decltype(model)>,
                "diloco::experiment: problem(worker) must return a model with parameters(), gradients(), "
                "train(step) and evaluate() (see experiment/run.hpp)");
  typename V::options o{};
  o.inner_steps = s.inner_steps;
  configure(o, V::name());
  using trainer_type = typename V::template algorithm_for<Comm>;
  row r = row_header<V>(s, comm.size());
  r.inner_steps = o.inner_steps;
  trainer_type t(model.parameters(), comm, o);
  const bool lead = comm.rank() == 0;
  recorder rec(s, r.variant, lead);
  std::vector<float> saved;
  auto eval = [&] { return evaluate_global(t, model, saved); };
  for (std::uint64_t step = 0; step < s.steps; ++step) {
    if (s.lr) t.set_inner_lr(s.lr(step));
    const double loss = model.train(step);
    t.step(model.gradients());
    rec.after_step(step + 1, loss, eval);
  }
  // Steps beyond the last round would leave the replicas apart: a blocking
  // run ends with a round; the others apply what is in flight.
  if constexpr (std::is_same_v<typename V::sync_type, sync::blocking>) {
    if (t.steps_in_round() != 0) t.outer_round();
  } else {
    t.finish();
  }
  rec.finish(eval);
  fill_diloco_row(r, t.stats(), t.stats().bytes_sent, rec);
  return r;
}

// Data parallel (all_reduce of the gradients every step) or one worker
// alone (no communication, worker 0's data; the other workers idle).
template <class V, class Comm, class Problem, class Configure>
row train_baseline(Comm& comm, Problem& problem, const settings& s, Configure& configure) {
  constexpr bool alone = V::kind == method::single_worker;
  row r = row_header<V>(s, comm.size());
  if (alone && comm.rank() != 0) return r;
  auto model = problem(worker{alone ? 0 : comm.rank(), comm.size(), s.seed});
  static_assert(trainable_model<decltype(model)>,
                "diloco::experiment: problem(worker) must return a model with parameters(), gradients(), "
                "train(step) and evaluate() (see experiment/run.hpp)");
  typename V::options o{};
  configure(o, V::name());
  diloco::optimizer<typename V::inner_type> opt(model.parameters(), o.inner);
  // The mean gradient lands in one flat buffer: one all-reduce per step.
  std::vector<float> flat;
  std::vector<host_view<const float>> views;
  const auto traffic0 = comm.traffic();
  recorder rec(s, r.variant, comm.rank() == 0);
  double blocked = 0.0;
  for (std::uint64_t step = 0; step < s.steps; ++step) {
    if (s.lr) opt.set_lr(s.lr(step));
    const double loss = model.train(step);
    if constexpr (alone) {
      opt.step(model.gradients());
    } else {
      auto&& grads = model.gradients();
      save_flat(grads, flat);
      if (views.empty()) {
        std::size_t off = 0;
        for (auto&& g : grads) {
          views.emplace_back(flat.data() + off, tensor_size(g));
          off += tensor_size(g);
        }
      }
      const auto t0 = clock::now();
      comm.all_reduce(std::span<float>(flat), reduce_op::mean);
      blocked += since(t0);
      opt.step(views);
    }
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

template <class V, class Problem, class Launch, class Configure>
row run_variant(Problem& problem, Launch& launch, const settings& s, Configure& configure) {
  row out;
  launch([&](auto& comm) {
    row r;
    if constexpr (V::kind == method::diloco)
      r = train_diloco<V>(comm, problem, s, configure);
    else
      r = train_baseline<V>(comm, problem, s, configure);
    if (comm.rank() == 0) {
      r.final_loss = r.curve.empty() ? std::numeric_limits<double>::quiet_NaN() : r.curve.back().held_out_loss;
      r.final_train_loss = r.curve.empty() ? std::numeric_limits<double>::quiet_NaN() : r.curve.back().train_loss;
      out = std::move(r);
    }
  });
  return out;
}

}  // namespace detail

/// Runs every variant of `Variants` (a variants<...> list) in order and
/// returns their rows. `configure(options, label)` may change each
/// variant's options after the defaults (options.inner_steps =
/// s.inner_steps for DiLoCo variants) are set.
template <class Variants, class Problem, class Launch, class Configure = keep_options>
std::vector<row> run(Problem&& problem, Launch&& launch, const settings& s, Configure&& configure = {}) {
  if (s.steps == 0) diloco::detail::raise<config_error>("diloco::experiment::run: settings.steps must be >= 1");
  std::vector<row> rows;
  [&]<class... V>(variants<V...>*) {
    (rows.push_back(detail::run_variant<V>(problem, launch, s, configure)), ...);
  }(static_cast<Variants*>(nullptr));
  return rows;
}

}  // namespace diloco::experiment
