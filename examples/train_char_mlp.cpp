// The main demo: a character-level MLP trained three ways on the same data
// (one worker, synchronous data parallel, DiLoCo) with simulated workers on
// the in-process threads communicator; prints held-out loss and bytes sent.
//
//   train_char_mlp [--workers M] [--steps N] [--batch B] [--inner-steps H]
//                  [--lr X] [--outer-lr X] [--outer-momentum X] [--hidden N]
//                  [--context N] [--seed N] [--log-every N] [corpus.txt]

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "char_mlp/experiment.hpp"

namespace {

void usage() {
  std::puts(
      "usage: train_char_mlp [options] [corpus.txt]\n"
      "  --workers M         simulated workers (default 4)\n"
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
      "                      bf16 cast; int8/int4 block-wise (B=128) and top-k (1%) with error feedback\n"
      "  corpus.txt          train on this text file instead of the built-in corpus");
}

std::string methods = "single,ddp,diloco";
std::string compressors = "none,bf16,int8,int4";

bool wanted(const char* m) { return methods.find(m) != std::string::npos; }

char_mlp::config parse(int argc, char** argv) {
  char_mlp::config c;
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
    else if (a == "--methods") methods = value();
    else if (a == "--compress") compressors = value();
    else if (a == "-h" || a == "--help") { usage(); std::exit(0); }
    else if (!a.empty() && a[0] == '-') throw diloco::config_error("demo: unknown option " + a);
    else c.corpus_path = a;
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto c = parse(argc, argv);
    char_mlp::check(c);
    const auto data = char_mlp::load_dataset(c);
    c.dims.vocab = data.vocab();
    std::printf("corpus: %s, %zu training characters, vocabulary %d\n",
                c.corpus_path.empty() ? "built-in synthetic" : c.corpus_path.c_str(), data.train.size(),
                data.vocab());
    std::printf("model: %zu parameters; %d steps x %d samples; %d workers; DiLoCo H = %d\n\n",
                char_mlp::model(c.dims, c.seed).parameter_count(), c.steps, c.batch, c.workers, c.inner_steps);

    std::vector<char_mlp::result> rows;
    const char_mlp::result* ddp = nullptr;
    const char_mlp::result* dl = nullptr;
    rows.reserve(8);
    if (wanted("single")) rows.push_back(char_mlp::run_single(c, data));
    if (wanted("ddp")) {
      rows.push_back(
          char_mlp::on_threads(c.workers, [&](auto& comm) { return char_mlp::run_data_parallel(c, data, comm); }));
      ddp = &rows.back();
    }
    if (wanted("diloco")) {
      namespace cp = diloco::compress;
      const std::string h = "(H=" + std::to_string(c.inner_steps) + ")";
      auto row = [&](const char* name, auto run) {
        if (compressors.find(name) == std::string::npos) return;
        rows.push_back(char_mlp::on_threads(c.workers, run));
        if (std::string(name) == "none") dl = &rows.back();
      };
      row("none", [&](auto& comm) { return char_mlp::run_diloco<cp::none>(c, data, comm, "diloco " + h); });
      row("bf16", [&](auto& comm) { return char_mlp::run_diloco<cp::cast<diloco::bf16>>(c, data, comm, "diloco+bf16"); });
      row("int8", [&](auto& comm) {
        return char_mlp::run_diloco<cp::error_feedback<cp::blockwise<diloco::int8>>>(c, data, comm, "diloco+int8+ef");
      });
      row("int4", [&](auto& comm) {
        return char_mlp::run_diloco<cp::error_feedback<cp::blockwise<diloco::int4>>>(c, data, comm, "diloco+int4+ef");
      });
      row("topk", [&](auto& comm) {
        return char_mlp::run_diloco<cp::error_feedback<cp::topk<>>>(c, data, comm, "diloco+top10%+ef", {.fraction = 0.1f});
      });
    }
    char_mlp::print_table(rows);
    if (ddp && dl)
      std::printf("\ndiloco / data parallel: held-out loss x%.3f, bytes %.1fx fewer\n",
                  dl->held_out_loss / ddp->held_out_loss,
                  dl->bytes_per_worker ? static_cast<double>(ddp->bytes_per_worker) /
                                             static_cast<double>(dl->bytes_per_worker)
                                       : 0.0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
