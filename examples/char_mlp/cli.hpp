// SPDX-License-Identifier: Apache-2.0
#pragma once

// The command line and the closing report shared by the demo's mains (one
// per communicator: threads, MPI, Gloo). Each main parses the same options
// (with CLI11, which rejects malformed and out-of-range values naming the
// option) into a config, runs the methods asked for on its communicator,
// and prints the same table.
//
// The DiLoCo rows of the table are a list of variants (diloco_variant), one
// per value of --compress; run_diloco_variant turns one into a run. A new
// axis (a synchronization scheme, say) is a field of diloco_variant, an
// option below that fills it, a loop in diloco_variants and a branch in
// run_diloco_variant.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "cli_checks.hpp"
#include "compressors.hpp"
#include "experiment.hpp"

namespace char_mlp {

// The values of --methods and of --compress, in table order.
inline const std::vector<std::string> method_names{"single", "ddp", "diloco"};
inline const std::vector<std::string> compressor_names{"none", "bf16", "int8", "int4", "fp8",
                                                       "fp8e5m2", "fp4", "int2", "sparseloco", "adaptive", "topk"};
// The values of --sync: DiLoCo's schedules (diloco::sync::blocking,
// streaming, one_step_delay, eager).
inline const std::vector<std::string> sync_names{"blocking", "streaming", "delay", "eager"};

struct cli {
  config c;
  std::vector<std::string> methods{"single", "ddp", "diloco"};
  std::vector<std::string> compressors{"none", "bf16", "int8", "int4"};  // DiLoCo rows
  std::vector<std::string> syncs{"blocking", "streaming", "delay", "eager"};  // DiLoCo rows
  // --outer: every DiLoCo row's outer step; empty (the default): Nesterov,
  // and outer SGD for the sparseloco rows (outer_for).
  std::string outer;
  bool help = false;  // --help was given: the usage was printed (or not, off rank 0), nothing to run
  bool crash_option = false;  // offer --crash (train_char_mlp_gloo, where a process can die alone)

  bool wants(const std::string& method) const {
    return std::find(methods.begin(), methods.end(), method) != methods.end();
  }
};

// One DiLoCo row of the table.
struct diloco_variant {
  std::string compress = "none";  // one of compressor_names
  std::string sync = "blocking";  // one of sync_names
  outer_step outer = outer_step::nesterov;
};

// The outer step of a row with this compressor (experiment.hpp's outer_for).
inline outer_step outer_for(const cli& opts, const std::string& compress) { return outer_for(opts.outer, compress); }

// The DiLoCo rows asked for, in table order: the blocking schedule with
// every compressor asked for, then each other schedule with fp32
// pseudo-gradients.
inline std::vector<diloco_variant> diloco_variants(const cli& opts) {
  auto chosen = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  std::vector<diloco_variant> out;
  if (chosen(opts.syncs, "blocking"))
    for (const auto& name : compressor_names)
      if (chosen(opts.compressors, name))
        out.push_back({.compress = name, .sync = "blocking", .outer = outer_for(opts, name)});
  for (const auto& sync : sync_names)
    if (sync != "blocking" && chosen(opts.syncs, sync))
      out.push_back({.compress = "none", .sync = sync, .outer = outer_for(opts, "none")});
  return out;
}

// One DiLoCo variant trained on `comm` (this process's worker, or one
// thread of an in-process world).
template <class Comm>
result run_diloco_variant_as(const diloco_variant& v, const config& c, const dataset& data, Comm& comm) {
  namespace cs = compressors;
  namespace sy = diloco::sync;
  if (v.sync == "streaming")
    return run_diloco<cs::none, Comm, sy::streaming>(
        c, data, comm, "diloco streaming P=" + std::to_string(c.fragments) + " tau=" + std::to_string(c.delay));
  if (v.sync == "delay") return run_diloco<cs::none, Comm, sy::one_step_delay>(c, data, comm, "diloco one-step delay");
  if (v.sync == "eager") {
    char w[48] = "";
    if (c.eager_fresh_weight > 0.0f)
      std::snprintf(w, sizeof w, " w=%g", static_cast<double>(c.eager_fresh_weight));
    return run_diloco<cs::none, Comm, sy::eager>(c, data, comm, std::string("diloco eager") + w);
  }
  if (v.sync != "blocking") throw diloco::config_error("demo: unknown schedule '" + v.sync + "'");
  auto run = [&]<class C>(const std::string& label) {
    return run_diloco<C>(c, data, comm, label, cs::compressor_options<C>(c.feedback_decay));
  };
  if (v.compress == "none") return run.template operator()<cs::none>("diloco (H=" + std::to_string(c.inner_steps) + ")");
  if (v.compress == "bf16") return run.template operator()<cs::bf16>("diloco+bf16");
  if (v.compress == "int8") return run.template operator()<cs::int8>("diloco+int8+ef");
  if (v.compress == "int4") return run.template operator()<cs::int4>("diloco+int4+ef");
  if (v.compress == "fp8") return run.template operator()<cs::fp8>("diloco+fp8_e4m3+ef");
  if (v.compress == "fp8e5m2") return run.template operator()<cs::fp8e5m2>("diloco+fp8_e5m2+ef");
  if (v.compress == "fp4") return run.template operator()<cs::fp4>("diloco+fp4_e3m0+ef");
  if (v.compress == "int2") return run.template operator()<cs::int2>("diloco+int2+ef");
  if (v.compress == "sparseloco") return run.template operator()<cs::sparseloco>("diloco+sparseloco 64/4096 int2+ef");
  if (v.compress == "adaptive") return run.template operator()<cs::adaptive>("diloco+adaptive int8/4/2+ef");
  if (v.compress == "topk") return run.template operator()<cs::topk>("diloco+top10%+ef");
  throw diloco::config_error("demo: unknown compressor '" + v.compress + "'");
}

// The row with its outer step (v.outer); a row stepped by outer SGD says so
// in its label.
template <class Comm>
result run_diloco_variant(const diloco_variant& v, const config& row, const dataset& data, Comm& comm) {
  config c = row;
  c.outer = v.outer;
  result r = run_diloco_variant_as(v, c, data, comm);
  if (v.outer == outer_step::sgd) r.method += " (outer sgd)";
  if (v.outer == outer_step::delayed_nesterov && v.sync == "delay")
    r.method += " (delayed nesterov N=" + std::to_string(c.outer_period) + ")";
  return r;
}

// Parses argv on top of `defaults`. Malformed or out-of-range values,
// unknown options and extra arguments throw config_errors that name the
// option. --help prints the usage (when `print_help`; processes that should
// stay quiet pass false) and sets cli::help. `workers_help` describes
// --workers for this main.
inline cli parse_cli(int argc, char** argv, const cli& defaults, const char* workers_help, bool print_help = true) {
  cli out = defaults;
  config& c = out.c;
  CLI::App app{"Trains a character-level MLP three ways on the same data (synchronous data parallel, DiLoCo with "
               "optionally compressed pseudo-gradients, and one worker with the same per-worker compute: batch / "
               "workers samples a step) and prints held-out loss and bytes sent.",
               argc > 0 ? argv[0] : "train_char_mlp"};
  app.get_formatter()->column_width(34);
  // An option given twice takes its last value (lists, --methods and
  // --compress, gather all their values).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  app.add_option("--workers", c.workers, workers_help)->capture_default_str()->check(detail::int_in(1, 1024));
  app.add_option("--steps", c.steps, "global steps; each consumes --batch samples")
      ->capture_default_str()
      ->check(detail::int_in(1));
  app.add_option("--batch", c.batch, "global batch, split evenly over the workers")
      ->capture_default_str()
      ->check(detail::int_in(1, 1 << 20));
  app.add_option("--inner-steps", c.inner_steps, "DiLoCo's H: inner steps per outer round")
      ->capture_default_str()
      ->check(detail::int_in(1));
  app.add_option("--lr", c.lr, "AdamW peak learning rate, every method")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 10.0, true));
  app.add_option("--outer", out.outer,
                 "DiLoCo's outer step, every row: nesterov (--outer-lr, --outer-momentum) or sgd (a plain step "
                 "along the averaged pseudo-gradient, --outer-sgd-lr, no momentum); default: nesterov, and sgd for "
                 "the sparseloco rows (the SparseLoCo paper's: its error feedback plays the part of momentum); "
                 "delayed-nesterov: the one-step-delay row takes the delayed Nesterov step of arXiv 2401.09135 "
                 "(--outer-lr, --outer-momentum, --outer-period), the other rows Nesterov")
      ->check(CLI::IsMember(demo_outer_names));
  app.add_option("--outer-lr", c.outer_lr, "DiLoCo outer Nesterov learning rate")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 10.0, true));
  app.add_option("--outer-momentum", c.outer_momentum, "DiLoCo outer Nesterov momentum")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 0.999));
  app.add_option("--outer-period", c.outer_period,
                 "--outer delayed-nesterov: outer steps N per momentum update (each step applies its mean / N; "
                 "1: Nesterov)")
      ->capture_default_str()
      ->check(detail::int_in(1, 1 << 20));
  app.add_option("--outer-sgd-lr", c.sgd_outer_lr, "DiLoCo outer SGD learning rate (1: plain averaging)")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 10.0, true));
  app.add_option("--hidden", c.dims.hidden, "hidden units")->capture_default_str()->check(detail::int_in(1, 65536));
  app.add_option("--context", c.dims.context, "characters of context")
      ->capture_default_str()
      ->check(detail::int_in(1, 256));
  app.add_option("--seed", c.seed, "data and initialization seed")->capture_default_str();
  if (out.crash_option) {
    app.add_option_function<std::string>(
           "--crash",
           [&c](const std::string& v) {
             int r = -1, s = -1;
             char extra = 0;
             if (std::sscanf(v.c_str(), "%d:%d%c", &r, &s, &extra) != 2 || r < 0 || s < 0)
               throw CLI::ValidationError("--crash", "expected RANK:STEP (two non-negative integers), got '" + v + "'");
             c.crash_rank = r;
             c.crash_step = s;
           },
           "failure demo: the process of this launch rank SIGKILLs itself at this DiLoCo step in its first run; "
           "under scripts/launch_gloo.sh --max-restarts 1 it restarts and rejoins the group")
        ->type_name("RANK:STEP");
  }
  app.add_option("--log-every", c.log_every, "progress line every N steps, 0 = quiet")
      ->capture_default_str()
      ->check(detail::int_in(0));
  app.add_option("--warmup", c.warmup_steps, "linear lr warmup steps")
      ->capture_default_str()
      ->check(detail::int_in(0));
  app.add_option("--final-lr", c.final_lr_fraction, "cosine decay ends at lr * X")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 1.0));
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 1.0));
  app.add_option("--feedback-decay", c.feedback_decay, "sparseloco rows: error-feedback decay beta in (0, 1]")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 1.0, true));
  detail::add_list(app, "--methods", out.methods, "which of single,ddp,diloco to run (comma-separated)",
                   method_names);
  detail::add_list(app, "--compress", out.compressors,
                   "DiLoCo rows, any of none,bf16,int8,int4,fp8,fp8e5m2,fp4,int2,sparseloco,adaptive,topk: bf16 "
                   "cast; int8/int4/fp8 (e4m3)/fp8e5m2/fp4 (e3m0)/int2 block-wise (B=128), SparseLoCo (64 of "
                   "every 4096 as int2, --feedback-decay), adaptive (int8, int4 or int2 per round: the most "
                   "accurate whose link time fits the inner phase) and top-k (10%) with error feedback",
                   compressor_names);
  detail::add_list(app, "--sync", out.syncs,
                   "DiLoCo schedules, any of blocking,streaming,delay,eager: blocking rows use every --compress; "
                   "streaming (--fragments, --delay, --alpha), one-step delay and eager run with fp32",
                   sync_names);
  auto* fragments = app.add_option("--fragments", c.fragments,
                                   "streaming: fragments P (1 <= P <= min(H, tensor count))")
      ->capture_default_str()
      ->check(detail::int_in(1));
  auto* delay = app.add_option("--delay", c.delay,
                               "streaming: inner steps tau each exchange overlaps (tau <= H/P - 1)")
      ->capture_default_str()
      ->check(detail::int_in(0));
  app.add_option("--alpha", c.alpha, "streaming: weight of the local value when a fragment is merged")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 1.0));
  app.add_option("--eager-fresh-weight", c.eager_fresh_weight,
                 "eager: weight w of each worker's fresh pseudo-gradient in its own step (0: 1/M, the paper's)")
      ->capture_default_str()
      ->check(detail::finite_in(0.0, 1.0));
  app.add_option_function<std::string>(
         "--shards", [&c](const std::string& v) { c.shards = parse_shard_mode(v); },
         "how the training text is split over the workers: iid (each samples all of it) or by-file (each its own "
         "topic files of the fortunes, balanced by size; other corpora: contiguous chunks)")
      ->check(CLI::IsMember(shard_mode_names))
      ->default_str("iid");
  auto* synthetic = app.add_flag("--synthetic", c.synthetic,
                                 "train on the built-in synthetic corpus instead of the fortunes");
  app.add_option("--fortunes-dir", c.fortunes_dir,
                 "where Debian's fortunes package keeps its topic files; without them the demo falls back to "
                 "the synthetic corpus and says so")
      ->capture_default_str()
      ->excludes(synthetic);
  // Checked after parsing, so that in `--typo value` the unknown option is
  // what the message names, not its value taken for the corpus.
  app.add_option("corpus", c.corpus_path, "train on this text file (the last 10% held out) instead of the fortunes")
      ->type_name("FILE")
      ->excludes(synthetic);
  app.footer(
      "Default corpus: the fortune cookies of Debian's `fortunes` package, the last 10% of every topic file held "
      "out.");

  if (parse_or_help(app, argc, argv, "demo: ", print_help)) {
    out.help = true;
    return out;
  }
  if (out.methods.empty()) throw diloco::config_error("demo: --methods names no method");
  // The streaming defaults (P = 4, tau = 2) shrink to fit a small H; values
  // given on the command line are the user's and are checked as given.
  if (fragments->count() == 0) c.fragments = std::min(c.fragments, c.inner_steps);
  if (delay->count() == 0) c.delay = std::min(c.delay, std::max(0, c.inner_steps / c.fragments - 1));
  if (!c.corpus_path.empty() && !std::filesystem::is_regular_file(c.corpus_path))
    throw diloco::config_error("demo: corpus: no such file: " + c.corpus_path);
  return out;
}

inline void print_header(const config& c, const dataset& data, const char* workers_note) {
  if (!data.fallback.empty())
    std::printf("NOTE: using the built-in synthetic corpus as a fallback: %s.\n"
                "      Install it (scripts/install-deps.sh), pass a text file, or choose --synthetic.\n",
                data.fallback.c_str());
  std::printf("corpus: %s\n        %zu training and %zu held-out characters, vocabulary %d\n", data.source.c_str(),
              data.train.size(), data.held_out.size(), data.vocab());
  const double samples = static_cast<double>(c.steps) * static_cast<double>(c.batch);
  std::printf("model: %zu parameters; %d steps x %d samples (%.2f passes over the training text); %d workers%s; "
              "DiLoCo H = %d (%d rounds)\n",
              model(c.dims, c.seed).parameter_count(), c.steps, c.batch,
              samples / static_cast<double>(data.train.size()), c.workers, workers_note, c.inner_steps,
              (c.steps + c.inner_steps - 1) / c.inner_steps);
  std::fputs(shard_plan(data, c.shards, c.workers, static_cast<std::size_t>(c.dims.context) + 1).describe().c_str(),
             stdout);
  std::printf("\n");
}

// Which outer step the DiLoCo rows take, and with which settings: one line
// under the header (when DiLoCo runs).
inline void print_outer_steps(const cli& opts) {
  if (!opts.wants("diloco")) return;
  const config& c = opts.c;
  auto describe = [&](outer_step o) {
    char text[96];
    if (o == outer_step::sgd)
      std::snprintf(text, sizeof text, "sgd (lr %g, no momentum)", static_cast<double>(c.sgd_outer_lr));
    else
      std::snprintf(text, sizeof text, "nesterov (lr %g, momentum %g)", static_cast<double>(c.outer_lr),
                    static_cast<double>(c.outer_momentum));
    return std::string(text);
  };
  bool sparse_sgd = false;
  for (const auto& v : diloco_variants(opts))
    if (v.compress == "sparseloco" && v.outer == outer_step::sgd && opts.outer.empty()) sparse_sgd = true;
  if (opts.outer == "delayed-nesterov")
    std::printf("outer step: %s; the one-step-delay row: delayed nesterov (lr %g, momentum %g, period %d) "
                "(--outer delayed-nesterov)\n",
                describe(outer_step::nesterov).c_str(), static_cast<double>(c.outer_lr),
                static_cast<double>(c.outer_momentum), c.outer_period);
  else if (!opts.outer.empty())
    std::printf("outer step: %s, every DiLoCo row (--outer %s)\n",
                describe(outer_for(opts, "none")).c_str(), opts.outer.c_str());
  else if (sparse_sgd)
    std::printf("outer step: %s; sparseloco rows: %s, as in the SparseLoCo paper (its error feedback is the "
                "momentum)\n",
                describe(outer_step::nesterov).c_str(), describe(outer_step::sgd).c_str());
  else
    std::printf("outer step: %s\n", describe(outer_step::nesterov).c_str());
}

// The DiLoCo rows asked for, each run through `on`, which runs a per-worker
// function on the demo's communicator and returns the result to report
// (threads: one world per row; MPI or Gloo: this process's rank). Returns
// the uncompressed blocking row, if it ran. `rows` must have room reserved
// (pointers into it are kept).
template <class On>
const result* run_diloco_rows(const config& c, const dataset& data, const cli& opts, std::vector<result>& rows,
                              On&& on) {
  const result* plain = nullptr;
  for (const auto& v : diloco_variants(opts)) {
    rows.push_back(on([&](auto& comm) { return run_diloco_variant(v, c, data, comm); }));
    if (v.compress == "none" && v.sync == "blocking") plain = &rows.back();
  }
  return plain;
}

// The table, then DiLoCo against data parallel when both ran.
inline void print_report(const std::vector<result>& rows, const result* ddp, const result* dl);

// The experiment with one worker per process (MPI ranks, Gloo processes):
// every process runs every method asked for on its rank; rank 0 prints.
// The one-worker baseline runs on every rank too (the same model, quietly
// off rank 0), so none waits at the next collective, which could exceed a
// communicator's timeout.
template <class Comm>
void run_one_worker_per_process(Comm& comm, const cli& opts, const char* workers_note) {
  auto c = opts.c;
  if (c.workers != comm.size())
    throw diloco::config_error("demo: --workers " + std::to_string(c.workers) + " but " + std::to_string(comm.size()) +
                               " processes: each process is one worker");
  check(c);
  const auto data = load_dataset(c);  // every process builds the same data from the seed
  c.dims.vocab = data.vocab();
  const bool lead = comm.rank() == 0;
  if (lead) {
    print_header(c, data, workers_note);
    print_outer_steps(opts);
  }
  if (!lead) c.log_every = 0;
  std::vector<result> rows;
  rows.reserve(2 + diloco_variants(opts).size());  // pointers into it are kept
  const result* ddp = nullptr;
  const result* dl = nullptr;
  if (opts.wants("single")) rows.push_back(run_single(c, data));
  if (opts.wants("ddp")) {
    rows.push_back(run_data_parallel(c, data, comm));
    ddp = &rows.back();
  }
  if (opts.wants("diloco")) dl = run_diloco_rows(c, data, opts, rows, [&](auto run) { return run(comm); });
  if (lead) print_report(rows, ddp, dl);
  comm.barrier();  // nobody leaves while another still needs it
}

// The table, then DiLoCo against data parallel when both ran.
inline void print_report(const std::vector<result>& rows, const result* ddp, const result* dl) {
  print_table(rows);
  // The overlapping rows' replicas before finish() (result::replica_spread).
  for (const auto& r : rows)
    if (r.replica_spread >= 0.0)
      std::printf("replica spread at the end (rms distance to their mean / its norm): %s %.3g\n", r.method.c_str(),
                  r.replica_spread);
  if (ddp && dl)
    std::printf("\ndiloco / data parallel: held-out loss x%.3f, bytes %.1fx fewer\n",
                dl->held_out_loss / ddp->held_out_loss,
                dl->bytes_per_worker
                    ? static_cast<double>(ddp->bytes_per_worker) / static_cast<double>(dl->bytes_per_worker)
                    : 0.0);
}

}  // namespace char_mlp
