// SPDX-License-Identifier: Apache-2.0
// The main demo: a character-level MLP trained three ways on the same data
// (synchronous data parallel, DiLoCo, and one worker with the same per-worker
// compute) with simulated workers on
// the in-process threads communicator; prints held-out loss and bytes sent.
//
//   train_char_mlp [--workers M] [--steps N] [--batch B] [--inner-steps H]
//                  [--lr X] [--compress LIST] [--synthetic] ... [corpus.txt]
//
// (--help lists every option.)

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "char_mlp/cli.hpp"
#include "char_mlp/experiment.hpp"

int main(int argc, char** argv) {
  try {
    const char_mlp::cli defaults;
    const auto opts = char_mlp::parse_cli(argc, argv, defaults, "simulated workers, threads of this process");
    if (opts.help) return 0;
    auto c = opts.c;
    char_mlp::check(c);
    const auto data = char_mlp::load_dataset(c);
    c.dims.vocab = data.vocab();
    char_mlp::print_header(c, data, "");
    char_mlp::print_outer_steps(opts);

    std::vector<char_mlp::result> rows;
    const char_mlp::result* ddp = nullptr;
    const char_mlp::result* dl = nullptr;
    rows.reserve(2 + char_mlp::diloco_variants(opts).size());  // pointers into it are kept
    if (opts.wants("single")) rows.push_back(char_mlp::run_single(c, data));
    if (opts.wants("ddp")) {
      rows.push_back(
          char_mlp::on_threads(c.workers, [&](auto& comm) { return char_mlp::run_data_parallel(c, data, comm); }));
      ddp = &rows.back();
    }
    if (opts.wants("diloco"))
      dl = char_mlp::run_diloco_rows(c, data, opts, rows,
                                     [&](auto run) { return char_mlp::on_threads(c.workers, run); });
    char_mlp::print_report(rows, ddp, dl);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
