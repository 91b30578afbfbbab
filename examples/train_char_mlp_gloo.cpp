// The main demo with one worker per process, joined by Gloo over TCP:
// synchronous data parallel and DiLoCo over the same data, as
// train_char_mlp does with threads. Start it through the launcher, which
// sets the rank, world size and rendezvous store of every process:
//
//   scripts/launch_gloo.sh 4 -- ./build/examples/train_char_mlp_gloo [options] [corpus.txt]
//
// Rank 0 prints progress and the table.

#include <cstdio>
#include <diloco/comm/gloo.hpp>
#include <exception>
#include <string>
#include <vector>

#include "char_mlp/cli.hpp"
#include "char_mlp/experiment.hpp"

int main(int argc, char** argv) {
  int rank = -1;
  try {
    char_mlp::cli defaults;
    defaults.methods = "ddp,diloco";
    // --help before joining: the launcher's processes need not all be up.
    const auto early = char_mlp::parse_cli(argc, argv, defaults, "must equal the number of processes the launcher starts");
    if (early.help) return 0;
    auto comm = diloco::comm::gloo::from_env();
    rank = comm.rank();
    const bool lead = rank == 0;
    defaults.c.workers = comm.size();
    const auto opts = char_mlp::parse_cli(argc, argv, defaults, "", false);
    auto c = opts.c;
    if (c.workers != comm.size())
      throw diloco::config_error("demo: --workers " + std::to_string(c.workers) + " but " +
                                 std::to_string(comm.size()) + " Gloo processes: each process is one worker");
    char_mlp::check(c);
    const auto data = char_mlp::load_dataset(c);  // every rank builds the same data from the seed
    c.dims.vocab = data.vocab();
    if (lead) char_mlp::print_header(c, data, " (processes over Gloo)");

    std::vector<char_mlp::result> rows;
    rows.reserve(8);
    const char_mlp::result* ddp = nullptr;
    const char_mlp::result* dl = nullptr;
    if (opts.wants("single")) {
      // Every rank trains the baseline (the same one), so none waits long
      // for another at the next collective.
      auto quiet = c;
      if (!lead) quiet.log_every = 0;
      rows.push_back(char_mlp::run_single(quiet, data));
    }
    if (opts.wants("ddp")) {
      rows.push_back(char_mlp::run_data_parallel(c, data, comm));
      ddp = &rows.back();
    }
    if (opts.wants("diloco"))
      dl = char_mlp::run_diloco_rows(c, data, opts.compressors, rows, [&](auto run) { return run(comm); });
    if (lead) char_mlp::print_report(rows, ddp, dl);
    comm.barrier();  // nobody leaves while another still needs it
    return 0;
  } catch (const std::exception& e) {
    if (rank >= 0)
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    else
      std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
