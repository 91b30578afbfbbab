// The main demo with one worker per process, joined by Gloo over TCP:
// synchronous data parallel and DiLoCo over the same data, as
// train_char_mlp does with threads. Start it through the launcher, which
// sets the rank, world size and rendezvous store of every process:
//
//   scripts/launch_gloo.sh 4 -- ./build/examples/train_char_mlp_gloo [options] [corpus.txt]
//
// Rank 0 prints progress and the table.

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <diloco/comm/gloo.hpp>

#include "char_mlp/cli.hpp"
#include "char_mlp/experiment.hpp"

int main(int argc, char** argv) {
  int rank = -1;
  try {
    const auto args = char_mlp::cli::parse(argc, argv);
    if (args.help) {
      std::printf("usage: scripts/launch_gloo.sh N [launcher options] -- train_char_mlp_gloo [options] [corpus.txt]\n%s",
                  char_mlp::cli::options_help());
      return 0;
    }
    auto comm = diloco::comm::gloo::from_env();
    rank = comm.rank();
    char_mlp::config c = args.settings;
    c.workers = comm.size();
    char_mlp::check(c);
    const auto data = char_mlp::load_dataset(c);
    c.dims.vocab = data.vocab();
    const bool lead = rank == 0;
    if (lead) {
      std::printf("corpus: %s, %zu training characters, vocabulary %d\n",
                  c.corpus_path.empty() ? "built-in synthetic" : c.corpus_path.c_str(), data.train.size(),
                  data.vocab());
      std::printf("model: %zu parameters; %d steps x %d samples; %d processes over Gloo; DiLoCo H = %d\n\n",
                  char_mlp::model(c.dims, c.seed).parameter_count(), c.steps, c.batch, c.workers, c.inner_steps);
      std::fflush(stdout);
    }

    std::vector<char_mlp::result> rows;
    rows.reserve(3);
    const char_mlp::result* ddp = nullptr;
    const char_mlp::result* dl = nullptr;
    if (char_mlp::cli::wanted(args, "single")) {
      // Every rank trains the baseline (the same one), so none waits long
      // for another at the next collective.
      auto quiet = c;
      if (!lead) quiet.log_every = 0;
      rows.push_back(char_mlp::run_single(quiet, data));
    }
    if (char_mlp::cli::wanted(args, "ddp")) {
      rows.push_back(char_mlp::run_data_parallel(c, data, comm));
      ddp = &rows.back();
    }
    if (char_mlp::cli::wanted(args, "diloco")) {
      rows.push_back(char_mlp::run_diloco<diloco::compress::none>(c, data, comm,
                                                                   "diloco (H=" + std::to_string(c.inner_steps) + ")"));
      dl = &rows.back();
    }
    if (lead) {
      char_mlp::print_table(rows);
      if (ddp && dl)
        std::printf("\ndiloco / data parallel: held-out loss x%.3f, bytes %.1fx fewer\n",
                    dl->held_out_loss / ddp->held_out_loss,
                    dl->bytes_per_worker ? static_cast<double>(ddp->bytes_per_worker) /
                                               static_cast<double>(dl->bytes_per_worker)
                                         : 0.0);
    }
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
