// SPDX-License-Identifier: Apache-2.0
// The main demo with one worker per process, joined by Gloo over TCP:
// synchronous data parallel and DiLoCo over the same data, as
// train_char_mlp does with threads. Start it through the launcher, which
// sets the rank, world size and rendezvous store of every process:
//
//   scripts/launch_gloo.sh 4 -- ./build/examples/train_char_mlp_gloo [options] [corpus.txt]
//
// Rank 0 prints progress and the table.
//
// Elastic (docs/guide.md, "Surviving failures"): a worker dies and rejoins while
// DiLoCo trains, the others going on without it in the meantime:
//
//   scripts/launch_gloo.sh 4 --max-restarts 1 --timeout-ms 3000 --
//       ./build/examples/train_char_mlp_gloo --methods diloco --sync blocking --compress none --crash 2:250
// (one command line)

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
    defaults.methods = {"ddp", "diloco"};
    defaults.crash_option = true;
    // --help before joining: the launcher's processes need not all be up.
    const auto early = char_mlp::parse_cli(argc, argv, defaults, "must equal the number of processes the launcher starts");
    if (early.help) return 0;
    auto comm = diloco::comm::gloo::from_env();
    rank = comm.rank();
    defaults.c.workers = comm.size();
    char_mlp::run_one_worker_per_process(comm, char_mlp::parse_cli(argc, argv, defaults, "", false),
                                         " (processes over Gloo)");
    return 0;
  } catch (const std::exception& e) {
    if (rank >= 0)
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    else
      std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
