// SPDX-License-Identifier: Apache-2.0
#pragma once

// The demo's experiment: one model trained three ways on the same data:
// synchronous data parallel over M workers (gradients all-reduced every
// step); DiLoCo over M workers with H inner steps; and one worker alone with
// the same per-worker compute (worker 0's share of every step, batch / M
// samples). Every global step of data parallel and DiLoCo consumes the same
// `batch` samples, split evenly over the workers, so both see exactly the
// same data.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <diloco/diloco.hpp>
#include <diloco/outer/sgd.hpp>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "model.hpp"
#include "shards.hpp"

namespace char_mlp {

// DiLoCo's outer step (--outer): Nesterov momentum (DiLoCo's), plain SGD
// (diloco::outer::sgd without momentum: lr 1 is model averaging), or the
// delayed Nesterov step (diloco::outer::delayed_nesterov, arXiv 2401.09135)
// on the one-step-delay row, whose means are a round old (the rows of the
// other schedules then take Nesterov).
enum class outer_step { nesterov, sgd, delayed_nesterov };

inline const char* name_of(outer_step o) {
  return o == outer_step::sgd ? "sgd" : o == outer_step::delayed_nesterov ? "delayed-nesterov" : "nesterov";
}

// The values of --outer (the demo's and the sweep's).
inline const std::vector<std::string> outer_names{"nesterov", "sgd"};
// The demo's --outer also takes delayed-nesterov (its one-step-delay row).
inline const std::vector<std::string> demo_outer_names{"nesterov", "sgd", "delayed-nesterov"};

// The outer step of a row with compressor `compress` (a name of --compress)
// under --outer `choice`: the step it names, or where it names none,
// Nesterov, except SparseLoCo, whose paper (arXiv 2508.15706) takes a plain
// outer SGD step and lets the error feedback play the part of momentum
// (under Nesterov 0.9 on top of it the demo's row lost about 50%).
inline outer_step outer_for(const std::string& choice, const std::string& compress) {
  if (choice == "sgd") return outer_step::sgd;
  if (choice == "nesterov") return outer_step::nesterov;
  if (choice == "delayed-nesterov") return outer_step::delayed_nesterov;
  if (!choice.empty())
    throw diloco::config_error("--outer must be nesterov, sgd or delayed-nesterov, not '" + choice + "'");
  return compress == "sparseloco" ? outer_step::sgd : outer_step::nesterov;
}

// The defaults are sized for the fortunes (2.3 M training characters): 4500
// steps of 512 samples are one pass over the training text (sampled with
// replacement), and H = 100 gives DiLoCo 45 outer rounds. The whole default
// demo (six rows) takes about a minute on two cores. From a small sweep on
// that budget: a 5-character context beat 4, 6 and 8 (data parallel, lr
// 1e-2); 128 hidden units gain about 0.04 nats for a third more time; lr
// 5e-3 keeps DiLoCo within about 1% of data parallel, while a higher lr
// helps data parallel a little and hurts DiLoCo (1e-2: 1.8% behind, 2e-2:
// 7%).
struct config {
  int workers = 4;
  int steps = 4500;        // global steps; each consumes `batch` samples
  int batch = 512;         // global batch, split over the workers
  int inner_steps = 100;   // DiLoCo's H
  float lr = 5e-3f;        // AdamW peak lr, every method
  float final_lr_fraction = 0.1f;  // cosine decay from lr to lr * this over the run
  int warmup_steps = 100;
  // Off by default: DiLoCo's outer Nesterov step amplifies the decoupled
  // decay carried in the pseudo-gradient (its steady-state gain is about
  // lr/(1-momentum) = 7), which on this small model and short run costs
  // DiLoCo several percent of loss. Try --weight-decay 0.1 to see it.
  float weight_decay = 0.0f;
  // The outer step of the DiLoCo runs (the demo's and the sweep's command
  // lines choose it per row: SparseLoCo rows take outer SGD by default).
  outer_step outer = outer_step::nesterov;
  float outer_lr = 0.7f;        // outer Nesterov
  float outer_momentum = 0.9f;  // outer Nesterov
  // --outer delayed-nesterov: outer steps per momentum update N (1: Nesterov).
  int outer_period = 2;
  // Outer SGD's lr, no momentum: the SparseLoCo paper's outer step (arXiv
  // 2508.15706, theta <- theta - alpha * mean of the sent updates; its
  // error feedback plays the part of momentum). 1 is plain averaging of
  // what was sent.
  float sgd_outer_lr = 1.0f;
  float feedback_decay = 0.95f;  // sparseloco rows: r <- beta (r + delta - sent), SparseLoCo's 0.95
  // sync::streaming rows (--fragments, --delay, --alpha): P = 4 fragments,
  // each exchange overlapping tau = 2 inner steps, alpha = 0: the merged
  // fragment is theta_global, as torchft's default and the library's (the
  // paper's tau = 1-5 and alpha in {0, 0.5}; 0.5 lost 2 % at M = 8, issue 38).
  int fragments = 4;
  int delay = 2;
  float alpha = 0.0f;
  // sync::eager rows (--eager-fresh-weight): the weight w of each worker's
  // fresh pseudo-gradient in its own step; 0: 1/M, the paper's.
  float eager_fresh_weight = 0.0f;
  shape dims{};            // vocab is filled in from the corpus
  shard_mode shards = shard_mode::iid;  // how the training text is split over the workers (shards.hpp)
  std::uint64_t seed = 1;
  std::size_t corpus_chars = 2304000;  // of the synthetic corpus: one pass at the default steps x batch
  std::string corpus_path;             // a text file to train on; empty: the fortunes (or the synthetic corpus)
  bool synthetic = false;              // the built-in synthetic corpus, on purpose
  std::string fortunes_dir = default_fortunes_dir;
  std::size_t eval_windows = 65536;  // evenly spaced over the held-out text (every 4th character of the fortunes')
  int log_every = 1500;     // 0: quiet
  // The failure demo (train_char_mlp_gloo --crash RANK:STEP): the process
  // started with that rank SIGKILLs itself at that DiLoCo step in its first
  // run (DILOCO_RESTART_COUNT unset or 0). -1: no crash.
  int crash_rank = -1;
  int crash_step = -1;
};

struct result {
  std::string method;
  double held_out_loss = 0.0;
  std::uint64_t bytes_per_worker = 0;  // sent by one worker over the whole run
  std::uint64_t rounds = 0;            // communication rounds
  double seconds = 0.0;
  double encoded_bytes_per_parameter = 0.0;  // DiLoCo with a lossy codec: its encoding's size
  double hidden_fraction = 0.0;  // DiLoCo: share of the exchange time hidden behind inner steps
  // Overlapping schedules: the workers' replicas at the end of training,
  // before finish(): the root mean square of their distances to their mean,
  // over the mean's norm (0 where they are equal; not measured: -1).
  double replica_spread = -1.0;
};

// The text file if one was given, else the synthetic corpus if asked for,
// else the fortunes, falling back to the synthetic corpus (with
// dataset::fallback saying why) where they are missing.
inline dataset load_dataset(const config& c) {
  if (!c.corpus_path.empty()) return file_dataset(c.corpus_path);
  if (c.synthetic) return synthetic_dataset(c.corpus_chars, c.seed);
  auto fortunes = fortunes_dataset(c.fortunes_dir);
  if (fortunes.fallback.empty()) return fortunes;
  auto d = synthetic_dataset(c.corpus_chars, c.seed);
  d.fallback = fortunes.fallback;
  d.source += " (fallback)";
  return d;
}

// Samples [first, first + count) of global step `step`, drawn for worker
// `worker` (its shard under --shards by-file): a pure function of the seed,
// so with iid shards the split over workers does not change the data.
struct batch_buffer {
  std::vector<std::uint8_t> contexts, targets;
  void fill(const dataset& d, const config& c, const shard_plan& plan, int step, int worker, int first, int count) {
    contexts.resize(static_cast<std::size_t>(count) * static_cast<std::size_t>(c.dims.context));
    targets.resize(static_cast<std::size_t>(count));
    write(d, c, plan, step, worker, first, count, 0);
  }

 private:
  void write(const dataset& d, const config& c, const shard_plan& plan, int step, int worker, int first, int count,
             int at) {
    const auto k = static_cast<std::size_t>(c.dims.context);
    for (int j = 0; j < count; ++j) {
      const std::uint64_t id = static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(c.batch) +
                               static_cast<std::uint64_t>(first + j);
      const std::size_t pos = plan.position(worker, id, c.seed);
      const auto slot = static_cast<std::size_t>(at + j);
      std::copy_n(d.train.begin() + static_cast<std::ptrdiff_t>(pos), k,
                  contexts.begin() + static_cast<std::ptrdiff_t>(slot * k));
      targets[slot] = d.train[pos + k];
    }
  }
};

// The split of the training text over c.workers (--shards).
inline shard_plan make_shards(const dataset& d, const config& c) {
  return shard_plan(d, c.shards, c.workers, static_cast<std::size_t>(c.dims.context) + 1);
}

// Mean cross-entropy (nats per character) on evenly spaced held-out windows.
inline double held_out_loss(model& m, const dataset& d, const config& c) {
  const auto k = static_cast<std::size_t>(c.dims.context);
  const std::size_t avail = d.held_out.size() - k;
  const std::size_t n = std::min(c.eval_windows, avail);
  std::vector<std::uint8_t> ctx, tgt;
  double total = 0.0;
  constexpr std::size_t chunk = 256;
  for (std::size_t first = 0; first < n; first += chunk) {
    const std::size_t count = std::min(chunk, n - first);
    ctx.resize(count * k);
    tgt.resize(count);
    for (std::size_t j = 0; j < count; ++j) {
      const std::size_t pos = (first + j) * avail / n;
      std::copy_n(d.held_out.begin() + static_cast<std::ptrdiff_t>(pos), k,
                  ctx.begin() + static_cast<std::ptrdiff_t>(j * k));
      tgt[j] = d.held_out[pos + k];
    }
    total += m.forward(ctx.data(), tgt.data(), static_cast<int>(count), false) * static_cast<double>(count);
  }
  return total / static_cast<double>(n);
}

inline diloco::inner::adamw::options inner_options(const config& c) {
  return {.lr = c.lr, .weight_decay = c.weight_decay};
}

// Linear warmup over `warmup` steps to `peak`, then cosine decay to
// peak * final_fraction at step `steps`.
inline float warmup_cosine_lr(float peak, int warmup, double final_fraction, int steps, int step) {
  if (step < warmup) return peak * static_cast<float>(step + 1) / static_cast<float>(warmup);
  const double t = static_cast<double>(step - warmup) / std::max(1, steps - warmup);
  return static_cast<float>(peak * (final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + std::cos(3.141592653589793 * t))));
}

// The same schedule for every method.
inline float lr_at(const config& c, int step) {
  return warmup_cosine_lr(c.lr, c.warmup_steps, c.final_lr_fraction, c.steps, step);
}

// Progress every log_every steps: mean training loss since the last line.
struct progress {
  const config& c;
  const char* label;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double sum = 0.0;
  int count = 0;
  void add(int step, double loss, bool print) {
    sum += loss;
    ++count;
    if (c.log_every > 0 && print && ((step + 1) % c.log_every == 0 || step + 1 == c.steps)) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("  [%s] step %5d/%d  train loss %.4f  (%.1f s)\n", label, step + 1, c.steps, sum / count, secs);
      std::fflush(stdout);
      sum = 0.0;
      count = 0;
    }
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

inline void check(const config& c) {
  if (c.workers < 1) throw diloco::config_error("demo: --workers must be at least 1");
  if (c.batch % c.workers != 0)
    throw diloco::config_error("demo: --batch (" + std::to_string(c.batch) + ") must be a multiple of --workers (" +
                               std::to_string(c.workers) + ")");
  if (c.steps < 1 || c.inner_steps < 1) throw diloco::config_error("demo: --steps and --inner-steps must be >= 1");
}

// The single-worker row's label: it names the per-step batch.
inline std::string single_worker_label(const config& c) {
  return "single worker (batch " + std::to_string(c.batch / c.workers) + ")";
}

// One worker alone with the same per-worker compute as each data-parallel or
// DiLoCo worker: worker 0's share of every step (batch / M samples, the
// samples worker 0 takes in the other methods) and no communication. This
// is what the extra workers are measured against; the whole batch on one
// worker would be data parallel itself (the same update, bit for bit).
inline result run_single(const config& c, const dataset& d) {
  model m(c.dims, c.seed);
  diloco::optimizer<diloco::inner::adamw> opt(m.parameters(), inner_options(c));
  batch_buffer b;
  const auto plan = make_shards(d, c);
  const int share = c.batch / c.workers;
  progress log{c, "single"};
  for (int step = 0; step < c.steps; ++step) {
    b.fill(d, c, plan, step, 0, 0, share);
    log.add(step, m.forward(b.contexts.data(), b.targets.data(), share, true), true);
    opt.set_lr(lr_at(c, step));
    opt.step(m.gradients());
  }
  return {single_worker_label(c), held_out_loss(m, d, c), 0, 0, log.seconds()};
}

// Synchronous data parallel: each worker's gradient on its share of the
// batch, averaged by an all-reduce every step, then the same AdamW step on
// every replica.
template <class Comm>
result run_data_parallel(const config& c, const dataset& d, Comm& comm) {
  model m(c.dims, c.seed);
  diloco::optimizer<diloco::inner::adamw> opt(m.parameters(), inner_options(c));
  const int share = c.batch / comm.size();
  batch_buffer b;
  const auto plan = make_shards(d, c);
  progress log{c, "data parallel"};
  const auto traffic0 = comm.traffic();
  for (int step = 0; step < c.steps; ++step) {
    b.fill(d, c, plan, step, comm.rank(), comm.rank() * share, share);
    log.add(step, m.forward(b.contexts.data(), b.targets.data(), share, true), comm.rank() == 0);
    comm.all_reduce(m.flat_gradients(), diloco::reduce_op::mean);
    opt.set_lr(lr_at(c, step));
    opt.step(m.gradients());
  }
  const auto sent = comm.traffic().bytes_sent - traffic0.bytes_sent;
  return {"data parallel", held_out_loss(m, d, c), sent, static_cast<std::uint64_t>(c.steps), log.seconds()};
}

// The schedule options of a DiLoCo row from the config.
template <class Sync>
typename Sync::options sync_options(const config& c) {
  if constexpr (std::is_same_v<Sync, diloco::sync::streaming>)
    return {.fragments = static_cast<std::size_t>(c.fragments),
            .delay = static_cast<std::size_t>(c.delay),
            .alpha = c.alpha,
            .assignment = diloco::sync::fragment_assignment::strided};
  else if constexpr (std::is_same_v<Sync, diloco::sync::eager>)
    return {.fresh_weight = c.eager_fresh_weight};
  else
    return {};
}

// The outer optimizer's options from the config: Nesterov's lr and
// momentum, or outer SGD's lr with no momentum.
template <class Outer>
typename Outer::options outer_options(const config& c) {
  if constexpr (std::is_same_v<Outer, diloco::outer::sgd>)
    return {.lr = c.sgd_outer_lr};
  else if constexpr (std::is_same_v<Outer, diloco::outer::delayed_nesterov>)
    return {.lr = c.outer_lr, .momentum = c.outer_momentum, .period = static_cast<std::uint32_t>(c.outer_period)};
  else
    return {.lr = c.outer_lr, .momentum = c.outer_momentum};
}

// How far apart the workers' replicas are (result::replica_spread), with
// two all-reduces over the group: the replicas' mean, then the sum of each
// one's squared distance to it.
template <class Comm>
double replica_spread(std::span<const float> p, Comm& comm) {
  const double M = comm.size();
  std::vector<float> mean(p.begin(), p.end());
  comm.all_reduce(std::span<float>(mean), diloco::reduce_op::mean);
  double far = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double d = static_cast<double>(p[i]) - static_cast<double>(mean[i]);
    far += d * d;
    norm += static_cast<double>(mean[i]) * static_cast<double>(mean[i]);
  }
  std::vector<float> sum{static_cast<float>(far)};
  comm.all_reduce(std::span<float>(sum), diloco::reduce_op::sum);
  return norm > 0.0 ? std::sqrt(static_cast<double>(sum[0]) / M / norm) : 0.0;
}

template <class Outer, class Compressor, class Comm, class Sync>
result run_diloco_with(const config& c, const dataset& d, Comm& comm, const std::string& label,
                       typename Compressor::options compress);

// DiLoCo: each worker's AdamW on its share of the batch, outer steps (c.outer:
// Nesterov or SGD) as the schedule (Sync) places them: every H steps for the
// whole model by default.
template <class Compressor, class Comm, class Sync = diloco::sync::blocking>
result run_diloco(const config& c, const dataset& d, Comm& comm, const std::string& label,
                  typename Compressor::options compress = {}) {
  if (c.outer == outer_step::sgd)
    return run_diloco_with<diloco::outer::sgd, Compressor, Comm, Sync>(c, d, comm, label, compress);
  // Delayed Nesterov on the one-step-delay row only (one more engine per
  // program, not one per compressor); the other rows take Nesterov.
  if constexpr (std::is_same_v<Sync, diloco::sync::one_step_delay>)
    if (c.outer == outer_step::delayed_nesterov)
      return run_diloco_with<diloco::outer::delayed_nesterov, Compressor, Comm, Sync>(c, d, comm, label, compress);
  return run_diloco_with<diloco::outer::nesterov, Compressor, Comm, Sync>(c, d, comm, label, compress);
}

template <class Outer, class Compressor, class Comm, class Sync>
result run_diloco_with(const config& c, const dataset& d, Comm& comm, const std::string& label,
                       typename Compressor::options compress) {
  model m(c.dims, c.seed);
  using trainer = diloco::algorithm<diloco::inner::adamw, Outer, Compressor, Comm, Sync>;
  trainer t(m.parameters(), comm,
            {.inner_steps = static_cast<std::size_t>(c.inner_steps),
             .inner = inner_options(c),
             .outer = outer_options<Outer>(c),
             .compress = compress,
             .sync = sync_options<Sync>(c)});
  batch_buffer b;
  const auto plan = make_shards(d, c);
  progress log{c, label.c_str()};
  // In an elastic group (Gloo with DILOCO_ELASTIC=1) workers may die, leave
  // and join while this runs: each step takes this worker's share of the
  // batch by its rank in the group now, and under the blocking schedule the
  // step number is the group's position (rounds x H + steps into the round),
  // which a worker that joins mid-run receives from a live member.
  const int launch_rank = comm.rank();
  const char* restart = std::getenv("DILOCO_RESTART_COUNT");
  const bool crash_here = launch_rank == c.crash_rank && (restart == nullptr || std::atoi(restart) == 0);
  auto position = [&](int counted) {
    if constexpr (std::is_same_v<Sync, diloco::sync::blocking>)
      return static_cast<int>(t.stats().rounds) * c.inner_steps + static_cast<int>(t.steps_in_round());
    else
      return counted;
  };
  std::uint64_t changes = t.stats().membership_changes;
  for (int step = position(0); step < c.steps; step = position(step + 1)) {
    if (crash_here && step == c.crash_step) {
      std::printf("  [%s] launch rank %d: SIGKILL at step %d (--crash)\n", label.c_str(), launch_rank, step);
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    }
    const int share = c.batch / t.world_size();
    b.fill(d, c, plan, step, t.rank(), t.rank() * share, share);
    log.add(step, m.forward(b.contexts.data(), b.targets.data(), share, true), t.rank() == 0);
    t.set_inner_lr(lr_at(c, step));
    t.step(m.gradients());
    if (t.stats().membership_changes != changes && t.rank() == 0 && c.log_every > 0) {
      std::printf("  [%s] step %d: the group re-formed %llu time(s) (a worker died, left or joined); %d workers now\n",
                  label.c_str(), position(step + 1),
                  static_cast<unsigned long long>(t.stats().membership_changes - changes), t.world_size());
      std::fflush(stdout);
    }
    changes = t.stats().membership_changes;
  }
  std::vector<float> replica;  // an overlapping schedule's replica before finish()
  if constexpr (std::is_same_v<Sync, diloco::sync::blocking>) {
    // Steps beyond the last round would leave the replicas apart: finish
    // with a round so the evaluated model is theta_global.
    if (t.steps_in_round() != 0) t.outer_round();
  } else {
    const auto p = m.flat_parameters();
    replica.assign(p.begin(), p.end());
    // Apply what is in flight, then evaluate theta_global (the replica of an
    // overlapping schedule holds local progress too).
    t.finish();
    const auto g = t.global_parameters();
    auto& params = m.parameters();
    for (std::size_t k = 0; k < params.size(); ++k)
      std::copy_n(g.data() + t.global_offset(k), params[k].size(), params[k].data());
  }
  const auto st = t.stats();  // a copy: replica_spread's all-reduces are not the algorithm's traffic
  // Measured in a group that never changed (an elastic group's communicator
  // may have lost members since).
  const double spread = replica.empty() || st.membership_changes != 0 ? -1.0 : replica_spread(replica, comm);
  const double exchange = st.hidden_seconds + st.blocked_seconds;
  return {label,
          held_out_loss(m, d, c),
          st.bytes_sent,
          st.rounds,
          log.seconds(),
          st.encoded_bytes_per_parameter,
          exchange > 0.0 ? st.hidden_seconds / exchange : 0.0,
          spread};
}

// Runs a per-worker function on an in-process world and returns rank 0's result.
template <class F>
result on_threads(int workers, F&& fn) {
  result out;
  diloco::comm::threads::world world(workers);
  world.run([&](diloco::comm::threads& comm) {
    result r = fn(comm);
    if (comm.rank() == 0) out = r;
  });
  return out;
}

inline void print_table(const std::vector<result>& rows) {
  std::printf("\n%-28s %14s %18s %8s %9s %7s\n", "method", "held-out loss", "bytes per worker", "rounds", "seconds",
              "hidden");
  for (const auto& r : rows) {
    char bytes[32];
    if (r.bytes_per_worker >= 1'000'000)
      std::snprintf(bytes, sizeof bytes, "%.2f MB", static_cast<double>(r.bytes_per_worker) / 1e6);
    else
      std::snprintf(bytes, sizeof bytes, "%.1f kB", static_cast<double>(r.bytes_per_worker) / 1e3);
    char hidden[16] = "-";
    if (r.hidden_fraction > 0.0) std::snprintf(hidden, sizeof hidden, "%.0f%%", 100.0 * r.hidden_fraction);
    std::printf("%-28s %14.4f %18s %8llu %9.1f %7s\n", r.method.c_str(), r.held_out_loss, bytes,
                static_cast<unsigned long long>(r.rounds), r.seconds, hidden);
  }
}

}  // namespace char_mlp
