// SPDX-License-Identifier: Apache-2.0
// One worker of the slow-link benchmark (bench/wan/run.sh starts two, each in
// its own network namespace behind a shaped link). It trains the demo's
// character model (examples/char_mlp) one way, chosen on the command line:
// synchronous data parallel (the gradients all-reduced every step) or DiLoCo
// with a compressor and a schedule, and rank 0 prints `name: value` lines:
//
//   wall_seconds            the training clock: from a barrier after setup to
//                           the last reduction applied (finish() included),
//                           less the time spent taking loss snapshots
//   inner_seconds           time in inner steps: forward/backward, timed at
//                           every step, plus the inner optimizer's update
//   compute_utilisation     inner_seconds / wall_seconds
//   compute_utilisation_rank<k>, compute_utilisation_workers
//                           the same figure of every worker, and its mean
//                           over the workers: a worker whose core ran its
//                           inner steps faster than its peer's waits for it
//                           at the rounds, so the workers' figures differ by
//                           what their cores did (the mean is the cluster's)
//   compute_utilisation_quiet
//                           steps x a quiet inner step / wall_seconds, where
//                           a quiet step's forward/backward is timed before
//                           training, with nothing in flight: an exchange
//                           that runs beside the inner steps on the same core
//                           slows them down, which the first figure counts as
//                           compute and this one does not
//   training_thread_cpu_seconds, other_threads_cpu_seconds
//                           CPU time over the training clock of the thread
//                           that trains and of the process's other threads:
//                           the communicator's (Gloo's event loop, the
//                           progress thread), whose work on a worker's one
//                           core is what the training thread waits behind
//   round_step_ms_median, round_step_ms_p90, round_step_ms_max
//                           DiLoCo: step() at the end of each round (the
//                           inner update, the round's own work on the
//                           training thread, and any wait for an exchange)
//   forward_backward_ms_p90 the 90th percentile of a step's forward/backward
//   bytes_per_worker        what this worker sent, setup excluded
//   final_loss              held-out loss of the trained model (DiLoCo:
//                           theta_global after the last reduction)
//   time_to_target_seconds  training clock at the first loss snapshot at or
//                           below --target-loss (nan when none is)
//   loss_curve: STEP SECONDS LOSS   one line per snapshot
//
// Loss snapshots: every --eval-every steps each worker copies the model
// (DiLoCo: theta_global) with the training clock's reading; the copy's time
// is taken off the clock. The held-out losses of the snapshots are computed
// after training (the workers share the work), so evaluating costs the
// training clock nothing and never holds up an exchange in flight.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <diloco/comm/gloo.hpp>
#include <diloco/diloco.hpp>
#include <exception>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "char_mlp/cli_checks.hpp"
#include "char_mlp/corpus.hpp"
#include "char_mlp/experiment.hpp"
#include "char_mlp/model.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct bench_options {
  char_mlp::config c;
  std::string method = "diloco";  // ddp or diloco
  std::string compress = "none";  // DiLoCo: none or int4 (+ error feedback)
  std::string sync = "blocking";  // DiLoCo: blocking, streaming, delay, eager
  std::string label;              // printed as `method:`; default from the above
  int eval_every = 50;            // steps between loss snapshots
  double target_loss = 0.0;       // 0: 1.02 x this run's final loss
  double max_seconds = 0.0;       // ddp: stop at the first snapshot after this much training time
  bool no_argument_checks = false;  // comm::gloo's options.check_arguments off
  bool normal_scheduling = false;   // comm::gloo's options.batch_scheduling off
};

// The model's parameters at one point of training.
struct snapshot {
  int step = 0;
  double seconds = 0.0;  // training clock
  std::vector<float> params;
  double loss = 0.0;
};

// The clock, the per-step timings and the snapshots of one run.
class run_record {
 public:
  void start() {
    t0_ = clock_type::now();
    excluded_ = 0.0;
    thread0_ = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    process0_ = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  }
  // The end of training: CPU time of this thread and of the others since start().
  void stop() {
    thread_cpu_ = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread0_;
    other_cpu_ = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process0_ - thread_cpu_;
  }
  double thread_cpu_seconds() const { return thread_cpu_; }
  double other_threads_cpu_seconds() const { return other_cpu_; }
  double seconds() const { return seconds_between(t0_, clock_type::now()) - excluded_; }

  // One inner step: forward/backward seconds and inner-update seconds.
  void add_step(double forward_backward, double update) {
    forward_backward_.push_back(forward_backward);
    updates_.push_back(update);
  }
  // A forward/backward pass timed before training, nothing in flight.
  void add_quiet(double forward_backward) { quiet_.push_back(forward_backward); }

  template <class CopyInto>
  void take_snapshot(int step, std::size_t count, CopyInto&& copy_into) {
    const auto t = clock_type::now();
    snapshot s{step, seconds(), std::vector<float>(count), 0.0};
    copy_into(s.params.data());
    snapshots_.push_back(std::move(s));
    excluded_ += seconds_between(t, clock_type::now());
  }

  std::vector<snapshot>& snapshots() { return snapshots_; }
  std::size_t steps() const { return updates_.size(); }
  // Inner-step time: forward/backward as timed, plus the inner update. The
  // update of DiLoCo runs inside algorithm::step() with the schedule's work
  // of the step, so each step is given its own call's time up to the median
  // of those calls (a plain inner update, which most steps are), never more:
  // every term is a measured interval inside the training clock, so
  // inner_seconds <= timed_seconds <= wall_seconds by construction. (Giving
  // every step the median itself could exceed the wall when most steps carry
  // schedule work and a few do not, as streaming's do: CI saw 1.067.)
  double inner_seconds() const { return total(forward_backward_) + capped_updates(); }
  // Time in algorithm::step() (or the update) beyond the median call: the
  // round's own work at round boundaries, and any wait for an exchange.
  double update_excess_seconds() const { return total(updates_) - capped_updates(); }
  // Everything timed per step: forward/backward plus every update call.
  double timed_seconds() const { return total(forward_backward_) + total(updates_); }
  double step_seconds() const { return median(forward_backward_) + median(updates_); }
  double quiet_step_seconds() const { return median(quiet_) + median(updates_); }
  // The update calls of the steps that end a round (every `every`-th step):
  // quantile q in [0, 1] of their durations (DiLoCo's round work on this
  // thread and its waits, one round at a time).
  double round_update_quantile(std::size_t every, double q) const {
    std::vector<double> v;
    for (std::size_t i = every - 1; i < updates_.size(); i += every) v.push_back(updates_[i]);
    return quantile(std::move(v), q);
  }
  double forward_backward_quantile(double q) const { return quantile(forward_backward_, q); }

 private:
  static double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }
  // The sum over steps of min(update, median update).
  double capped_updates() const {
    const double m = median(updates_);
    double sum = 0.0;
    for (const double u : updates_) sum += std::min(u, m);
    return sum;
  }
  static double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }
  static double quantile(std::vector<double> v, double q) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    const auto k = std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())));
    const auto at = v.begin() + static_cast<std::ptrdiff_t>(k);
    std::nth_element(v.begin(), at, v.end());
    return *at;
  }

  static double cpu_seconds(clockid_t clock) {
    timespec t{};
    clock_gettime(clock, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }

  clock_type::time_point t0_{};
  double excluded_ = 0.0;
  double thread0_ = 0.0, process0_ = 0.0, thread_cpu_ = 0.0, other_cpu_ = 0.0;
  std::vector<double> forward_backward_, updates_, quiet_;
  std::vector<snapshot> snapshots_;
};

// What the worker reports beyond the record.
struct run_result {
  std::string label;
  double wall = 0.0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t rounds = 0;
  double hidden_fraction = std::numeric_limits<double>::quiet_NaN();
  double blocked = 0.0;  // the library's blocked_seconds: its own round work on this thread, and waits
};

void copy_model_params(char_mlp::model& m, float* out) {
  const auto flat = m.flat_parameters();
  std::copy(flat.begin(), flat.end(), out);
}

void load_params(char_mlp::model& m, const std::vector<float>& flat) {
  std::size_t off = 0;
  for (auto& t : m.parameters()) {
    std::copy_n(flat.data() + off, t.size(), t.data());
    off += t.size();
  }
}

// Times batch fills and forward/backward passes (as the training loops
// time them) on the first batches with nothing else running: the quiet
// inner step. Leaves the parameters as they were (the
// gradients are overwritten by the first training step).
void time_quiet_steps(const char_mlp::config& c, const char_mlp::dataset& d, int rank, int share,
                      char_mlp::model& m, run_record& rec) {
  char_mlp::batch_buffer b;
  const auto plan = char_mlp::make_shards(d, c);  // c.shards: iid, every worker samples the whole text
  for (int step = 0; step < 30; ++step) {
    const auto t0 = clock_type::now();
    b.fill(d, c, plan, step, rank, rank * share, share);
    m.forward(b.contexts.data(), b.targets.data(), share, true);
    rec.add_quiet(seconds_between(t0, clock_type::now()));
  }
}

bool snapshot_due(const bench_options& o, int step) { return step % o.eval_every == 0 || step == o.c.steps; }

// Synchronous data parallel: each worker's gradient on its share of the
// global batch, averaged by an all-reduce every step, then the same AdamW
// step on every replica (examples/char_mlp/experiment.hpp's run_data_parallel,
// with the timings the benchmark needs).
run_result run_data_parallel(const bench_options& o, const char_mlp::dataset& d, diloco::comm::gloo& comm,
                             run_record& rec) {
  const auto& c = o.c;
  char_mlp::model m(c.dims, c.seed);
  diloco::optimizer<diloco::inner::adamw> opt(m.parameters(), char_mlp::inner_options(c));
  const int share = c.batch / comm.size();
  char_mlp::batch_buffer b;
  const auto plan = char_mlp::make_shards(d, c);  // c.shards: iid, every worker samples the whole text
  const auto n = m.parameter_count();
  time_quiet_steps(c, d, comm.rank(), share, m, rec);
  comm.barrier();
  const auto traffic0 = comm.traffic();
  rec.start();
  rec.take_snapshot(0, n, [&](float* out) { copy_model_params(m, out); });
  for (int step = 0; step < c.steps; ++step) {
    const auto t0 = clock_type::now();
    b.fill(d, c, plan, step, comm.rank(), comm.rank() * share, share);
    m.forward(b.contexts.data(), b.targets.data(), share, true);
    const auto t1 = clock_type::now();
    comm.all_reduce(m.flat_gradients(), diloco::reduce_op::mean);
    const auto t2 = clock_type::now();
    opt.set_lr(char_mlp::lr_at(c, step));
    opt.step(m.gradients());
    rec.add_step(seconds_between(t0, t1), seconds_between(t2, clock_type::now()));
    if (snapshot_due(o, step + 1)) {
      rec.take_snapshot(step + 1, n, [&](float* out) { copy_model_params(m, out); });
      if (o.max_seconds > 0.0 && step + 1 < c.steps) {
        // A capped run stops at the same step on every rank: rank 0's clock decides.
        float over = comm.rank() == 0 && rec.seconds() > o.max_seconds ? 1.0f : 0.0f;
        comm.all_reduce(std::span<float>(&over, 1), diloco::reduce_op::sum);
        if (over > 0.0f) break;
      }
    }
  }
  const double wall = rec.seconds();
  rec.stop();
  return {o.label, wall, comm.traffic().bytes_sent - traffic0.bytes_sent, rec.steps(),
          std::numeric_limits<double>::quiet_NaN()};
}

template <class Compressor, class Sync>
run_result run_diloco(const bench_options& o, const char_mlp::dataset& d, diloco::comm::gloo& comm,
                      run_record& rec) {
  const auto& c = o.c;
  char_mlp::model m(c.dims, c.seed);
  using trainer = diloco::algorithm<diloco::inner::adamw, diloco::outer::nesterov, Compressor, diloco::comm::gloo, Sync>;
  typename Sync::options sync_opts{};
  if constexpr (std::is_same_v<Sync, diloco::sync::streaming>)
    sync_opts = {.fragments = static_cast<std::size_t>(c.fragments),
                 .delay = static_cast<std::size_t>(c.delay),
                 .alpha = c.alpha,
                 .assignment = diloco::sync::fragment_assignment::contiguous};
  trainer t(m.parameters(), comm,
            {.inner_steps = static_cast<std::size_t>(c.inner_steps),
             .inner = char_mlp::inner_options(c),
             .outer = {.lr = c.outer_lr, .momentum = c.outer_momentum},
             .sync = sync_opts});
  const auto n = m.parameter_count();
  auto copy_global = [&](float* out) {
    const auto g = t.global_parameters();
    std::size_t off = 0;
    for (std::size_t k = 0; k < m.parameters().size(); ++k) {
      const auto size = m.parameters()[k].size();
      std::copy_n(g.data() + t.global_offset(k), size, out + off);
      off += size;
    }
  };
  const int share = c.batch / comm.size();
  char_mlp::batch_buffer b;
  const auto plan = char_mlp::make_shards(d, c);  // c.shards: iid, every worker samples the whole text
  time_quiet_steps(c, d, comm.rank(), share, m, rec);
  comm.barrier();
  const auto stats0 = t.stats();
  rec.start();
  rec.take_snapshot(0, n, copy_global);
  for (int step = 0; step < c.steps; ++step) {
    const auto t0 = clock_type::now();
    b.fill(d, c, plan, step, comm.rank(), comm.rank() * share, share);
    m.forward(b.contexts.data(), b.targets.data(), share, true);
    const auto t1 = clock_type::now();
    t.set_inner_lr(char_mlp::lr_at(c, step));
    t.step(m.gradients());
    const auto t2 = clock_type::now();
    rec.add_step(seconds_between(t0, t1), seconds_between(t1, t2));
    if (step + 1 == c.steps) t.finish();  // the last reductions in flight are part of training
    if (snapshot_due(o, step + 1)) rec.take_snapshot(step + 1, n, copy_global);
  }
  const double wall = rec.seconds();
  rec.stop();
  const auto& st = t.stats();
  const double hidden = st.hidden_seconds - stats0.hidden_seconds;
  const double blocked = st.blocked_seconds - stats0.blocked_seconds;
  return {o.label, wall, st.bytes_sent - stats0.bytes_sent, st.rounds - stats0.rounds,
          Sync::overlaps && hidden + blocked > 0.0 ? hidden / (hidden + blocked)
                                                   : std::numeric_limits<double>::quiet_NaN(),
          blocked};
}

template <class Compressor>
run_result run_diloco_sync(const bench_options& o, const char_mlp::dataset& d, diloco::comm::gloo& comm,
                           run_record& rec) {
  namespace sy = diloco::sync;
  if (o.sync == "blocking") return run_diloco<Compressor, sy::blocking>(o, d, comm, rec);
  if (o.sync == "streaming") return run_diloco<Compressor, sy::streaming>(o, d, comm, rec);
  if (o.sync == "delay") return run_diloco<Compressor, sy::one_step_delay>(o, d, comm, rec);
  return run_diloco<Compressor, sy::eager>(o, d, comm, rec);
}

run_result run(const bench_options& o, const char_mlp::dataset& d, diloco::comm::gloo& comm, run_record& rec) {
  namespace cp = diloco::compress;
  if (o.method == "ddp") return run_data_parallel(o, d, comm, rec);
  if (o.compress == "int4") return run_diloco_sync<cp::error_feedback<cp::blockwise<diloco::int4>>>(o, d, comm, rec);
  return run_diloco_sync<cp::none>(o, d, comm, rec);
}

// The held-out loss of every snapshot. Every rank took the same snapshots
// (the model, or theta_global, is the same on all); they take turns
// evaluating them and the losses are summed (a few floats over the shaped
// link, after training).
void evaluate_snapshots(const char_mlp::config& c, const char_mlp::dataset& d, diloco::comm::gloo& comm,
                        run_record& rec) {
  auto& snaps = rec.snapshots();
  std::vector<float> losses(snaps.size(), 0.0f);
  char_mlp::model m(c.dims, c.seed);
  for (std::size_t i = 0; i < snaps.size(); ++i)
    if (static_cast<int>(i % static_cast<std::size_t>(comm.size())) == comm.rank()) {
      load_params(m, snaps[i].params);
      losses[i] = static_cast<float>(char_mlp::held_out_loss(m, d, c));
    }
  comm.all_reduce(std::span<float>(losses), diloco::reduce_op::sum);
  for (std::size_t i = 0; i < snaps.size(); ++i) snaps[i].loss = losses[i];
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  try {
    bench_options o;
    auto& c = o.c;
    // The benchmark's setting (docs/performance.md, "Slow links", says how
    // it was chosen). Hidden 1024: 182,880 parameters, 0.73 MB in fp32,
    // which a two-worker all-reduce sends in 58 ms or more at 100 Mbit/s,
    // while a global batch of 32 keeps an inner step near 2 ms on one core:
    // the fp32 exchange takes about three inner phases of H = 10, and data
    // parallel, which makes it every step, is bound by the link. The inner
    // learning rate is each method's best of 2e-3, 3e-3 and 4e-3 at 2000
    // steps (data parallel 3e-3, DiLoCo 2e-3); the outer momentum 0.7 is
    // the best of a small sweep. Streaming runs the configuration
    // docs/results.md found to train as well as blocking DiLoCo while it
    // hides the exchange (issue 43): P = 4 fragments, each exchange
    // overlapping the longest delay they allow, tau = floor(H/P) - 1 (1 at
    // H = 10; --delay sets another), and alpha = 0.1.
    c.dims.hidden = 1024;
    c.batch = 32;
    c.steps = 2000;
    c.inner_steps = 10;
    c.warmup_steps = 100;
    c.eval_windows = 8192;
    c.outer_momentum = 0.7f;
    c.fragments = 4;
    c.alpha = 0.1f;
    c.log_every = 0;
    CLI::App app{"One worker of the slow-link benchmark (bench/wan/run.sh starts them).", "wan_worker"};
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("--method", o.method, "ddp (gradients all-reduced every step) or diloco")
        ->capture_default_str()
        ->check(CLI::IsMember({"ddp", "diloco"}));
    app.add_option("--compress", o.compress, "DiLoCo: none (fp32) or int4 (block-wise int4 with error feedback)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "int4"}));
    app.add_option("--sync", o.sync, "DiLoCo schedule: blocking, streaming, delay (one-step delay) or eager")
        ->capture_default_str()
        ->check(CLI::IsMember({"blocking", "streaming", "delay", "eager"}));
    app.add_option("--label", o.label, "name of the run in the output (default: from the method)");
    app.add_option("--steps", c.steps, "global steps")->capture_default_str()->check(CLI::Range(1, 1 << 30));
    app.add_option("--batch", c.batch, "global batch, split over the workers")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--seed", c.seed, "data and initialization seed")->capture_default_str();
    app.add_option("--inner-steps", c.inner_steps, "DiLoCo's H")->capture_default_str()->check(CLI::Range(1, 1 << 30));
    app.add_option("--hidden", c.dims.hidden, "hidden units")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    auto* lr = app.add_option("--lr", c.lr, "AdamW peak learning rate (default: 3e-3 for ddp, 2e-3 for diloco)")
                   ->check(CLI::Range(1e-6, 1.0));
    app.add_option("--warmup", c.warmup_steps, "linear warmup steps")->capture_default_str()->check(CLI::Range(0, 1 << 30));
    app.add_option("--outer-lr", c.outer_lr, "DiLoCo outer Nesterov lr")->capture_default_str()->check(CLI::Range(1e-6, 10.0));
    app.add_option("--outer-momentum", c.outer_momentum, "DiLoCo outer momentum")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.999));
    app.add_option("--fragments", c.fragments, "streaming: fragments P")->capture_default_str()->check(CLI::Range(1, 64));
    auto* delay = app.add_option("--delay", c.delay, "streaming: inner steps tau each exchange overlaps "
                                                     "(default: the most the fragments allow, floor(H/P) - 1)")
                      ->check(CLI::Range(0, 1 << 20));
    app.add_option("--alpha", c.alpha, "streaming: weight of the local value at a merge")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--eval-every", o.eval_every, "steps between loss snapshots")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 30));
    app.add_option("--eval-windows", c.eval_windows, "held-out windows per evaluation")
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
    app.add_option("--target-loss", o.target_loss, "time_to_target_seconds: first snapshot at or below this "
                                                   "(default: 1.02 x this run's final loss)")
        ->check(CLI::Range(0.0, 100.0));
    app.add_option("--max-seconds", o.max_seconds, "ddp: stop at the first snapshot after this much training time "
                                                   "(the learning-rate schedule stays that of --steps)")
        ->check(CLI::Range(0.0, 1e9));
    app.add_flag("--synthetic", c.synthetic, "the built-in synthetic corpus instead of the fortunes");
    app.add_flag("--no-argument-checks", o.no_argument_checks,
                 "turn off comm::gloo's argument agreement (a small all-gather before every collective), to "
                 "measure what it costs on a slow link");
    app.add_flag("--normal-scheduling", o.normal_scheduling,
                 "run comm::gloo's threads under the normal policy, not SCHED_BATCH (options.batch_scheduling "
                 "off), to measure what batch scheduling gives on a shared core");
    if (char_mlp::parse_or_help(app, argc, argv, "")) return 0;
    if (lr->count() == 0) c.lr = o.method == "ddp" ? 3e-3f : 2e-3f;
    if (delay->count() == 0) c.delay = c.inner_steps / c.fragments >= 1 ? c.inner_steps / c.fragments - 1 : 0;
    if (o.label.empty())
      o.label = o.method == "ddp" ? "ddp" : "diloco_" + o.sync + (o.compress == "int4" ? "_int4_ef" : "_fp32");
    if (o.max_seconds > 0.0 && o.method != "ddp")
      throw diloco::config_error("--max-seconds caps data parallel only (a DiLoCo run is not capped)");
    if (o.method == "diloco" && c.steps % c.inner_steps != 0)
      throw diloco::config_error("--steps (" + std::to_string(c.steps) +
                                 ") must be a multiple of --inner-steps (" + std::to_string(c.inner_steps) +
                                 ") so that every run ends on a round");

    auto gloo_options = diloco::comm::gloo::options_from_env();
    gloo_options.check_arguments = !o.no_argument_checks;
    gloo_options.batch_scheduling = !o.normal_scheduling;
    diloco::comm::gloo comm(gloo_options);
    rank = comm.rank();
    if (c.batch % comm.size() != 0)
      throw diloco::config_error("--batch (" + std::to_string(c.batch) +
                                 ") must be a multiple of the world size (" + std::to_string(comm.size()) + ")");
    c.workers = comm.size();
    const auto data = char_mlp::load_dataset(c);
    c.dims.vocab = data.vocab();

    run_record rec;
    const run_result r = run(o, data, comm, rec);
    evaluate_snapshots(c, data, comm, rec);
    // Every rank's inner-step time and wall, for the per-rank figures.
    const auto world = static_cast<std::size_t>(comm.size());
    std::vector<float> per_rank(2 * world, 0.0f);
    per_rank[2 * static_cast<std::size_t>(rank)] = static_cast<float>(rec.inner_seconds());
    per_rank[2 * static_cast<std::size_t>(rank) + 1] = static_cast<float>(r.wall);
    comm.all_reduce(std::span<float>(per_rank), diloco::reduce_op::sum);
    if (rank != 0) return 0;

    const auto& snaps = rec.snapshots();
    const double final_loss = snaps.back().loss;
    const double target = o.target_loss > 0.0 ? o.target_loss : 1.02 * final_loss;
    double to_target = std::numeric_limits<double>::quiet_NaN();
    for (const auto& s : snaps)
      if (s.loss <= target) {
        to_target = s.seconds;
        break;
      }
    const double steps = static_cast<double>(rec.steps());
    char_mlp::model probe(c.dims, c.seed);
    std::printf("method: %s\n", r.label.c_str());
    std::printf("workers: %d\n", comm.size());
    std::printf("params: %zu\n", probe.parameter_count());
    std::printf("corpus: %s\n", data.source.c_str());
    std::printf("argument_checks: %s\n", o.no_argument_checks ? "off" : "on");
    std::printf("setting: hidden %d, batch %d, lr %g", c.dims.hidden, c.batch, static_cast<double>(c.lr));
    if (o.method == "diloco")
      std::printf(", H %d, outer lr %g, outer momentum %g", c.inner_steps, static_cast<double>(c.outer_lr),
                  static_cast<double>(c.outer_momentum));
    if (o.sync == "streaming")
      std::printf(", P %d, tau %d, alpha %g", c.fragments, c.delay, static_cast<double>(c.alpha));
    std::printf("\n");
    std::printf("steps: %zu\n", rec.steps());
    std::printf("steps_planned: %d\n", c.steps);
    std::printf("rounds: %llu\n", static_cast<unsigned long long>(r.rounds));
    std::printf("wall_seconds: %.3f\n", r.wall);
    std::printf("inner_seconds: %.3f\n", rec.inner_seconds());
    std::printf("compute_utilisation: %.4f\n", rec.inner_seconds() / r.wall);
    double mean_utilisation = 0.0;
    for (std::size_t k = 0; k < world; ++k) {
      const double inner = per_rank[2 * k], wall = per_rank[2 * k + 1];
      std::printf("compute_utilisation_rank%zu: %.4f (inner %.3f s, wall %.3f s)\n", k, inner / wall, inner, wall);
      mean_utilisation += inner / wall / static_cast<double>(world);
    }
    std::printf("compute_utilisation_workers: %.4f\n", mean_utilisation);
    std::printf("compute_utilisation_quiet: %.4f\n", steps * rec.quiet_step_seconds() / r.wall);
    std::printf("step_ms_median: %.3f\n", 1e3 * rec.step_seconds());
    std::printf("quiet_step_ms_median: %.3f\n", 1e3 * rec.quiet_step_seconds());
    std::printf("wall_ms_per_step: %.3f\n", 1e3 * r.wall / steps);
    std::printf("training_thread_cpu_seconds: %.3f\n", rec.thread_cpu_seconds());
    std::printf("other_threads_cpu_seconds: %.3f\n", rec.other_threads_cpu_seconds());
    std::printf("scheduling: %s\n", o.normal_scheduling ? "normal" : "batch");
    std::printf("bytes_per_worker: %llu\n", static_cast<unsigned long long>(r.bytes_sent));
    std::printf("hidden_fraction: %.4f\n", r.hidden_fraction);
    // Where the time that is not inner steps went: step()/update calls
    // beyond the median one, of which the library counts blocked_seconds as
    // its round work on this thread (encode, the stages run between inner
    // steps, decode-apply) and waits for the exchange; and what no step
    // timed (finish(), the loop).
    std::printf("update_excess_seconds: %.3f\n", rec.update_excess_seconds());
    if (o.method == "diloco") {
      // step() at the end of each round, in ms: the round's own work on this
      // thread, and any wait for the exchange.
      const auto every = static_cast<std::size_t>(c.inner_steps);
      std::printf("round_step_ms_median: %.3f\n", 1e3 * rec.round_update_quantile(every, 0.5));
      std::printf("round_step_ms_p90: %.3f\n", 1e3 * rec.round_update_quantile(every, 0.9));
      std::printf("round_step_ms_max: %.3f\n", 1e3 * rec.round_update_quantile(every, 1.0));
    }
    std::printf("forward_backward_ms_p90: %.3f\n", 1e3 * rec.forward_backward_quantile(0.9));
    std::printf("blocked_seconds: %.3f\n", r.blocked);
    std::printf("untimed_seconds: %.3f\n", r.wall - rec.timed_seconds());
    std::printf("final_loss: %.5f\n", final_loss);
    std::printf("target_loss: %.5f\n", target);
    std::printf("time_to_target_seconds: %.3f\n", to_target);
    for (const auto& s : snaps) std::printf("loss_curve: %d %.3f %.5f\n", s.step, s.seconds, s.loss);
    return 0;
  } catch (const std::exception& e) {
    if (rank >= 0)
      std::fprintf(stderr, "wan_worker rank %d: %s\n", rank, e.what());
    else
      std::fprintf(stderr, "wan_worker: %s\n", e.what());
    return 1;
  }
}
