// SPDX-License-Identifier: Apache-2.0
// The main demo on its default settings and corpus (Debian's fortunes),
// running the same code as examples/train_char_mlp: DiLoCo learns far more
// than a context-free model, stays within 2.5% of synchronous data parallel's
// held-out loss while each worker sends at least H/2 times fewer bytes, and
// its int8 / int4 compressed rows stay within 1% / 2% of fp32 DiLoCo. Plus
// the corpus plumbing (fortune files, the synthetic fallback) and the
// synthetic corpus on the demo's former defaults.
//
// The bounds come from running the defaults (4 workers, 4500 steps x 512,
// H = 100, lr 5e-3) on seeds 1-3; the measured values are in the comments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "char_mlp/experiment.hpp"

namespace {

// Cross-entropy (nats per character) of the held-out text under the
// training text's character frequencies (add-one smoothed): the best a
// model that ignores its context can do.
double unigram_loss(const char_mlp::dataset& d) {
  std::vector<double> counts(static_cast<std::size_t>(d.vocab()), 1.0);
  for (const auto id : d.train) counts[id] += 1.0;
  const double total = static_cast<double>(d.train.size()) + static_cast<double>(d.vocab());
  double loss = 0.0;
  for (const auto id : d.held_out) loss -= std::log(counts[id] / total);
  return loss / static_cast<double>(d.held_out.size());
}

// The default run, shared by the test cases below (it takes most of this
// file's time): data parallel and DiLoCo fp32, int8 and int4 rows.
struct default_runs {
  char_mlp::config c;
  char_mlp::dataset data;
  char_mlp::result ddp, plain, i8, i4;
};

const default_runs& fortunes_runs() {
  static const default_runs r = [] {
    namespace cp = diloco::compress;
    default_runs out;
    out.c.log_every = 0;
    out.data = char_mlp::load_dataset(out.c);
    out.c.dims.vocab = out.data.vocab();
    const auto& c = out.c;
    const auto& data = out.data;
    if (!data.fallback.empty()) return out;  // the test cases fail on this
    out.ddp = char_mlp::on_threads(c.workers, [&](auto& comm) { return char_mlp::run_data_parallel(c, data, comm); });
    out.plain = char_mlp::on_threads(c.workers, [&](auto& comm) {
      return char_mlp::run_diloco<cp::none>(c, data, comm, "diloco");
    });
    out.i8 = char_mlp::on_threads(c.workers, [&](auto& comm) {
      return char_mlp::run_diloco<cp::error_feedback<cp::blockwise<diloco::int8, 128>>>(c, data, comm, "int8");
    });
    out.i4 = char_mlp::on_threads(c.workers, [&](auto& comm) {
      return char_mlp::run_diloco<cp::error_feedback<cp::blockwise<diloco::int4, 128>>>(c, data, comm, "int4");
    });
    return out;
  }();
  return r;
}

// Encoded bytes per parameter from the definition of the block-wise format:
// every tensor cut into blocks of B (the last one partial but occupying a
// full block), each 4 bytes of scale plus B * bits / 8 of values, and one
// 64-byte header per shard (one shard per worker).
double blockwise_bytes_per_parameter(const char_mlp::model& m, int workers, std::size_t block, int bits) {
  std::size_t blocks = 0, total = 0;
  for (const std::size_t n : m.tensor_sizes()) {
    blocks += (n + block - 1) / block;
    total += n;
  }
  return static_cast<double>(blocks * (4 + block * static_cast<std::size_t>(bits) / 8) +
                             static_cast<std::size_t>(workers) * 64) /
         static_cast<double>(total);
}

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& name) : path(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
};

}  // namespace

TEST_CASE("demo defaults on the fortunes: DiLoCo learns, within 2.5% of data parallel, >= H/2 times fewer bytes") {
  const auto& r = fortunes_runs();
  REQUIRE_MESSAGE(r.data.fallback.empty(), "the demo's default corpus is missing (", r.data.fallback,
                  "): install Debian's fortunes package (scripts/install-deps.sh)");
  const auto& c = r.c;
  // About one pass over the training text, with >= 40 outer rounds.
  const double passes = static_cast<double>(c.steps) * c.batch / static_cast<double>(r.data.train.size());
  CHECK(passes > 0.9);
  CHECK(passes < 1.1);
  CHECK(c.steps / c.inner_steps >= 40);

  const double unigram = unigram_loss(r.data);  // 3.27 nats on the fortunes
  MESSAGE("unigram ", unigram, "; data parallel ", r.ddp.held_out_loss, ", bytes ", r.ddp.bytes_per_worker,
          "; diloco ", r.plain.held_out_loss, ", bytes ", r.plain.bytes_per_worker, "; ratio ",
          r.plain.held_out_loss / r.ddp.held_out_loss);
  // Context is used: measured 2.00 (data parallel) and 2.02-2.03 (DiLoCo)
  // on seeds 1-3, 1.25 nats under the unigram model. A model that learned
  // only character frequencies (3.27) or only bigrams (a count model: 2.62)
  // fails this.
  CHECK(r.ddp.held_out_loss < unigram - 1.0);
  CHECK(r.plain.held_out_loss < unigram - 1.0);
  // DiLoCo / data parallel measured 1.009, 1.015 and 1.012 (seeds 1, 2, 3).
  // 2.5% leaves a point for the numerics of a changed engine, and fails
  // where the averaging brings nothing (one worker alone on its quarter of
  // the data: 1.040) or the inner lr is too high for DiLoCo (2e-2: 1.069).
  CHECK(r.plain.held_out_loss <= 1.025 * r.ddp.held_out_loss);
  CHECK(static_cast<double>(r.ddp.bytes_per_worker) >=
        (c.inner_steps / 2.0) * static_cast<double>(r.plain.bytes_per_worker));
  CHECK(r.plain.rounds == static_cast<std::uint64_t>(c.steps / c.inner_steps));
  CHECK(r.ddp.rounds == static_cast<std::uint64_t>(c.steps));
}

TEST_CASE("demo defaults: int8 + error feedback within 1% and int4 + error feedback within 2% of DiLoCo") {
  const auto& r = fortunes_runs();
  REQUIRE_MESSAGE(r.data.fallback.empty(), "the demo's default corpus is missing (", r.data.fallback, ")");
  const auto& c = r.c;
  MESSAGE("diloco ", r.plain.held_out_loss, ", int8+ef ", r.i8.held_out_loss, " (", r.i8.encoded_bytes_per_parameter,
          " B/param), int4+ef ", r.i4.held_out_loss, " (", r.i4.encoded_bytes_per_parameter, " B/param)");
  // Measured int8 / fp32 1.0002, 0.9995, 0.9990 and int4 / fp32 1.0039,
  // 1.0003, 1.0023 (seeds 1, 2, 3).
  CHECK(r.i8.held_out_loss <= 1.01 * r.plain.held_out_loss);
  CHECK(r.i4.held_out_loss <= 1.02 * r.plain.held_out_loss);
  const char_mlp::model shape(c.dims, c.seed);
  CHECK(r.i8.encoded_bytes_per_parameter == doctest::Approx(blockwise_bytes_per_parameter(shape, c.workers, 128, 8)));
  CHECK(r.i4.encoded_bytes_per_parameter == doctest::Approx(blockwise_bytes_per_parameter(shape, c.workers, 128, 4)));
  // The promise for large tensors, (4 + B bits/8) / B, within the padding of
  // this small model's partial blocks and headers.
  CHECK(r.i8.encoded_bytes_per_parameter < 1.10 * (132.0 / 128.0));
  CHECK(r.i4.encoded_bytes_per_parameter < 1.10 * (68.0 / 128.0));
  // Fewer bytes sent than fp32 DiLoCo, by about the encoding's ratio.
  CHECK(static_cast<double>(r.i8.bytes_per_worker) < 0.35 * static_cast<double>(r.plain.bytes_per_worker));
  CHECK(static_cast<double>(r.i4.bytes_per_worker) < 0.2 * static_cast<double>(r.plain.bytes_per_worker));
}

TEST_CASE("SparseLoCo (64 of every 4096 as int2, error feedback 0.95) within 3% of uncompressed DiLoCo at H = 10") {
  // On this 18.6k-parameter model 64/4096 keeps 1.6% of a round's values,
  // so it needs rounds: at the default H = 100 (45 rounds) it reaches 2.97
  // against 2.02. At H = 10 (450 rounds), measured on seeds 1, 2, 3:
  // uncompressed (outer momentum 0.9) 1.9831, 1.9883, 1.9901; SparseLoCo
  // at outer momentum 0.7 (its error feedback already carries momentum)
  // 2.0331, 2.0293, 2.0371: x1.025, x1.021, x1.024.
  const auto& r = fortunes_runs();
  REQUIRE(r.data.fallback.empty());
  auto c = r.c;
  c.inner_steps = 10;
  namespace cp = diloco::compress;
  using sparseloco = cp::error_feedback<cp::chunk_topk<4096, 64, diloco::int2>>;
  const auto plain = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::none>(c, r.data, comm, "diloco");
  });
  auto cs = c;
  cs.outer_momentum = 0.7f;
  const auto sparse = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<sparseloco>(cs, r.data, comm, "sparseloco", {.decay = 0.95f});
  });
  MESSAGE("diloco H=10 ", plain.held_out_loss, " (", plain.bytes_per_worker, " bytes/worker); sparseloco ",
          sparse.held_out_loss, " (", sparse.bytes_per_worker, " bytes/worker, ", sparse.encoded_bytes_per_parameter,
          " B/param)");
  CHECK(sparse.held_out_loss <= 1.03 * plain.held_out_loss);
  // The promised bytes, from the layout: every tensor in chunks of 4096 (the
  // last one partial), 116 bytes each, and one 64-byte header per worker.
  const char_mlp::model shape(c.dims, c.seed);
  std::size_t chunks = 0, total = 0;
  for (const std::size_t n : shape.tensor_sizes()) {
    chunks += (n + 4095) / 4096;
    total += n;
  }
  CHECK(sparse.encoded_bytes_per_parameter == doctest::Approx(static_cast<double>(chunks * 116 + 64) / static_cast<double>(total)));
  CHECK(sparse.bytes_per_worker * 20 < plain.bytes_per_worker);
}

TEST_CASE("demo defaults: streaming (P = 4, tau = 2) within 1% of blocking DiLoCo, one-step delay within 5%") {
  // Measured (seed 1): blocking 2.0204, streaming 2.0247 (x1.002), one-step
  // delay 2.0851 (x1.032: applying each mean one round late costs, as the
  // DiLoCoX and eager-update papers report for the naive delay).
  const auto& r = fortunes_runs();
  REQUIRE(r.data.fallback.empty());
  const auto& c = r.c;
  namespace cp = diloco::compress;
  namespace sy = diloco::sync;
  const auto streaming = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::none, std::remove_reference_t<decltype(comm)>, sy::streaming>(c, r.data, comm,
                                                                                                 "streaming");
  });
  const auto delayed = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::none, std::remove_reference_t<decltype(comm)>, sy::one_step_delay>(c, r.data, comm,
                                                                                                      "delay");
  });
  MESSAGE("streaming ", streaming.held_out_loss, " (hidden ", streaming.hidden_fraction, "), one-step delay ",
          delayed.held_out_loss, " (hidden ", delayed.hidden_fraction, "), blocking ", r.plain.held_out_loss);
  CHECK(streaming.held_out_loss <= 1.01 * r.plain.held_out_loss);
  CHECK(delayed.held_out_loss <= 1.05 * r.plain.held_out_loss);
  // Every fragment once per round; the delayed rounds all applied (the last
  // by finish()).
  CHECK(streaming.rounds == static_cast<std::uint64_t>(c.fragments * (c.steps / c.inner_steps)));
  CHECK(delayed.rounds == static_cast<std::uint64_t>(c.steps / c.inner_steps));
  // Each fragment's exchange carries about a quarter of the model: the
  // same bytes in all as the blocking rounds, within the headers.
  CHECK(static_cast<double>(streaming.bytes_per_worker) ==
        doctest::Approx(static_cast<double>(r.plain.bytes_per_worker)).epsilon(0.02));
  // How much of the exchange was hidden is reported above, not checked here
  // (a timing); test_sync checks the ratio with a deliberately slow link.
}

TEST_CASE("eager updates at half the outer lr: within 6% of blocking DiLoCo at the default") {
  // Measured (seed 1): outer lr 0.7 diverges (7.34, docs/algorithms.md
  // section 4); at 0.35 eager reaches 2.1272 against 2.0204 for blocking at
  // 0.7 (x1.053) and 2.0445 at 0.35. The former reading of the rule (the
  // replica stepped from theta_global) reached 3.26 here.
  const auto& r = fortunes_runs();
  REQUIRE(r.data.fallback.empty());
  auto c = r.c;
  c.outer_lr = 0.35f;
  namespace cp = diloco::compress;
  namespace sy = diloco::sync;
  const auto eager = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::none, std::remove_reference_t<decltype(comm)>, sy::eager>(c, r.data, comm, "eager");
  });
  MESSAGE("eager (outer lr 0.35) ", eager.held_out_loss, ", blocking (0.7) ", r.plain.held_out_loss);
  CHECK(eager.held_out_loss <= 1.06 * r.plain.held_out_loss);
  CHECK(eager.rounds == static_cast<std::uint64_t>(c.steps / c.inner_steps));
}

TEST_CASE("the synthetic corpus on the demo's former defaults: DiLoCo within 5% of data parallel") {
  char_mlp::config c;
  c.synthetic = true;
  c.corpus_chars = 400000;
  c.steps = 2000;
  c.batch = 256;
  c.inner_steps = 50;
  c.lr = 3e-3f;
  c.dims.context = 8;
  c.eval_windows = 4096;
  c.log_every = 0;
  const auto data = char_mlp::load_dataset(c);
  REQUIRE(data.fallback.empty());
  CHECK(data.source == "built-in synthetic");
  c.dims.vocab = data.vocab();
  const auto ddp =
      char_mlp::on_threads(c.workers, [&](auto& comm) { return char_mlp::run_data_parallel(c, data, comm); });
  const auto dl = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<diloco::compress::none>(c, data, comm, "diloco");
  });
  MESSAGE("synthetic: data parallel ", ddp.held_out_loss, ", diloco ", dl.held_out_loss);
  // Measured 0.267 and 0.269 against log(26) = 3.26.
  CHECK(ddp.held_out_loss < 0.5 * std::log(static_cast<double>(data.vocab())));
  CHECK(dl.held_out_loss <= 1.05 * ddp.held_out_loss);
  CHECK(dl.rounds == static_cast<std::uint64_t>(c.steps / c.inner_steps));
}

TEST_CASE("the single worker has one worker's compute (batch / M, worker 0's samples), not data parallel's") {
  // Small settings on the synthetic corpus: what is checked is which samples
  // each method trains on, not how well.
  char_mlp::config c;
  c.synthetic = true;
  c.corpus_chars = 100000;
  c.steps = 40;
  c.batch = 64;
  c.workers = 4;
  c.dims.hidden = 16;
  c.eval_windows = 2048;
  c.log_every = 0;
  const auto data = char_mlp::load_dataset(c);
  REQUIRE(data.fallback.empty());
  c.dims.vocab = data.vocab();
  auto ddp_of = [&](const char_mlp::config& cc) {
    return char_mlp::on_threads(cc.workers, [&](auto& comm) { return char_mlp::run_data_parallel(cc, data, comm); });
  };
  const auto alone = char_mlp::run_single(c, data);
  const auto ddp = ddp_of(c);
  MESSAGE("single worker ", alone.held_out_loss, ", data parallel ", ddp.held_out_loss);
  // The label documents the batch: 64 / 4 = 16 samples a step.
  CHECK(alone.method == "single worker (batch 16)");
  CHECK(alone.bytes_per_worker == 0);
  CHECK(alone.rounds == 0);
  // A quarter of the samples a step: not data parallel's update. The former
  // row took the whole batch and printed data parallel's loss (3.0825 both
  // here; they differed only by the order of the gradient sums, about 1e-7);
  // a different sample set moves it by far more than 0.1% (3.1602 here).
  CHECK(std::abs(alone.held_out_loss - ddp.held_out_loss) > 1e-3 * ddp.held_out_loss);
  // With one worker, "the same per-worker compute" is the whole batch, and
  // then the row is data parallel over one worker, bit for bit: worker 0's
  // share is the batch, and a mean over one worker changes nothing.
  auto one = c;
  one.workers = 1;
  const auto alone1 = char_mlp::run_single(one, data);
  CHECK(alone1.method == "single worker (batch 64)");
  CHECK(alone1.held_out_loss == ddp_of(one).held_out_loss);
}

TEST_CASE("the demo model's AVX2 copy of its loops gives the baseline copy's bits") {
  // Two models from one seed, trained five SGD steps on the same random
  // batch, one through forward() (the AVX2 copy where the CPU has AVX2), one
  // through forward_baseline(): every loss and every gradient must be
  // bitwise equal (the two copies do the same IEEE operations in the same
  // order; no FMA).
  if (!diloco::kernels::host_simd::enabled()) {
    MESSAGE("no AVX2 here (or DILOCO_HOST_SIMD=0): forward() runs the baseline copy itself");
    return;
  }
  const char_mlp::shape dims{.vocab = 97, .context = 5, .embed = 16, .hidden = 96};
  char_mlp::model wide(dims, 7), base(dims, 7);
  std::mt19937 rng(3);
  const int batch = 67;  // not a multiple of the vector width
  std::vector<std::uint8_t> contexts(static_cast<std::size_t>(batch * dims.context)), targets(batch);
  for (auto& x : contexts) x = static_cast<std::uint8_t>(rng() % 97);
  for (auto& x : targets) x = static_cast<std::uint8_t>(rng() % 97);
  auto sgd = [](char_mlp::model& m) {
    auto& p = m.parameters();
    for (std::size_t k = 0; k < p.size(); ++k)
      for (std::size_t i = 0; i < p[k].size(); ++i) p[k][i] -= 0.5f * m.gradients()[k][i];
  };
  for (int step = 0; step < 5; ++step) {
    const double lw = wide.forward(contexts.data(), targets.data(), batch, true);
    const double lb = base.forward_baseline(contexts.data(), targets.data(), batch, true);
    CHECK(std::memcmp(&lw, &lb, sizeof lw) == 0);
    const auto gw = wide.flat_gradients(), gb = base.flat_gradients();
    REQUIRE(gw.size() == gb.size());
    CHECK(std::memcmp(gw.data(), gb.data(), gw.size_bytes()) == 0);
    sgd(wide);
    sgd(base);
  }
  const double lw = wide.forward(contexts.data(), targets.data(), batch, false);
  const double lb = base.forward_baseline(contexts.data(), targets.data(), batch, false);
  CHECK(std::memcmp(&lw, &lb, sizeof lw) == 0);
  CHECK(lw < std::log(97.0));  // the steps learned something: below the uniform model's loss
}

TEST_CASE("fortune files: separators, overstrikes, tabs and stray bytes are cleaned") {
  CHECK(char_mlp::clean_fortune_text("one\ttwo\n%\n_\bU_\bn_\bd_\be_\br\x01lined caf\xc3\xa9\n%\nlast") ==
        "one two\n\nUnderlined caf\n\nlast");
  CHECK(char_mlp::clean_fortune_text("%\n50% off\n") == "\n50% off\n");
}

TEST_CASE("fortune files: every topic file gives its tail to the held-out text; indexes and links are skipped") {
  const temp_dir dir("diloco_test_demo_fortunes");
  std::string a, b;
  for (int i = 0; i < 2000; ++i) a += "alpha line " + std::to_string(i) + "\n%\n";
  for (int i = 0; i < 1000; ++i) b += "BETA LINE " + std::to_string(i) + "\n%\n";
  dir.write("a", a);
  dir.write("b", b);
  dir.write("a.dat", std::string(200000, 'Q'));  // an index: skipped
  std::filesystem::create_directories(dir.path / "off");
  dir.write("off/c", std::string(200000, 'Z'));  // not read
  std::filesystem::create_symlink(dir.path / "a", dir.path / "a.u8");
  const auto d = char_mlp::fortunes_dataset(dir.path.string());
  REQUIRE(d.fallback.empty());
  CHECK(d.source.find("2 topic files") != std::string::npos);
  auto text = [&](const std::vector<std::uint8_t>& ids) {
    std::string s;
    for (const auto id : ids) s += d.alphabet[id];
    return s;
  };
  const std::string train = text(d.train), held_out = text(d.held_out);
  // Both files in both halves, split at a line start, about 10% held out.
  CHECK(train.find("alpha line 0\n") == 0);
  CHECK(train.find("BETA LINE 0\n") != std::string::npos);
  CHECK(held_out.find("alpha line 1999\n") != std::string::npos);
  CHECK(held_out.find("BETA LINE 999\n") != std::string::npos);
  CHECK(held_out.find("alpha line 1700\n") == std::string::npos);
  CHECK(train.find("alpha line 1999\n") == std::string::npos);
  CHECK(train.size() + held_out.size() ==
        char_mlp::clean_fortune_text(a).size() + char_mlp::clean_fortune_text(b).size());
  const double fraction = static_cast<double>(held_out.size()) / static_cast<double>(train.size() + held_out.size());
  CHECK(fraction > 0.09);
  CHECK(fraction < 0.11);
  CHECK(train.find('Z') == std::string::npos);
  CHECK(train.find('Q') == std::string::npos);
  CHECK(train.find('%') == std::string::npos);
}

TEST_CASE("without the fortunes the demo falls back to the synthetic corpus and says why") {
  char_mlp::config c;
  c.fortunes_dir = "/nonexistent/diloco-fortunes";
  const auto d = char_mlp::load_dataset(c);
  CHECK(d.fallback.find("/nonexistent/diloco-fortunes not found") != std::string::npos);
  CHECK(d.source.find("synthetic") != std::string::npos);
  CHECK(d.train.size() == c.corpus_chars);

  const temp_dir empty("diloco_test_demo_no_fortunes");
  c.fortunes_dir = empty.path.string();
  CHECK(char_mlp::load_dataset(c).fallback.find("too little text") != std::string::npos);
}
