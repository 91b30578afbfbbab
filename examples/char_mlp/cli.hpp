#pragma once

// Command-line options of the demo's multi-process mains (one rank per
// process): the experiment's settings, without --workers, which is the
// world size the launcher gives.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "experiment.hpp"

namespace char_mlp::cli {

struct parsed {
  config settings;
  std::string methods = "ddp,diloco";
  bool help = false;
};

inline const char* options_help() {
  return "  --steps N           global steps; each consumes --batch samples (default 2000)\n"
         "  --batch B           global batch, split over the ranks (default 256)\n"
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
         "  --methods LIST      which of single,ddp,diloco to run (default ddp,diloco;\n"
         "                      single runs the one-worker baseline on every rank)\n"
         "  corpus.txt          train on this text file instead of the built-in corpus\n";
}

inline parsed parse(int argc, char** argv) {
  parsed p;
  config& c = p.settings;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw diloco::config_error("demo: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") c.steps = std::atoi(value());
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
    else if (a == "--methods") p.methods = value();
    else if (a == "--workers")
      throw diloco::config_error("demo: --workers does not apply here: the world size is the number of processes "
                                 "the launcher starts");
    else if (a == "-h" || a == "--help") p.help = true;
    else if (!a.empty() && a[0] == '-') throw diloco::config_error("demo: unknown option " + a);
    else c.corpus_path = a;
  }
  for (std::size_t b = 0; b < p.methods.size();) {
    std::size_t e = p.methods.find(',', b);
    if (e == std::string::npos) e = p.methods.size();
    const std::string m = p.methods.substr(b, e - b);
    if (m != "single" && m != "ddp" && m != "diloco")
      throw diloco::config_error("demo: --methods takes single, ddp and diloco; got '" + m + "'");
    b = e + 1;
  }
  return p;
}

inline bool wanted(const parsed& p, const char* method) { return p.methods.find(method) != std::string::npos; }

}  // namespace char_mlp::cli
