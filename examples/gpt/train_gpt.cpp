// SPDX-License-Identifier: Apache-2.0
// A small character-level GPT (examples/gpt/model.hpp, libtorch) trained on
// Debian's fortunes by synchronous data parallel, by one worker with the
// same per-worker compute, and by DiLoCo variants: the same data and seeds
// for each, through diloco::experiment; prints progress, a table and the
// comparisons, and writes CSV and JSON with --out.
//
// The inner optimizer (--inner): by default torch::optim::AdamW, the
// example's own, with the warmup-cosine lr set on it each step and
// clip_grad_norm_ (--max-grad-norm), wrapped by diloco through
// inner::external (gpt/external.hpp); `adamw` is the library's fused
// inner::adamw (the same update: the two agree to 1e-4 relative, test
// demo_gpt_inner_paths_agree); `muon` is inner::muon (Muon for matrices at
// --muon-lr, AdamW at --lr for the rest). A list runs each in turn.
//
//   train_gpt [--workers 8] [--inner-steps 50] [--shards iid|by-file] ...   (threads)
//   mpirun -np 8 train_gpt --comm mpi ...                                    (MPI ranks)
//   scripts/launch_gloo.sh 8 -- train_gpt --comm gloo ...                    (Gloo processes)
//   train_gpt --workers 8 --group-size 2 ...      (DiLoCo over 4 groups of 2 ranks: gpt/external.hpp)
//
// The budget: about --passes passes over the training text in windows of
// --context characters, --batch windows a step; where that gives fewer
// than --min-rounds rounds of H steps, the steps grow to min-rounds x H and
// the batch shrinks to keep the pass (a multiple of the workers; at least
// one window per worker, so very large H runs more than one pass).

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <diloco/diloco.hpp>
#include <diloco/experiment.hpp>
#include <diloco/tensor/torch.hpp>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#if defined(DILOCO_GPT_WITH_MPI)
#include <mpi.h>

#include <diloco/comm/mesh_mpi.hpp>
#include <diloco/comm/mpi.hpp>
#endif
#if defined(DILOCO_GPT_WITH_GLOO)
#include <diloco/comm/gloo.hpp>
#include <diloco/comm/mesh_gloo.hpp>
#endif

#include "char_mlp/cli_checks.hpp"
#include "char_mlp/compressors.hpp"
#include "char_mlp/corpus.hpp"
#include "char_mlp/experiment.hpp"
#include "char_mlp/shards.hpp"
#include "gpt/external.hpp"
#include "gpt/model.hpp"
#include "gpt/problem.hpp"

namespace {

namespace dx = diloco::experiment;
namespace cs = char_mlp::compressors;
namespace sy = diloco::sync;
using adamw = diloco::inner::adamw;
using muon = diloco::inner::muon;
using external = diloco::inner::external;
using nesterov = diloco::outer::nesterov;

// The variants, at compile time, for each inner optimizer; --methods picks
// among them by label.
template <class I>
using all_variants =
    dx::variants<dx::data_parallel<I>, dx::single_worker<I>, dx::named<"diloco", dx::variant<I, nesterov>>,
                 dx::named<"diloco+int4+ef", dx::variant<I, nesterov, cs::int4>>,
                 dx::named<"diloco+bf16", dx::variant<I, nesterov, cs::bf16>>,
                 dx::named<"diloco streaming", dx::variant<I, nesterov, cs::none, sy::streaming>>,
                 dx::named<"diloco one-step delay", dx::variant<I, nesterov, cs::none, sy::one_step_delay>>,
                 dx::named<"diloco eager", dx::variant<I, nesterov, cs::none, sy::eager>>>;
// --methods names them by these short names, in this order.
const std::vector<std::string> method_names{"ddp", "single", "diloco", "int4", "bf16", "streaming", "delay", "eager"};
static_assert(all_variants<adamw>::size == 8, "one short name in method_names per variant");
// --inner: torch::optim::AdamW wrapped by inner::external, the library's
// fused AdamW, Muon.
const std::vector<std::string> inner_names{"adamw-external", "adamw", "muon"};

struct options {
  gpt::config g;
  std::string comm = "threads";
  int workers = 8;
  int group_size = 1;  // ranks per DiLoCo worker (diloco::replicated); 1: flat DiLoCo
  int inner_steps = 50;
  double passes = 1.0;
  int min_rounds = 40;
  int steps = 0;  // 0: from the budget
  std::vector<std::string> inner{"adamw-external"};
  float lr = 2e-3f;
  float muon_lr = 0.02f;
  int warmup = 100;
  double final_lr_fraction = 0.1;
  float weight_decay = 0.0f;
  float max_grad_norm = 0.0f;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  int fragments = 4, delay = 2;
  float alpha = 0.0f;  // torchft's and the library's default; 0.5 lost 7 % here (issue 38)
  float eager_fresh_weight = 0.0f;  // eager: the fresh pseudo-gradient's weight; 0: 1/M, the paper's
  int curve_points = 10;
  char_mlp::shard_mode shards = char_mlp::shard_mode::iid;
  std::vector<std::string> methods{"ddp", "single", "diloco", "int4", "streaming"};
  std::uint64_t seed = 1;
  std::string out;
  std::string fortunes_dir = char_mlp::default_fortunes_dir;
  std::string corpus_path;
  bool synthetic = false;
  bool quiet = false;
  bool help = false;
};

void parse(int argc, char** argv, options& o, bool print_help) {
  namespace cd = char_mlp::detail;
  CLI::App app{"Trains a small character-level GPT (libtorch) by data parallel, one worker and DiLoCo variants on "
               "the same data, and prints held-out loss and bytes sent.",
               "train_gpt"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--comm", o.comm, "threads (workers in this process), mpi (under mpirun) or gloo (under "
                                   "scripts/launch_gloo.sh)")
      ->capture_default_str()
      ->check(CLI::IsMember({"threads", "mpi", "gloo"}));
  app.add_option("--workers", o.workers, "workers (threads); with mpi/gloo the processes")
      ->capture_default_str()
      ->check(cd::int_in(1, 256));
  app.add_option("--group-size", o.group_size,
                 "ranks per DiLoCo worker: the workers form workers/G groups that average their gradients inside "
                 "the group every step, with DiLoCo's state sharded over the group (diloco::replicated; --inner "
                 "adamw-external; not streaming)")
      ->capture_default_str()
      ->check(cd::int_in(1, 256));
  app.add_option("--inner-steps", o.inner_steps, "DiLoCo's H")->capture_default_str()->check(cd::int_in(1));
  app.add_option("--batch", o.g.batch, "windows per global step (when the rounds allow)")
      ->capture_default_str()
      ->check(cd::int_in(1, 1 << 16));
  app.add_option("--passes", o.passes, "passes over the training text")
      ->capture_default_str()
      ->check(cd::finite_in(0.0, 100.0, true));
  app.add_option("--min-rounds", o.min_rounds, "at least this many outer rounds")
      ->capture_default_str()
      ->check(cd::int_in(1));
  app.add_option("--steps", o.steps, "global steps (overrides the budget; the batch is kept)")
      ->capture_default_str()
      ->check(cd::int_in(0));
  app.add_option("--context", o.g.dims.context, "characters of context (T)")
      ->capture_default_str()
      ->check(cd::int_in(2, 4096));
  app.add_option("--width", o.g.dims.width, "model width (d)")->capture_default_str()->check(cd::int_in(4, 4096));
  app.add_option("--layers", o.g.dims.layers, "transformer blocks")->capture_default_str()->check(cd::int_in(1, 64));
  app.add_option("--heads", o.g.dims.heads, "attention heads (divide the width)")
      ->capture_default_str()
      ->check(cd::int_in(1, 64));
  cd::add_list(app, "--inner", o.inner,
               "inner optimizer(s), each run in turn: adamw-external (torch::optim::AdamW, the example's own, wrapped "
               "by inner::external), adamw (the library's fused inner::adamw), muon (inner::muon)",
               inner_names);
  app.add_option("--lr", o.lr, "AdamW peak lr, every method (with --inner muon: the non-matrix tensors')")
      ->capture_default_str()
      ->check(cd::finite_in(0, 10, true));
  app.add_option("--muon-lr", o.muon_lr, "--inner muon: the matrices' peak lr (same schedule)")
      ->capture_default_str()
      ->check(cd::finite_in(0, 10, true));
  app.add_option("--warmup", o.warmup, "linear lr warmup steps")->capture_default_str()->check(cd::int_in(0));
  app.add_option("--final-lr", o.final_lr_fraction, "cosine decay ends at lr * X")
      ->capture_default_str()
      ->check(cd::finite_in(0, 1));
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->capture_default_str()
      ->check(cd::finite_in(0, 1));
  app.add_option("--max-grad-norm", o.max_grad_norm,
                 "AdamW's global-norm gradient clipping (every method; data parallel clips the averaged gradient); "
                 "0: none")
      ->capture_default_str()
      ->check(cd::finite_in(0, 1000));
  app.add_option("--outer-lr", o.outer_lr, "DiLoCo outer Nesterov lr")
      ->capture_default_str()
      ->check(cd::finite_in(0, 10, true));
  app.add_option("--outer-momentum", o.outer_momentum, "DiLoCo outer Nesterov momentum")
      ->capture_default_str()
      ->check(cd::finite_in(0, 0.999));
  app.add_option("--fragments", o.fragments, "streaming: fragments P")->capture_default_str()->check(cd::int_in(1));
  app.add_option("--delay", o.delay, "streaming: overlapped steps tau")->capture_default_str()->check(cd::int_in(0));
  app.add_option("--alpha", o.alpha, "streaming: weight of the local value at the merge")
      ->capture_default_str()
      ->check(cd::finite_in(0, 1));
  app.add_option("--eager-fresh-weight", o.eager_fresh_weight,
                 "eager: weight w of each worker's fresh pseudo-gradient in its own step (0: 1/M, the paper's)")
      ->capture_default_str()
      ->check(cd::finite_in(0, 1));
  app.add_option_function<std::string>(
         "--shards", [&o](const std::string& v) { o.shards = char_mlp::parse_shard_mode(v); },
         "iid (every worker samples all the text) or by-file (each its own topic files)")
      ->check(CLI::IsMember(char_mlp::shard_mode_names))
      ->default_str("iid");
  cd::add_list(app, "--methods", o.methods, "which of ddp,single,diloco,int4,bf16,streaming,delay,eager to run",
               method_names);
  app.add_option("--curve-points", o.curve_points, "held-out evaluations per run")
      ->capture_default_str()
      ->check(cd::int_in(1, 10000));
  app.add_option("--eval-windows", o.g.eval_windows, "held-out windows per evaluation")
      ->capture_default_str()
      ->check(cd::int_in(1));
  app.add_option("--threads-per-worker", o.g.threads_per_worker, "libtorch threads in each worker")
      ->capture_default_str()
      ->check(cd::int_in(1, 256));
  app.add_option("--seed", o.seed, "data and initialization seed")->capture_default_str();
  app.add_option("--out", o.out, "directory for gpt.csv, gpt_curves.csv and gpt.json (rank 0)");
  auto* synthetic = app.add_flag("--synthetic", o.synthetic, "the built-in synthetic corpus instead of the fortunes");
  app.add_option("--fortunes-dir", o.fortunes_dir, "Debian fortunes' directory")->capture_default_str()->excludes(synthetic);
  app.add_option("corpus", o.corpus_path, "a text file instead of the fortunes (last 10% held out)")
      ->type_name("FILE")
      ->excludes(synthetic);
  app.add_flag("--quiet", o.quiet, "no progress lines");
  o.help = char_mlp::parse_or_help(app, argc, argv, "train_gpt: ", print_help);
  if (o.group_size > 1 && o.comm == "threads" && o.workers % o.group_size != 0)
    throw diloco::config_error("train_gpt: --workers (" + std::to_string(o.workers) +
                               ") must be a multiple of --group-size (" + std::to_string(o.group_size) + ")");
  if (o.group_size > 1)
    for (const auto& inner : o.inner)
      if (inner != "adamw-external")
        throw diloco::config_error("train_gpt: --group-size " + std::to_string(o.group_size) + " needs --inner "
                                   "adamw-external (the group's ranks take the torch step on the full replica), got '" +
                                   inner + "'");
  if (o.g.dims.width % o.g.dims.heads != 0)
    throw diloco::config_error("train_gpt: --width (" + std::to_string(o.g.dims.width) +
                               ") must be a multiple of --heads (" + std::to_string(o.g.dims.heads) + ")");
}

struct plan {
  int steps = 0, batch = 0;
  double passes = 0.0;
};

plan budget(const options& o, std::size_t train_chars, int workers) {
  const double chars = o.passes * static_cast<double>(train_chars);
  const double per_window = o.g.dims.context;
  plan p;
  p.batch = o.g.batch;
  if (o.steps > 0) {
    p.steps = o.steps;
  } else {
    p.steps = std::max({1, static_cast<int>(std::lround(chars / (per_window * p.batch))), o.min_rounds * o.inner_steps});
    p.batch = std::max(workers, static_cast<int>(std::lround(chars / per_window / p.steps / workers)) * workers);
  }
  if (p.batch % workers != 0)
    throw diloco::config_error("train_gpt: --batch (" + std::to_string(p.batch) + ") must be a multiple of the " +
                               std::to_string(workers) + " workers");
  p.passes = static_cast<double>(p.steps) * p.batch * per_window / static_cast<double>(train_chars);
  return p;
}

// Runs the variants --methods names, in the list's order, with inner optimizer I.
template <class I, class Launch>
std::vector<dx::row> run_inner(const options& o, const gpt::problem& problem, Launch& launch, const dx::settings& s) {
  auto configure = [&o, h = o.inner_steps](auto& opts, std::string_view) {
    using inner_options = std::remove_cvref_t<decltype(opts.inner)>;
    if constexpr (std::is_same_v<inner_options, adamw::options>) {
      opts.inner = {.lr = o.lr, .weight_decay = o.weight_decay, .max_grad_norm = o.max_grad_norm};
    } else if constexpr (std::is_same_v<inner_options, muon::options>) {
      // The non-matrix tensors' AdamW as --inner adamw's (lr --lr, betas
      // (0.9, 0.95), eps 1e-8), its lr following the matrices' schedule.
      opts.inner = {.lr = o.muon_lr,
                    .weight_decay = o.weight_decay,
                    .adamw_lr_scale = o.lr / o.muon_lr,
                    .beta1 = 0.9f,
                    .beta2 = 0.95f,
                    .eps = 1e-8f,
                    .adamw_weight_decay = o.weight_decay,
                    .max_grad_norm = o.max_grad_norm};
    }  // inner::external: no options (the model's torch optimizer has them)
    using O = std::remove_cvref_t<decltype(opts)>;
    if constexpr (!std::is_void_v<dx::sync_of_t<O>>) {
      opts.outer = {.lr = o.outer_lr, .momentum = o.outer_momentum};
      if constexpr (std::is_same_v<dx::sync_of_t<O>, sy::streaming>) {
        // P and tau shrink to fit a small H unless that is impossible.
        const int fragments = std::min(o.fragments, h);
        opts.sync = {.fragments = static_cast<std::size_t>(fragments),
                     .delay = static_cast<std::size_t>(std::min(o.delay, std::max(0, h / fragments - 1))),
                     .alpha = o.alpha,
                     .assignment = sy::fragment_assignment::strided};
      }
      if constexpr (std::is_same_v<dx::sync_of_t<O>, sy::eager>) opts.sync = {.fresh_weight = o.eager_fresh_weight};
    }
  };
  std::vector<dx::row> rows;
  std::size_t index = 0;
  [&]<class... V>(dx::variants<V...>*) {
    auto one = [&]<class Variant>() {
      const std::string& method = method_names[index++];
      if (std::find(o.methods.begin(), o.methods.end(), method) == o.methods.end()) return;
      if constexpr (std::is_same_v<I, external>) {
        for (auto& r : gpt::run_external<dx::variants<Variant>>(problem, launch, s, configure, o.group_size))
          rows.push_back(std::move(r));
      } else {
        for (auto& r : dx::run<dx::variants<Variant>>(problem, launch, s, configure)) rows.push_back(std::move(r));
      }
    };
    (one.template operator()<V>(), ...);
  }(static_cast<all_variants<I>*>(nullptr));
  return rows;
}

// Runs the variants --methods names for each inner optimizer --inner names.
template <class Launch>
std::vector<dx::row> run_methods(const options& o, const char_mlp::dataset& data, Launch& launch, bool lead) {
  const int workers = launch.size();
  const plan p = budget(o, data.train.size(), workers);
  gpt::config g = o.g;
  g.batch = p.batch;
  const char_mlp::shard_plan shards(data, o.shards, workers, static_cast<std::size_t>(g.dims.context) + 1);
  if (lead) {
    gpt::transformer probe(g.dims, o.seed);
    diloco::torch_parameters params(probe);
    std::printf("model: %zu parameters (d=%d, %d layers, %d heads, context %d); %d steps x %d windows of %d "
                "(%.2f passes); %d workers (%s); DiLoCo H = %d (%d rounds)\n",
                params.elements(), g.dims.width, g.dims.layers, g.dims.heads, g.dims.context, p.steps, p.batch,
                g.dims.context, p.passes, workers, o.comm.c_str(), o.inner_steps,
                (p.steps + o.inner_steps - 1) / o.inner_steps);
    if (o.group_size > 1)
      std::printf("DiLoCo rows: %d groups of %d ranks (gradients averaged inside each group every step; "
                  "theta_global and the outer state sharded over the group)\n",
                  workers / o.group_size, o.group_size);
    std::fputs(shards.describe().c_str(), stdout);
    std::printf("\n");
    std::fflush(stdout);
  }
  const int steps = p.steps;
  auto schedule = [&o, steps](float peak) {
    return [&o, steps, peak](std::uint64_t step) {
      return char_mlp::warmup_cosine_lr(peak, o.warmup, o.final_lr_fraction, steps, static_cast<int>(step));
    };
  };
  // The torch optimizer of --inner adamw-external: the same schedule,
  // weight decay and clipping as the library's inner::adamw gets.
  g.adamw = {.lr = schedule(o.lr), .weight_decay = o.weight_decay, .max_grad_norm = o.max_grad_norm};
  dx::settings s{.steps = static_cast<std::uint64_t>(steps),
                 .inner_steps = static_cast<std::size_t>(o.inner_steps),
                 .eval_every = static_cast<std::uint64_t>(std::max(1, steps / o.curve_points)),
                 .seed = o.seed,
                 .lr = {},
                 .log = (lead && !o.quiet) ? stdout : nullptr,
                 .tags = {{"shards", char_mlp::name_of(o.shards)},
                          {"batch", std::to_string(p.batch)},
                          {"context", std::to_string(g.dims.context)},
                          {"width", std::to_string(g.dims.width)},
                          {"comm", o.comm}}};
  const gpt::problem problem{&data, &g, &shards};
  std::vector<dx::row> rows;
  for (const auto& inner : o.inner) {
    if (lead)
      std::printf("inner optimizer: %s\n",
                  inner == "adamw-external" ? "torch::optim::AdamW (the example's own; diloco wraps it: inner::external)"
                  : inner == "adamw"        ? "inner::adamw (the library's fused AdamW)"
                                            : "inner::muon (Muon for matrices at --muon-lr, AdamW at --lr for the rest)");
    std::vector<dx::row> part;
    if (inner == "adamw-external") {
      part = run_inner<external>(o, problem, launch, s);
    } else if (inner == "adamw") {
      s.lr = schedule(o.lr);
      part = run_inner<adamw>(o, problem, launch, s);
    } else {
      s.lr = schedule(o.muon_lr);
      part = run_inner<muon>(o, problem, launch, s);
    }
    for (auto& r : part) {
      if (o.inner.size() > 1) r.variant += " [" + inner + "]";
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

const dx::row* find(const std::vector<dx::row>& rows, const std::string& variant) {
  for (const auto& r : rows)
    if (r.variant == variant) return &r;
  return nullptr;
}

// The comparisons within one inner optimizer's rows (labels end in `suffix`).
void compare(const options& o, const std::vector<dx::row>& rows, const std::string& suffix) {
  const auto* ddp = find(rows, "data parallel" + suffix);
  const auto* dl = find(rows, "diloco" + suffix);
  const auto* alone = find(rows, "single worker" + suffix);
  if (ddp && dl)
    std::printf("diloco%s / data parallel: held-out loss x%.4f (%+.2f%%), bytes %.1fx fewer (H/2 = %.1f)\n",
                suffix.c_str(), dl->final_loss / ddp->final_loss, 100.0 * (dl->final_loss / ddp->final_loss - 1.0),
                dl->bytes_sent ? static_cast<double>(ddp->bytes_sent) / static_cast<double>(dl->bytes_sent) : 0.0,
                o.inner_steps / 2.0);
  if (alone && dl)
    std::printf("diloco%s / single worker (same per-worker compute): held-out loss x%.4f\n", suffix.c_str(),
                dl->final_loss / alone->final_loss);
  for (const char* v : {"diloco+int4+ef", "diloco+bf16", "diloco streaming", "diloco one-step delay", "diloco eager"})
    if (const auto* r = find(rows, v + suffix); r && dl)
      std::printf("%s / diloco: held-out loss x%.4f (%+.2f%%), bytes %.1fx fewer\n", (v + suffix).c_str(),
                  r->final_loss / dl->final_loss, 100.0 * (r->final_loss / dl->final_loss - 1.0),
                  r->bytes_sent ? static_cast<double>(dl->bytes_sent) / static_cast<double>(r->bytes_sent) : 0.0);
}

void report(const options& o, const std::vector<dx::row>& rows) {
  std::printf("\n");
  dx::write_table(stdout, rows);
  std::printf("\n");
  if (o.inner.size() == 1) {
    compare(o, rows, "");
  } else {
    for (const auto& inner : o.inner) compare(o, rows, " [" + inner + "]");
    // Each method's final held-out loss under each inner optimizer against
    // the first listed (--inner adamw-external,adamw: the same AdamW update
    // by libtorch and by the library).
    const std::string first = " [" + o.inner.front() + "]";
    for (const auto& r : rows) {
      if (r.variant.size() < first.size() || r.variant.compare(r.variant.size() - first.size(), first.size(), first) != 0)
        continue;
      const std::string method = r.variant.substr(0, r.variant.size() - first.size());
      for (std::size_t i = 1; i < o.inner.size(); ++i)
        if (const auto* other = find(rows, method + " [" + o.inner[i] + "]"))
          std::printf("%s: held-out loss %s %.6f against %s %.6f: relative difference %.2e\n", method.c_str(),
                      o.inner[i].c_str(), other->final_loss, o.inner.front().c_str(), r.final_loss,
                      std::abs(other->final_loss - r.final_loss) / std::abs(r.final_loss));
    }
  }
  if (!o.out.empty()) {
    dx::write_files(o.out, "gpt", rows);
    std::printf("wrote %s/gpt.csv, gpt_curves.csv, gpt.json\n", o.out.c_str());
  }
  std::fflush(stdout);
}

char_mlp::dataset load(const options& o, bool lead) {
  char_mlp::config c;
  c.fortunes_dir = o.fortunes_dir;
  c.corpus_path = o.corpus_path;
  c.synthetic = o.synthetic;
  c.seed = o.seed;
  if (!c.corpus_path.empty() && !std::filesystem::is_regular_file(c.corpus_path))
    throw diloco::config_error("train_gpt: corpus: no such file: " + c.corpus_path);
  auto data = char_mlp::load_dataset(c);
  if (lead) {
    if (!data.fallback.empty())
      std::printf("NOTE: using the built-in synthetic corpus as a fallback: %s.\n", data.fallback.c_str());
    std::printf("corpus: %s\n        %zu training and %zu held-out characters, vocabulary %d\n", data.source.c_str(),
                data.train.size(), data.held_out.size(), data.vocab());
  }
  return data;
}

// One worker per process (MPI ranks, Gloo processes): every process runs
// every method on its rank; rank 0 prints and writes.
template <class Comm>
void run_per_process(Comm& comm, options o) {
  const bool lead = comm.rank() == 0;
  if (!lead) o.quiet = true;
  const auto data = load(o, lead);
  o.g.dims.vocab = data.vocab();
  dx::on_communicator<Comm> launch(comm);
  const auto rows = run_methods(o, data, launch, lead);
  if (lead) report(o, rows);
  comm.barrier();
}

int run(int argc, char** argv) {
  options o;
  parse(argc, argv, o, true);
  if (o.help) return 0;
  at::set_num_threads(o.g.threads_per_worker);
  if (o.comm == "mpi") {
#if defined(DILOCO_GPT_WITH_MPI)
    MPI_Init(&argc, &argv);
    int code = 0;
    try {
      diloco::comm::mpi comm(MPI_COMM_WORLD);
      run_per_process(comm, o);
    } catch (const std::exception& e) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may wait in a collective
    }
    MPI_Finalize();
    return code;
#else
    throw diloco::config_error("train_gpt: --comm mpi: this build has no MPI (diloco::mpi)");
#endif
  }
  if (o.comm == "gloo") {
#if defined(DILOCO_GPT_WITH_GLOO)
    auto comm = diloco::comm::gloo::from_env();
    run_per_process(comm, o);
    return 0;
#else
    throw diloco::config_error("train_gpt: --comm gloo: this build has no Gloo (diloco::gloo)");
#endif
  }
  const auto data = load(o, true);
  o.g.dims.vocab = data.vocab();
  dx::on_threads launch{o.workers, std::chrono::minutes(30)};
  const auto rows = run_methods(o, data, launch, true);
  report(o, rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
