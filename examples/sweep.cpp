// SPDX-License-Identifier: Apache-2.0
// The DiLoCo claims at small scale, on the character MLP and the fortunes:
// diloco::experiment runs variants chosen at compile time (the lists
// below) over grids chosen at run time, and writes every row to CSV and
// JSON (docs/plot_results.py draws docs/results.md's figures from them).
//
//   sweep [--grid scale,shards,compressors,schedules] [--out DIR]
//         [--workers 1,2,4,8] [--inner-steps 1,10,20,50,100,250] ...
//
// Outer step (--outer): Nesterov for every DiLoCo row, except SparseLoCo,
// which takes its paper's plain outer SGD step (--outer-sgd-lr, no
// momentum) unless --outer names one for every row.
//
// Grids:
//   scale        DiLoCo (fp32, blocking) for every M x H, against data
//                parallel and one worker with the same per-worker compute
//                at every M and budget
//   shards       iid against by-file shards, DiLoCo and data parallel, for
//                every M > 1, at H = --shards-h
//   compressors  every compressor at M = --compare-workers, H = --compare-h
//   schedules    every schedule at the same M and H
// Budget: about --passes passes over the training text at a global batch
// of --batch samples; where that gives fewer than --min-rounds rounds of H
// steps, the steps grow to min-rounds x H and the batch shrinks to keep
// the pass (rounded to a multiple of every M asked for).

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <diloco/diloco.hpp>
#include <diloco/experiment.hpp>
#include <exception>
#include <numeric>
#include <string>
#include <vector>

#include "char_mlp/cli_checks.hpp"
#include "char_mlp/compressors.hpp"
#include "char_mlp/corpus.hpp"
#include "char_mlp/experiment.hpp"
#include "char_mlp/problem.hpp"
#include "char_mlp/shards.hpp"

namespace {

namespace dx = diloco::experiment;
namespace cs = char_mlp::compressors;
namespace sy = diloco::sync;
using adamw = diloco::inner::adamw;
using nesterov = diloco::outer::nesterov;
using outer_sgd = diloco::outer::sgd;

// V under `Label`, which names the outer step where it is not Nesterov:
// "diloco+sparseloco (outer sgd)".
template <dx::fixed_string Label, class V>
struct labelled : V {
  static std::string name() {
    std::string out = Label.text;
    if constexpr (!std::is_same_v<typename V::outer_type, nesterov>) out += std::string(" (") + V::outer_type::name + ")";
    return out;
  }
};

template <class O, class C>
using with_compressor = dx::variant<adamw, O, C>;
template <class O, class S>
using with_schedule = dx::variant<adamw, O, cs::none, S>;

// The variants, at compile time; the DiLoCo lists for either outer step O.
using baselines = dx::variants<dx::data_parallel<adamw>, dx::single_worker<adamw>>;
template <class O>
using plain = dx::variants<labelled<"diloco", dx::variant<adamw, O>>>;
using data_parallel = dx::variants<dx::data_parallel<adamw>>;
template <class O>
using compressors_before_sparse =
    dx::variants<labelled<"diloco+bf16", with_compressor<O, cs::bf16>>,
                 labelled<"diloco+int8+ef", with_compressor<O, cs::int8>>,
                 labelled<"diloco+int4+ef", with_compressor<O, cs::int4>>,
                 labelled<"diloco+fp8_e4m3+ef", with_compressor<O, cs::fp8>>,
                 labelled<"diloco+fp8_e5m2+ef", with_compressor<O, cs::fp8e5m2>>,
                 labelled<"diloco+fp4_e3m0+ef", with_compressor<O, cs::fp4>>,
                 labelled<"diloco+int2+ef", with_compressor<O, cs::int2>>>;
template <class O>
using sparse = dx::variants<labelled<"diloco+sparseloco", with_compressor<O, cs::sparseloco>>>;
template <class O>
using compressors_after_sparse =
    dx::variants<labelled<"diloco+adaptive", with_compressor<O, cs::adaptive>>,
                 labelled<"diloco+top10%+ef", with_compressor<O, cs::topk>>,
                 labelled<"diloco+low_rank r4", with_compressor<O, cs::low_rank>>>;
template <class O>
using every_schedule = dx::variants<labelled<"diloco streaming", with_schedule<O, sy::streaming>>,
                                    labelled<"diloco one-step delay", with_schedule<O, sy::one_step_delay>>,
                                    labelled<"diloco eager", with_schedule<O, sy::eager>>>;

// Calls f.template operator()<O>() with O the outer step `o` names.
template <class F>
void with_outer(char_mlp::outer_step o, F&& f) {
  if (o == char_mlp::outer_step::sgd)
    f.template operator()<outer_sgd>();
  else
    f.template operator()<nesterov>();
}

struct sweep_options {
  char_mlp::config c;  // model, lr schedule, outer optimizer, streaming settings
  std::vector<std::string> grids{"scale", "shards", "compressors", "schedules"};
  std::string outer;                  // --outer: every DiLoCo row's; empty: Nesterov, SparseLoCo outer SGD
  std::vector<std::string> only;      // --variants: the compressors and schedules grids run only these
  std::vector<int> workers{1, 2, 4, 8};
  std::vector<int> inner_steps{1, 10, 20, 50, 100, 250};
  int compare_workers = 4, compare_h = 100, shards_h = 100;
  double passes = 1.0;
  int min_rounds = 40;
  int curve_points = 5;
  std::string out = "sweep-results";
  bool verbose = false;
};

struct budget {
  int steps = 0, batch = 0;
};

// About `passes` passes over `train_chars` samples at `batch` a step, at
// least `min_rounds` rounds of H steps, the batch a multiple of `multiple`.
budget budget_for(const sweep_options& o, std::size_t train_chars, int h, int multiple) {
  const double samples = o.passes * static_cast<double>(train_chars);
  budget b;
  b.steps = std::max({1, static_cast<int>(std::lround(samples / o.c.batch)), o.min_rounds * h});
  b.batch = std::max(multiple, static_cast<int>(std::lround(samples / b.steps / multiple)) * multiple);
  return b;
}

class sweep {
 public:
  sweep(const sweep_options& o, const char_mlp::dataset& d) : o_(o), d_(d) {
    multiple_ = 1;
    for (const int m : o.workers) multiple_ = std::lcm(multiple_, m);
    multiple_ = std::lcm(multiple_, o.compare_workers);
  }

  // Runs `Variants` at M workers, H, with the given shards; appends and
  // rewrites the outputs.
  template <class Variants>
  void run(const std::string& grid, int m, int h, char_mlp::shard_mode shards) {
    const budget b = budget_for(o_, d_.train.size(), h, multiple_);
    char_mlp::config c = o_.c;
    c.workers = m;
    c.inner_steps = h;
    c.steps = b.steps;
    c.batch = b.batch;
    c.shards = shards;
    // The streaming defaults (P = 4, tau = 2) shrink to fit a small H.
    c.fragments = std::min(c.fragments, h);
    c.delay = std::min(c.delay, std::max(0, h / c.fragments - 1));
    const auto plan = char_mlp::shard_plan(d_, shards, m, static_cast<std::size_t>(c.dims.context) + 1);
    dx::settings s{.steps = static_cast<std::uint64_t>(c.steps),
                   .inner_steps = static_cast<std::size_t>(h),
                   .eval_every = static_cast<std::uint64_t>(std::max(1, c.steps / o_.curve_points)),
                   .seed = c.seed,
                   .lr = [c](std::uint64_t step) { return char_mlp::lr_at(c, static_cast<int>(step)); },
                   .log = o_.verbose ? stdout : nullptr,
                   .tags = {{"grid", grid},
                            {"shards", char_mlp::name_of(shards)},
                            {"batch", std::to_string(c.batch)},
                            {"passes", std::to_string(static_cast<double>(c.steps) * c.batch /
                                                      static_cast<double>(d_.train.size()))}}};
    auto configure = [&c](auto& opts, std::string_view) {
      opts.inner = char_mlp::inner_options(c);
      using O = std::remove_cvref_t<decltype(opts)>;
      if constexpr (!std::is_void_v<dx::compressor_of_t<O>>) {
        opts.outer = char_mlp::outer_options<dx::outer_of_t<O>>(c);
        opts.compress = cs::compressor_options<dx::compressor_of_t<O>>(c.feedback_decay);
        opts.sync = char_mlp::sync_options<dx::sync_of_t<O>>(c);
      }
    };
    const auto rows = dx::run<Variants>(char_mlp::problem{&d_, &c, &plan}, dx::on_threads{m}, s, configure);
    for (const auto& r : rows) {
      std::printf("%-11s M=%d H=%-3d %-7s %-26s %-14s held-out %.4f  bytes %12llu  rounds %5llu  %6.1f s\n",
                  grid.c_str(), m, h, char_mlp::name_of(shards), r.variant.c_str(), r.outer.c_str(), r.final_loss,
                  static_cast<unsigned long long>(r.bytes_sent), static_cast<unsigned long long>(r.rounds), r.seconds);
      std::fflush(stdout);
      rows_.push_back(r);
    }
    write();
  }

  // Runs each variant of the list that --variants names (every one when it
  // names none) on its own: the same rows as one run of the list.
  template <class... V>
  void run_each(dx::variants<V...>, const std::string& grid, int m, int h, char_mlp::shard_mode shards) {
    auto one = [&]<class W>() {
      if (o_.only.empty() || std::find(o_.only.begin(), o_.only.end(), W::name()) != o_.only.end())
        run<dx::variants<W>>(grid, m, h, shards);
    };
    (one.template operator()<V>(), ...);
  }

  const std::vector<dx::row>& rows() const { return rows_; }

 private:
  void write() const { dx::write_files(o_.out, "sweep", rows_); }

  const sweep_options& o_;
  const char_mlp::dataset& d_;
  int multiple_ = 1;
  std::vector<dx::row> rows_;
};

bool wants(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

int run(int argc, char** argv) {
  namespace cd = char_mlp::detail;
  sweep_options o;
  CLI::App app{"DiLoCo against data parallel and one worker on the character MLP over grids of workers, H, shards, "
               "compressors and schedules; writes sweep.csv, sweep_curves.csv and sweep.json",
               "sweep"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cd::add_list(app, "--grid", o.grids, "which grids to run", {"scale", "shards", "compressors", "schedules"});
  app.add_option("--workers", o.workers, "M values of the scale grid (and shards grid, M > 1)")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str()
      ->check(cd::int_in(1, 64));
  app.add_option("--inner-steps", o.inner_steps, "H values of the scale grid")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str()
      ->check(cd::int_in(1));
  app.add_option("--compare-workers", o.compare_workers, "M of the compressors and schedules grids")
      ->capture_default_str()
      ->check(cd::int_in(1, 64));
  app.add_option("--compare-h", o.compare_h, "H of the compressors and schedules grids")
      ->capture_default_str()
      ->check(cd::int_in(1));
  app.add_option("--shards-h", o.shards_h, "H of the shards grid")->capture_default_str()->check(cd::int_in(1));
  app.add_option("--passes", o.passes, "passes over the training text per run")
      ->capture_default_str()
      ->check(cd::finite_in(0.0, 100.0, true));
  app.add_option("--min-rounds", o.min_rounds, "at least this many outer rounds per run")
      ->capture_default_str()
      ->check(cd::int_in(1));
  app.add_option("--batch", o.c.batch, "global batch when the rounds allow it")
      ->capture_default_str()
      ->check(cd::int_in(1, 1 << 20));
  app.add_option("--curve-points", o.curve_points, "held-out evaluations per run")
      ->capture_default_str()
      ->check(cd::int_in(1, 1000));
  app.add_option("--outer", o.outer,
                 "DiLoCo's outer step, every row: nesterov (lr 0.7, momentum 0.9) or sgd (no momentum, "
                 "--outer-sgd-lr); default: nesterov, and sgd for SparseLoCo (its paper's outer step)")
      ->check(CLI::IsMember(char_mlp::outer_names));
  app.add_option("--outer-sgd-lr", o.c.sgd_outer_lr, "outer SGD's learning rate (1: plain averaging)")
      ->capture_default_str()
      ->check(cd::finite_in(0.0, 10.0, true));
  app.add_option("--variants", o.only,
                 "compressors and schedules grids: run only these variants, by label (e.g. "
                 "diloco,\"diloco+sparseloco (outer sgd)\"); default: all")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--hidden", o.c.dims.hidden, "hidden units")->capture_default_str()->check(cd::int_in(1, 65536));
  app.add_option("--lr", o.c.lr, "AdamW peak lr")->capture_default_str()->check(cd::finite_in(0.0, 10.0, true));
  app.add_option("--eval-windows", o.c.eval_windows, "held-out windows per evaluation")->capture_default_str();
  app.add_option("--seed", o.c.seed, "data and initialization seed")->capture_default_str();
  app.add_option("--out", o.out, "output directory")->capture_default_str();
  app.add_option("--fortunes-dir", o.c.fortunes_dir, "Debian fortunes' directory")->capture_default_str();
  app.add_flag("--verbose", o.verbose, "a progress line per held-out evaluation");
  if (char_mlp::parse_or_help(app, argc, argv, "sweep: ")) return 0;

  const auto data = char_mlp::load_dataset(o.c);
  o.c.dims.vocab = data.vocab();
  if (!data.fallback.empty()) std::printf("NOTE: the fortunes are missing (%s); synthetic corpus\n", data.fallback.c_str());
  std::printf("corpus: %s, %zu training characters; model %zu parameters\n", data.source.c_str(), data.train.size(),
              char_mlp::model(o.c.dims, o.c.seed).parameter_count());
  sweep sw(o, data);
  constexpr auto iid_mode = char_mlp::shard_mode::iid;
  const auto outer = char_mlp::outer_for(o.outer, "none");                 // every DiLoCo row but SparseLoCo
  const auto sparse_outer = char_mlp::outer_for(o.outer, "sparseloco");   // SparseLoCo's
  std::printf("outer step: %s (lr %g)%s\n", char_mlp::name_of(outer),
              static_cast<double>(outer == char_mlp::outer_step::sgd ? o.c.sgd_outer_lr : o.c.outer_lr),
              outer == sparse_outer ? ""
                                    : (std::string("; SparseLoCo: ") + char_mlp::name_of(sparse_outer) + " (lr " +
                                       CLI::detail::to_string(o.c.sgd_outer_lr) + ", no momentum: its paper's)")
                                          .c_str());

  if (wants(o.grids, "scale"))
    for (const int m : o.workers) {
      std::vector<int> budgets_done;
      for (const int h : o.inner_steps) {
        // The baselines once per budget (H only changes the budget).
        const int steps = budget_for(o, data.train.size(), h, 1).steps;
        if (std::find(budgets_done.begin(), budgets_done.end(), steps) == budgets_done.end()) {
          budgets_done.push_back(steps);
          sw.run<baselines>("scale", m, h, iid_mode);
        }
        with_outer(outer, [&]<class O>() { sw.run<plain<O>>("scale", m, h, iid_mode); });
      }
    }
  if (wants(o.grids, "shards"))
    for (const int m : o.workers) {
      if (m < 2) continue;
      for (const auto mode : {char_mlp::shard_mode::iid, char_mlp::shard_mode::by_file})
        with_outer(outer, [&]<class O>() { sw.run<dx::join<data_parallel, plain<O>>>("shards", m, o.shards_h, mode); });
    }
  // The compressors and schedules grids in table order, each variant on its
  // own (--variants picks them), SparseLoCo under its own outer step.
  const int cm = o.compare_workers, ch = o.compare_h;
  if (wants(o.grids, "compressors")) {
    with_outer(outer, [&]<class O>() {
      sw.run_each(dx::join<plain<O>, compressors_before_sparse<O>>{}, "compressors", cm, ch, iid_mode);
    });
    with_outer(sparse_outer, [&]<class O>() { sw.run_each(sparse<O>{}, "compressors", cm, ch, iid_mode); });
    with_outer(outer, [&]<class O>() { sw.run_each(compressors_after_sparse<O>{}, "compressors", cm, ch, iid_mode); });
  }
  if (wants(o.grids, "schedules"))
    with_outer(outer, [&]<class O>() {
      sw.run_each(dx::join<plain<O>, every_schedule<O>>{}, "schedules", cm, ch, iid_mode);
    });

  std::printf("\n");
  dx::write_table(stdout, sw.rows());
  std::printf("\nwrote %s/sweep.csv, sweep_curves.csv, sweep.json\n", o.out.c_str());
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
