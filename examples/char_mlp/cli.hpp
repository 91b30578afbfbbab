#pragma once

// The command line and the closing report shared by the demo's mains (one
// per communicator: threads, MPI, ...). Each main parses the same options
// into a config, runs the methods asked for on its communicator, and prints
// the same table.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "experiment.hpp"

namespace char_mlp {

struct cli {
  config c;
  std::string methods = "single,ddp,diloco";
  std::string compressors = "none,bf16,int8,int4";  // DiLoCo rows (threads demo)
  bool help = false;  // --help was given: the usage was printed, nothing to run

  bool wants(const char* method) const { return methods.find(method) != std::string::npos; }
};

// `workers_help` describes --workers for this main (simulated workers, or
// how the process count decides it).
inline void print_usage(const char* program, const char* workers_help) {
  std::printf(
      "usage: %s [options] [corpus.txt]\n"
      "  --workers M         %s\n"
      "  --steps N           global steps; each consumes --batch samples (default 2000)\n"
      "  --batch B           global batch, split over the workers (default 256)\n"
      "  --inner-steps H     DiLoCo inner steps per round (default 50)\n"
      "  --lr X              AdamW learning rate, all methods (default 3e-3)\n"
      "  --outer-lr X        DiLoCo outer Nesterov lr (default 0.7)\n"
      "  --outer-momentum X  DiLoCo outer momentum (default 0.9)\n"
      "  --hidden N          hidden units (default 96)\n"
      "  --context N         characters of context (default 8)\n"
      "  --seed N            data and initialization seed (default 1)\n"
      "  --log-every N       progress line every N steps, 0 = quiet (default 500)\n"
      "  --warmup N          linear lr warmup steps (default 100)\n"
      "  --final-lr X        cosine decay ends at lr * X (default 0.1)\n"
      "  --weight-decay X    AdamW weight decay (default 0)\n"
      "  --methods LIST      which of single,ddp,diloco to run (default all)\n"
      "  --compress LIST     DiLoCo rows, any of none,bf16,int8,int4,topk (default none,bf16,int8,int4):\n"
      "                      bf16 cast; int8/int4 block-wise (B=128) and top-k (10%%) with error feedback\n"
      "  corpus.txt          train on this text file instead of the built-in corpus\n",
      program, workers_help);
}

// Parses argv on top of `defaults`. Unknown options and missing values are
// config_errors. With `print_help` false, --help only sets cli::help (for
// processes that should stay quiet).
inline cli parse_cli(int argc, char** argv, const cli& defaults, const char* workers_help, bool print_help = true) {
  cli out = defaults;
  config& c = out.c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw diloco::config_error("demo: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--workers") c.workers = std::atoi(value());
    else if (a == "--steps") c.steps = std::atoi(value());
    else if (a == "--batch") c.batch = std::atoi(value());
    else if (a == "--inner-steps") c.inner_steps = std::atoi(value());
    else if (a == "--lr") c.lr = std::strtof(value(), nullptr);
    else if (a == "--outer-lr") c.outer_lr = std::strtof(value(), nullptr);
    else if (a == "--outer-momentum") c.outer_momentum = std::strtof(value(), nullptr);
    else if (a == "--hidden") c.dims.hidden = std::atoi(value());
    else if (a == "--context") c.dims.context = std::atoi(value());
    else if (a == "--seed") c.seed = std::strtoull(value(), nullptr, 10);
    else if (a == "--log-every") c.log_every = std::atoi(value());
    else if (a == "--warmup") c.warmup_steps = std::atoi(value());
    else if (a == "--final-lr") c.final_lr_fraction = std::strtof(value(), nullptr);
    else if (a == "--weight-decay") c.weight_decay = std::strtof(value(), nullptr);
    else if (a == "--methods") out.methods = value();
    else if (a == "--compress") out.compressors = value();
    else if (a == "-h" || a == "--help") {
      if (print_help) print_usage(argv[0], workers_help);
      out.help = true;
      return out;
    } else if (!a.empty() && a[0] == '-') throw diloco::config_error("demo: unknown option " + a);
    else c.corpus_path = a;
  }
  return out;
}

inline void print_header(const config& c, const dataset& data, const char* workers_note) {
  std::printf("corpus: %s, %zu training characters, vocabulary %d\n",
              c.corpus_path.empty() ? "built-in synthetic" : c.corpus_path.c_str(), data.train.size(), data.vocab());
  std::printf("model: %zu parameters; %d steps x %d samples; %d workers%s; DiLoCo H = %d\n\n",
              model(c.dims, c.seed).parameter_count(), c.steps, c.batch, c.workers, workers_note, c.inner_steps);
}

// The DiLoCo rows named in `compressors` (none, bf16, int8, int4, topk),
// each run through `on`, which runs a per-worker function on the demo's
// communicator and returns the result to report (threads: one world per
// row; MPI or Gloo: this process's rank). Returns the uncompressed row, if
// it ran. `rows` must have room reserved (pointers into it are kept).
template <class On>
const result* run_diloco_rows(const config& c, const dataset& data, const std::string& compressors,
                              std::vector<result>& rows, On&& on) {
  namespace cp = diloco::compress;
  const result* plain = nullptr;
  auto row = [&](const char* name, auto run) {
    if (compressors.find(name) == std::string::npos) return;
    rows.push_back(on(run));
    if (std::string(name) == "none") plain = &rows.back();
  };
  const std::string h = "(H=" + std::to_string(c.inner_steps) + ")";
  row("none", [&](auto& comm) { return run_diloco<cp::none>(c, data, comm, "diloco " + h); });
  row("bf16", [&](auto& comm) { return run_diloco<cp::cast<diloco::bf16>>(c, data, comm, "diloco+bf16"); });
  row("int8", [&](auto& comm) {
    return run_diloco<cp::error_feedback<cp::blockwise<diloco::int8>>>(c, data, comm, "diloco+int8+ef");
  });
  row("int4", [&](auto& comm) {
    return run_diloco<cp::error_feedback<cp::blockwise<diloco::int4>>>(c, data, comm, "diloco+int4+ef");
  });
  row("topk", [&](auto& comm) {
    return run_diloco<cp::error_feedback<cp::topk<>>>(c, data, comm, "diloco+top10%+ef", {.fraction = 0.1f});
  });
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
  if (lead) print_header(c, data, workers_note);
  if (!lead) c.log_every = 0;
  std::vector<result> rows;
  rows.reserve(8);
  const result* ddp = nullptr;
  const result* dl = nullptr;
  if (opts.wants("single")) rows.push_back(run_single(c, data));
  if (opts.wants("ddp")) {
    rows.push_back(run_data_parallel(c, data, comm));
    ddp = &rows.back();
  }
  if (opts.wants("diloco")) dl = run_diloco_rows(c, data, opts.compressors, rows, [&](auto run) { return run(comm); });
  if (lead) print_report(rows, ddp, dl);
  comm.barrier();  // nobody leaves while another still needs it
}

// The table, then DiLoCo against data parallel when both ran.
inline void print_report(const std::vector<result>& rows, const result* ddp, const result* dl) {
  print_table(rows);
  if (ddp && dl)
    std::printf("\ndiloco / data parallel: held-out loss x%.3f, bytes %.1fx fewer\n",
                dl->held_out_loss / ddp->held_out_loss,
                dl->bytes_per_worker
                    ? static_cast<double>(ddp->bytes_per_worker) / static_cast<double>(dl->bytes_per_worker)
                    : 0.0);
}

}  // namespace char_mlp
