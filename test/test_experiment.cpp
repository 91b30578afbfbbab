// SPDX-License-Identifier: Apache-2.0
// diloco::experiment: variants chosen at compile time run on one problem
// with the same data and seeds. Two variants that must give the same bits
// (the blocking schedule and streaming with P = 1, tau = 0, alpha = 0) give
// equal rows, timings aside; the baselines follow their definitions
// (written out here with plain loops); the CSV and JSON read back.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <diloco/diloco.hpp>
#include <diloco/experiment.hpp>
#include <sstream>
#include <span>
#include <string>
#include <vector>

namespace dx = diloco::experiment;

namespace {

constexpr std::size_t features = 5;
constexpr int batch = 8;  // samples per worker per step
constexpr int held_out = 256;

double unit(std::uint64_t x) {  // SplitMix64 to [-1, 1)
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

// Sample `id` of the problem: x, and y = x . w* + 0.5 + noise.
void sample(std::uint64_t seed, std::uint64_t id, double* x, double& y) {
  y = 0.5;
  for (std::size_t j = 0; j < features; ++j) {
    x[j] = unit(seed * 1000003 + id * 64 + j);
    y += x[j] * (static_cast<double>(j) - 2.0);
  }
  y += 0.1 * unit(seed * 1000003 + id * 64 + 63);
}

// Linear regression, two tensors (weights and bias), mean squared error / 2.
struct regression {
  std::uint64_t seed;
  int rank, size;
  std::vector<float> w = std::vector<float>(features, 0.0f), b = std::vector<float>(1, 0.0f);
  std::vector<float> gw = std::vector<float>(features), gb = std::vector<float>(1);
  std::vector<std::span<float>> params{w, b};
  std::vector<std::span<const float>> grads{gw, gb};

  std::vector<std::span<float>>& parameters() { return params; }
  const std::vector<std::span<const float>>& gradients() const { return grads; }

  // The gradient at (w, b) of worker `r`'s samples of step `step`.
  static double gradient(std::uint64_t seed, int r, int workers, std::uint64_t step, const std::vector<float>& w,
                         float b, std::vector<double>& gw, double& gb) {
    gw.assign(features, 0.0);
    gb = 0.0;
    double loss = 0.0, x[features], y;
    for (int i = 0; i < batch; ++i) {
      sample(seed, (step * static_cast<std::uint64_t>(workers) + static_cast<std::uint64_t>(r)) * batch + i, x, y);
      double err = b - y;
      for (std::size_t j = 0; j < features; ++j) err += w[j] * x[j];
      loss += 0.5 * err * err / batch;
      for (std::size_t j = 0; j < features; ++j) gw[j] += err * x[j] / batch;
      gb += err / batch;
    }
    return loss;
  }
  static double held_out_loss(std::uint64_t seed, const std::vector<float>& w, float b) {
    double loss = 0.0, x[features], y;
    for (int i = 0; i < held_out; ++i) {
      sample(seed + 77, static_cast<std::uint64_t>(i), x, y);
      double err = b - y;
      for (std::size_t j = 0; j < features; ++j) err += w[j] * x[j];
      loss += 0.5 * err * err / held_out;
    }
    return loss;
  }

  double train(std::uint64_t step) {
    std::vector<double> g;
    double g_b;
    const double loss = gradient(seed, rank, size, step, w, b[0], g, g_b);
    for (std::size_t j = 0; j < features; ++j) gw[j] = static_cast<float>(g[j]);
    gb[0] = static_cast<float>(g_b);
    return loss;
  }
  double evaluate() const { return held_out_loss(seed, w, b[0]); }
};

auto problem = [](const dx::worker& w) { return regression{w.seed, w.rank, w.size}; };

constexpr float inner_lr = 0.05f;
using sgd = diloco::inner::sgd;
using blocking = dx::variant<sgd>;
using streaming = dx::variant<sgd, diloco::outer::nesterov, diloco::compress::none, diloco::sync::streaming>;

// SGD without momentum everywhere; streaming as blocking (P = 1, tau = 0, alpha = 0).
auto configure = [](auto& o, std::string_view) {
  o.inner = {.lr = inner_lr};
  if constexpr (requires { o.sync.fragments; }) o.sync = {.fragments = 1, .delay = 0, .alpha = 0.0f};
};

dx::settings small_settings() {
  return {.steps = 40, .inner_steps = 10, .eval_every = 10, .seed = 3, .tags = {{"shards", "iid"}, {"note", "a,b"}}};
}

// Bytes one rank sends, as comm::threads accounts them (core/comm_types.hpp
// documents the model; written out here, not taken from the library): a
// ring all-reduce of B bytes over M ranks sends 2(M - 1)B/M (integer
// division, per collective); a chain broadcast root -> root+1 -> ... has
// every rank but the last forward the buffer once, so the root (rank 0,
// M > 1) sends B.
std::uint64_t ring_bytes(std::size_t bytes, int m) {
  const auto mm = static_cast<std::uint64_t>(m);
  return m > 1 ? 2 * (mm - 1) * bytes / mm : 0;
}
std::uint64_t chain_sent_by_root(std::size_t bytes, int m) { return m > 1 ? bytes : 0; }

// A minimal CSV reader (RFC 4180 quoting), independent of the writer.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(field);
      field.clear();
    } else if (c == '\n') {
      fields.push_back(field);
      field.clear();
      out.push_back(fields);
      fields.clear();
    } else {
      field += c;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("blocking and streaming with P = 1, tau = 0, alpha = 0 give equal rows") {
  using list = dx::variants<blocking, streaming>;
  const auto rows = dx::run<list>(problem, dx::on_threads{3}, small_settings(), configure);
  REQUIRE(rows.size() == 2);
  const auto& a = rows[0];
  const auto& b = rows[1];
  CHECK(a.variant == "diloco inner sgd");
  CHECK(b.variant == "diloco streaming inner sgd");
  CHECK(a.sync == "blocking");
  CHECK(b.sync == "streaming");
  CHECK(a.rounds == 4);  // 40 steps, H = 10
  CHECK(a.inner_steps == 10);
  REQUIRE(a.curve.size() == 4);  // steps 10, 20, 30 and the final 40
  CHECK(a.curve.back().step == 40);
  CHECK(a.curve.back().held_out_loss < 0.5 * a.curve.front().held_out_loss);  // it learns
  // Equal results, field by field (timings excluded).
  CHECK(a.final_loss == b.final_loss);
  CHECK(a.final_train_loss == b.final_train_loss);
  CHECK(a.bytes_sent == b.bytes_sent);
  CHECK(a.rounds == b.rounds);
  for (std::size_t i = 0; i < a.curve.size(); ++i) {
    CHECK(a.curve[i].step == b.curve[i].step);
    CHECK(a.curve[i].train_loss == b.curve[i].train_loss);
    CHECK(a.curve[i].held_out_loss == b.curve[i].held_out_loss);
  }
  CHECK(dx::same_results(a, b));
  CHECK(a.bytes_sent > 0);
  // Worker 0's bytes, as comm::threads counts them (core/comm_types.hpp):
  // the initial broadcast of each tensor from rank 0, then per round one
  // all-reduce of the 6 pseudo-gradient values plus one norm slot per rank
  // (reduce/fp32_mean.hpp: M slots behind the values).
  const int m = 3;
  const std::uint64_t per_round = ring_bytes((features + 1 + static_cast<std::size_t>(m)) * sizeof(float), m);
  const std::uint64_t broadcast = chain_sent_by_root(features * sizeof(float), m) + chain_sent_by_root(sizeof(float), m);
  CHECK(a.bytes_sent == broadcast + a.rounds * per_round);
  CHECK(a.bytes_sent == 6 * 4 + 4 * (2 * 2 * 9 * 4 / 3));  // the same, written out: 24 + 4 x 48
}

TEST_CASE("the baselines follow their definitions") {
  using list = dx::variants<dx::data_parallel<sgd>, dx::single_worker<sgd>>;
  const auto s = small_settings();
  const int workers = 2;
  const auto rows = dx::run<list>(problem, dx::on_threads{workers}, s, configure);
  REQUIRE(rows.size() == 2);

  // Plain SGD on the mean gradient of both workers' samples, and on worker 0's alone.
  auto reference = [&](int contributors) {
    std::vector<float> w(features, 0.0f);
    float b = 0.0f;
    std::vector<double> gw, sum_w(features);
    double gb, sum_b;
    for (std::uint64_t step = 0; step < s.steps; ++step) {
      sum_w.assign(features, 0.0);
      sum_b = 0.0;
      for (int r = 0; r < contributors; ++r) {
        regression::gradient(s.seed, r, workers, step, w, b, gw, gb);
        for (std::size_t j = 0; j < features; ++j) sum_w[j] += static_cast<float>(gw[j]);
        sum_b += static_cast<float>(gb);
      }
      for (std::size_t j = 0; j < features; ++j) w[j] -= inner_lr * static_cast<float>(sum_w[j] / contributors);
      b -= inner_lr * static_cast<float>(sum_b / contributors);
    }
    return regression::held_out_loss(s.seed, w, b);
  };
  const auto& ddp = rows[0];
  const auto& alone = rows[1];
  CHECK(ddp.kind == "data_parallel");
  CHECK(ddp.final_loss == doctest::Approx(reference(workers)).epsilon(1e-5));
  CHECK(ddp.rounds == s.steps);
  // One all-reduce of 6 floats per step, as comm::threads accounts it.
  CHECK(ddp.bytes_sent > 0);
  CHECK(ddp.bytes_sent == s.steps * ring_bytes((features + 1) * sizeof(float), workers));
  CHECK(ddp.bytes_sent == 40 * (2 * 1 * 24 / 2));  // the same, written out: 24 bytes a step
  CHECK(alone.kind == "single_worker");
  CHECK(alone.final_loss == doctest::Approx(reference(1)).epsilon(1e-5));
  CHECK(alone.bytes_sent == 0);
  CHECK(alone.rounds == 0);
  CHECK(alone.workers == workers);  // the world whose worker 0 it mirrors
}

TEST_CASE("outer_of_t names a variant's outer optimizer: outer SGD configured through it is local SGD's averaging") {
  using avg = dx::variant<sgd, diloco::outer::sgd>;
  static_assert(std::is_same_v<dx::outer_of_t<avg::options>, diloco::outer::sgd>);
  static_assert(std::is_same_v<dx::outer_of_t<blocking::options>, diloco::outer::nesterov>);
  static_assert(std::is_void_v<dx::outer_of_t<dx::data_parallel<sgd>::options>>);
  constexpr float outer_lr = 0.5f;
  auto by_outer = [](auto& o, std::string_view) {
    configure(o, "");
    if constexpr (std::is_same_v<dx::outer_of_t<decltype(o)>, diloco::outer::sgd>) o.outer = {.lr = outer_lr};
  };
  const auto s = small_settings();
  const int workers = 2;
  const auto rows = dx::run<dx::variants<avg>>(problem, dx::on_threads{workers}, s, by_outer);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].outer == "outer sgd");
  // Written out: every round each worker takes H plain SGD steps from
  // theta_global on its own samples; theta_global moves outer_lr of the way
  // to the workers' mean.
  std::vector<float> w(features, 0.0f);
  float b = 0.0f;
  std::vector<double> gw;
  double gb;
  for (std::uint64_t round = 0; round < s.steps / s.inner_steps; ++round) {
    std::vector<double> mean_w(features, 0.0);
    double mean_b = 0.0;
    for (int r = 0; r < workers; ++r) {
      auto wr = w;
      float br = b;
      for (std::uint64_t k = 0; k < s.inner_steps; ++k) {
        regression::gradient(s.seed, r, workers, round * s.inner_steps + k, wr, br, gw, gb);
        for (std::size_t j = 0; j < features; ++j) wr[j] -= inner_lr * static_cast<float>(gw[j]);
        br -= inner_lr * static_cast<float>(gb);
      }
      for (std::size_t j = 0; j < features; ++j) mean_w[j] += wr[j] / static_cast<double>(workers);
      mean_b += br / static_cast<double>(workers);
    }
    for (std::size_t j = 0; j < features; ++j) w[j] -= outer_lr * static_cast<float>(w[j] - mean_w[j]);
    b -= outer_lr * static_cast<float>(b - mean_b);
  }
  CHECK(rows[0].final_loss == doctest::Approx(regression::held_out_loss(s.seed, w, b)).epsilon(1e-5));
}

TEST_CASE("grid and named spell variant lists") {
  namespace cp = diloco::compress;
  using g = dx::grid<dx::list<sgd>, dx::list<diloco::outer::nesterov, diloco::outer::sgd>,
                     dx::list<cp::none, cp::cast<diloco::bf16>>, dx::list<diloco::sync::blocking>>;
  static_assert(g::size == 4);
  static_assert(std::is_same_v<g, dx::variants<dx::variant<sgd, diloco::outer::nesterov, cp::none>,
                                               dx::variant<sgd, diloco::outer::nesterov, cp::cast<diloco::bf16>>,
                                               dx::variant<sgd, diloco::outer::sgd, cp::none>,
                                               dx::variant<sgd, diloco::outer::sgd, cp::cast<diloco::bf16>>>>);
  static_assert(dx::join<g, dx::variants<dx::data_parallel<>>>::size == 5);
  CHECK(dx::named<"mine", blocking>::name() == "mine");
  CHECK(dx::variant<diloco::inner::adamw, diloco::outer::nesterov,
                    cp::error_feedback<cp::blockwise<diloco::int4>>>::name() == "diloco+blockwise int4+ef");
}

TEST_CASE("the CSV and JSON reports read back") {
  using list = dx::variants<blocking, dx::data_parallel<sgd>>;
  auto rows = dx::run<list>(problem, dx::on_threads{2}, small_settings(), configure);
  REQUIRE(rows.size() == 2);

  SUBCASE("CSV") {
    std::ostringstream out;
    dx::write_csv(out, rows);
    const auto table = parse_csv(out.str());
    REQUIRE(table.size() == 3);
    const auto& head = table[0];
    auto column = [&](const std::string& name) {
      const auto it = std::find(head.begin(), head.end(), name);
      REQUIRE(it != head.end());
      return static_cast<std::size_t>(it - head.begin());
    };
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& line = table[i + 1];
      REQUIRE(line.size() == head.size());
      CHECK(line[column("variant")] == rows[i].variant);
      CHECK(line[column("shards")] == "iid");
      CHECK(line[column("note")] == "a,b");  // quoted, comma kept
      CHECK(line[column("compressor")] == rows[i].compressor);
      CHECK(std::stoi(line[column("workers")]) == rows[i].workers);
      CHECK(std::stoull(line[column("bytes_sent")]) == rows[i].bytes_sent);
      CHECK(std::stoull(line[column("rounds")]) == rows[i].rounds);
      CHECK(std::strtod(line[column("final_loss")].c_str(), nullptr) == rows[i].final_loss);  // exactly
      CHECK(std::strtod(line[column("seconds")].c_str(), nullptr) == rows[i].seconds);
    }
    std::ostringstream curves;
    dx::write_curves_csv(curves, rows);
    const auto points = parse_csv(curves.str());
    REQUIRE(points.size() == 1 + rows[0].curve.size() + rows[1].curve.size());
    CHECK(points[1][0] == rows[0].variant);
    CHECK(std::stoull(points[1][5]) == rows[0].curve[0].step);
    CHECK(std::strtod(points[1][7].c_str(), nullptr) == rows[0].curve[0].held_out_loss);
  }

  SUBCASE("JSON") {
    rows[1].curve[0].train_loss = std::nan("");  // written as null, read back as NaN
    std::ostringstream out;
    dx::write_json(out, rows);
    const auto j = nlohmann::json::parse(out.str());
    REQUIRE(j.at("rows").size() == 2);
    CHECK(j["rows"][0]["variant"] == rows[0].variant);
    CHECK(j["rows"][1]["curve"][0]["train_loss"].is_null());
    CHECK(j["rows"][0]["tags"][1][1] == "a,b");
    const auto back = j.at("rows").get<std::vector<dx::row>>();
    REQUIRE(back.size() == rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      CHECK(back[i].variant == rows[i].variant);
      CHECK(back[i].kind == rows[i].kind);
      CHECK(back[i].compressor == rows[i].compressor);
      CHECK(back[i].tags == rows[i].tags);
      CHECK(back[i].seconds == rows[i].seconds);
      CHECK(back[i].blocked_seconds == rows[i].blocked_seconds);
      CHECK(back[i].inner_steps == rows[i].inner_steps);
      if (i == 0) CHECK(dx::same_results(back[i], rows[i]));
    }
    CHECK(std::isnan(back[1].curve[0].train_loss));
    CHECK(back[1].curve[1].held_out_loss == rows[1].curve[1].held_out_loss);
  }
}

TEST_CASE("a problem of zero steps is refused") {
  CHECK_THROWS_AS(dx::run<dx::variants<blocking>>(problem, dx::on_threads{1}, {.steps = 0}), diloco::config_error);
}
