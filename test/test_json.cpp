// SPDX-License-Identifier: Apache-2.0
// diloco::json (core/json.hpp): stats(), options and events as JSON, each
// checked against the fields listed here by hand from the structs'
// declarations, so a field added without its JSON fails here.

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "diloco/core/json.hpp"
#include "diloco/diloco.hpp"

namespace dc = diloco;
using nlohmann::json;

namespace {

std::set<std::string> keys(const json& j) {
  std::set<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out.insert(it.key());
  return out;
}

}  // namespace

TEST_CASE("stats as JSON: every field of diloco::stats by name, with its value") {
  dc::stats s;
  // Distinct values, each exactly representable, so each key is tied to its field.
  s.inner_steps = 1;
  s.rounds = 2;
  s.rejected_rounds = 3;
  s.bytes_sent = 4;
  s.setup_bytes = 5;
  s.bytes_received = 6;
  s.last_round_bytes_sent = 7;
  s.last_round_bytes_received = 8;
  s.pseudo_gradient_norm = 9.5;
  s.compression_error_norm = 10.5;
  s.encoded_bytes_per_parameter = 11.5;
  s.wire_bytes_per_parameter = 12.5;
  s.comm_seconds = 13.5;
  s.last_round_comm_seconds = 14.5;
  s.outer_seconds = 15.5;
  s.blocked_seconds = 16.5;
  s.last_round_blocked_seconds = 17.5;
  s.hidden_seconds = 18.5;
  s.last_round_hidden_seconds = 19.5;
  s.fragment_bytes_sent = {20, 21};
  s.workers = 22;
  s.membership_changes = 23;
  s.aborted_rounds = 24;
  s.compression_choices = {{.used = 1, .next = 2, .next_name = "int4", .reason = "within budget", .link_seconds = 0.25,
                            .relative_error = std::nan(""), .budget_seconds = 0.5, .predicted_seconds = 0.125}};
  const json want = {{"inner_steps", 1},
                     {"rounds", 2},
                     {"rejected_rounds", 3},
                     {"bytes_sent", 4},
                     {"setup_bytes", 5},
                     {"bytes_received", 6},
                     {"last_round_bytes_sent", 7},
                     {"last_round_bytes_received", 8},
                     {"pseudo_gradient_norm", 9.5},
                     {"compression_error_norm", 10.5},
                     {"encoded_bytes_per_parameter", 11.5},
                     {"wire_bytes_per_parameter", 12.5},
                     {"comm_seconds", 13.5},
                     {"last_round_comm_seconds", 14.5},
                     {"outer_seconds", 15.5},
                     {"blocked_seconds", 16.5},
                     {"last_round_blocked_seconds", 17.5},
                     {"hidden_seconds", 18.5},
                     {"last_round_hidden_seconds", 19.5},
                     {"fragment_bytes_sent", {20, 21}},
                     {"workers", 22},
                     {"membership_changes", 23},
                     {"aborted_rounds", 24},
                     {"compression_choices",
                      {{{"used", 1},
                        {"next", 2},
                        {"next_name", "int4"},
                        {"reason", "within budget"},
                        {"link_seconds", 0.25},
                        {"relative_error", nullptr},  // NaN: JSON has none
                        {"budget_seconds", 0.5},
                        {"predicted_seconds", 0.125}}}}};
  const json got = s;
  CHECK(got == want);
  CHECK(json::parse(got.dump()) == want);
}

TEST_CASE("options as JSON: every option of algorithm_options, nested by policy, reading back the same values") {
  using opts_t = dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov,
                                       dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 64>>,
                                       dc::sync::streaming>;
  const opts_t o{.inner_steps = 12,
                 .inner = {.lr = 0.25f, .beta2 = 0.5f, .max_grad_norm = 2.0f},
                 .outer = {.lr = 0.5f, .momentum = 0.75f},
                 .compress = {.seed = 77},
                 .sync = {.fragments = 3, .delay = 2, .alpha = 0.125f, .assignment = dc::sync::fragment_assignment::strided},
                 .broadcast_initial = false,
                 .host_threads = -3,
                 .on_event = [](const dc::event&) {}};
  // The structs' fields, by hand (inner/adamw.hpp, outer/nesterov.hpp,
  // compress/blockwise.hpp, sync/streaming.hpp, engine.hpp); the defaults
  // of those not set above are the floats 0.9f, 1e-8f, 0.1f, written as
  // their shortest decimals.
  const json want = {{"inner_steps", 12},
                     {"inner",
                      {{"lr", 0.25},
                       {"beta1", 0.9},
                       {"beta2", 0.5},
                       {"eps", 1e-8},
                       {"weight_decay", 0.1},
                       {"max_grad_norm", 2.0}}},
                     {"outer", {{"lr", 0.5}, {"momentum", 0.75}}},
                     {"compress", {{"seed", 77}}},
                     {"sync", {{"fragments", 3}, {"delay", 2}, {"alpha", 0.125}, {"assignment", "strided"}}},
                     {"broadcast_initial", false},
                     {"host_threads", -3}};
  const json got = dc::options_json(o);
  CHECK(got == want);
  // Through text and back: the same object, and each float option reads
  // back as the float it was.
  const json back = json::parse(got.dump());
  CHECK(back == want);
  CHECK(back["inner"]["beta1"].get<float>() == o.inner.beta1);
  CHECK(back["inner"]["eps"].get<float>() == o.inner.eps);
  CHECK(back["inner"]["weight_decay"].get<float>() == o.inner.weight_decay);
  CHECK(back["host_threads"].get<int>() == o.host_threads);
  CHECK(back["inner_steps"].get<std::size_t>() == o.inner_steps);
  // The text a user reads names the float as written.
  CHECK(got.dump().find("\"weight_decay\":0.1}") != std::string::npos);
  // A double option that is no float keeps its digits (adaptive's rule).
  dc::compress::adaptive_settings rule{};
  rule.budget_share = 0.1;
  CHECK(dc::options_json(rule)["budget_share"].get<double>() == 0.1);
  rule.error_bound = std::numeric_limits<double>::quiet_NaN();
  CHECK(dc::options_json(rule)["error_bound"].is_null());
  // A policy's own options, alone.
  CHECK(dc::options_json(dc::compress::topk_options{.fraction = 0.5f}) == json{{"fraction", 0.5}});
}

TEST_CASE("options as JSON nest as deep as the names: adaptive's rungs and rule") {
  using ef8 = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 64>>;
  using ef4 = dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 64>>;
  using opts_t = dc::algorithm_options<dc::inner::sgd, dc::outer::sgd, dc::compress::adaptive<ef8, ef4>>;
  opts_t o{};
  o.compress.rule.window = 5;
  const json got = dc::options_json(o);
  REQUIRE(got.contains("compress"));
  const json& c = got["compress"];
  CHECK(keys(c) == std::set<std::string>{"rung0", "rung1", "rule"});
  CHECK(keys(c["rung0"]) == std::set<std::string>{"seed"});
  CHECK(keys(c["rule"]) ==
        std::set<std::string>{"budget_seconds", "budget_share", "error_bound", "window", "retry_after", "start"});
  CHECK(c["rule"]["window"] == 5);
  CHECK(c["rule"]["error_bound"] == 0.5);
}

TEST_CASE("events as JSON lines: the fields each kind fills") {
  dc::event r;
  r.kind = dc::event_kind::round;
  r.rank = 1;
  r.world = 4;
  r.inner_step = 30;
  r.round = 3;
  r.fragment = 1;
  r.fragment_round = 2;
  r.bytes_sent = 96;
  r.bytes_received = 96;
  r.pseudo_gradient_norm = 0.5;
  r.blocked_seconds = 0.25;
  const std::string line = dc::event_json_line(r);
  CHECK(line.find('\n') == std::string::npos);
  const json j = json::parse(line);
  CHECK(j == json{{"event", "round"},
                  {"rank", 1},
                  {"world", 4},
                  {"inner_step", 30},
                  {"round", 3},
                  {"fragment", 1},
                  {"fragment_round", 2},
                  {"bytes_sent", 96},
                  {"bytes_received", 96},
                  {"pseudo_gradient_norm", 0.5},
                  {"compression_error_norm", 0.0},
                  {"blocked_seconds", 0.25},
                  {"hidden_seconds", 0.0}});

  dc::event x = r;
  x.kind = dc::event_kind::rejected;
  x.pseudo_gradient_norm = std::numeric_limits<double>::infinity();
  x.problem = "non-finite pseudo-gradient from rank 1";
  const json jx = json::parse(dc::event_json_line(x));
  CHECK(jx["event"] == "rejected");
  CHECK(jx["pseudo_gradient_norm"].is_null());
  CHECK(jx["problem"] == x.problem);
  CHECK(jx["corrupt"] == false);

  dc::event m;
  m.kind = dc::event_kind::membership;
  m.rank = 0;
  m.world = 3;
  m.generation = 2;
  m.previous_rank = 0;
  m.previous_world = 2;
  m.joined = {2};
  CHECK(json::parse(dc::event_json_line(m)) == json{{"event", "membership"},
                                                   {"rank", 0},
                                                   {"world", 3},
                                                   {"inner_step", 0},
                                                   {"generation", 2},
                                                   {"previous_rank", 0},
                                                   {"previous_world", 2},
                                                   {"left", json::array()},
                                                   {"joined", {2}},
                                                   {"after_failure", false}});

  dc::event a;
  a.kind = dc::event_kind::aborted;
  a.round = 5;
  a.problem = "peer died";
  CHECK(keys(json(a)) == std::set<std::string>{"event", "rank", "world", "inner_step", "round", "problem"});
}

TEST_CASE("a hook writing JSON lines from a real run: one parseable line per round") {
  std::vector<std::string> lines;
  dc::comm::local comm;
  std::vector<float> x(3, 1.0f);
  dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::local> t(
      x, comm, {.inner_steps = 2, .on_event = [&lines](const dc::event& e) { lines.push_back(dc::event_json_line(e)); }});
  const std::vector<float> g(3, 1.0f);
  for (int s = 0; s < 6; ++s) t.step(g);
  REQUIRE(lines.size() == 3);
  for (std::size_t r = 0; r < lines.size(); ++r) {
    const json j = json::parse(lines[r]);
    CHECK(j["event"] == "round");
    CHECK(j["round"] == r + 1);
    CHECK(j["bytes_sent"] == 0);  // a world of one sends nothing
  }
}
