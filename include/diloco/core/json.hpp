// SPDX-License-Identifier: Apache-2.0
#pragma once

// JSON for diloco's reports, with nlohmann-json (CMake component `json`,
// target diloco::json; Debian's nlohmann-json3-dev). Not in the umbrella
// header: only code that links diloco::json includes it.
//
// - json_number / number_from_json: doubles as JSON numbers, with NaN and
//   the infinities (which JSON cannot write) as null, read back as NaN.
// - to_json(json&, const stats&): an algorithm's statistics by field name
//   (nlohmann's ADL customisation point, so `nlohmann::json j = t.stats();`
//   works), for logs and dashboards.
// - options_json(o): every option of a policy's options struct or of
//   algorithm_options, by the names visit_options gives them, nested at the
//   dots ({"inner": {"lr": ...}, "outer": {...}, "inner_steps": 500, ...}).
//   The event hook and the device stream are not options of the math and
//   are not listed.
// - to_json(json&, const event&) and event_json_line(e): an event
//   (core/event.hpp) as one JSON object / one line of JSON Lines, with only
//   the fields its kind fills.

#include <nlohmann/json.hpp>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/options.hpp"
#include "diloco/core/stats.hpp"

namespace diloco {

/// `x` as a JSON number, or null when it is NaN or infinite (which JSON cannot write).
inline nlohmann::json json_number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

/// The inverse of json_number: a number, or NaN for null.
inline double number_from_json(const nlohmann::json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

/// compress::adaptive's choice by field name (nlohmann's ADL customisation point).
inline void to_json(nlohmann::json& j, const compression_choice& c) {
  j = {{"used", c.used},
       {"next", c.next},
       {"next_name", c.next_name},
       {"reason", c.reason},
       {"link_seconds", json_number(c.link_seconds)},
       {"relative_error", json_number(c.relative_error)},
       {"budget_seconds", json_number(c.budget_seconds)},
       {"predicted_seconds", json_number(c.predicted_seconds)}};
}

/// An algorithm's statistics by field name, so that `nlohmann::json j = algo.stats();` works.
inline void to_json(nlohmann::json& j, const stats& s) {
  j = {{"inner_steps", s.inner_steps},
       {"rounds", s.rounds},
       {"rejected_rounds", s.rejected_rounds},
       {"bytes_sent", s.bytes_sent},
       {"setup_bytes", s.setup_bytes},
       {"bytes_received", s.bytes_received},
       {"last_round_bytes_sent", s.last_round_bytes_sent},
       {"last_round_bytes_received", s.last_round_bytes_received},
       {"pseudo_gradient_norm", json_number(s.pseudo_gradient_norm)},
       {"compression_error_norm", json_number(s.compression_error_norm)},
       {"encoded_bytes_per_parameter", json_number(s.encoded_bytes_per_parameter)},
       {"wire_bytes_per_parameter", json_number(s.wire_bytes_per_parameter)},
       {"comm_seconds", json_number(s.comm_seconds)},
       {"last_round_comm_seconds", json_number(s.last_round_comm_seconds)},
       {"outer_seconds", json_number(s.outer_seconds)},
       {"blocked_seconds", json_number(s.blocked_seconds)},
       {"last_round_blocked_seconds", json_number(s.last_round_blocked_seconds)},
       {"hidden_seconds", json_number(s.hidden_seconds)},
       {"last_round_hidden_seconds", json_number(s.last_round_hidden_seconds)},
       {"fragment_bytes_sent", s.fragment_bytes_sent},
       {"workers", s.workers},
       {"membership_changes", s.membership_changes},
       {"aborted_rounds", s.aborted_rounds},
       {"compression_choices", s.compression_choices}};
}

/// One option's value as its JSON type: booleans, integers, numbers, text.
/// Most options are floats, held as doubles: a value that is exactly a float
/// is written as the float's shortest decimal (lr 0.1f as 0.1, not
/// 0.10000000149011612), which reads back as the same float; other doubles
/// as nlohmann writes them (the shortest decimal that reads back exactly).
inline void to_json(nlohmann::json& j, const option_value& v) {
  switch (v.type) {
    case option_value::kind::boolean: j = v.bits != 0; return;
    case option_value::kind::signed_integer: j = static_cast<std::int64_t>(v.bits); return;
    case option_value::kind::unsigned_integer: j = v.bits; return;
    case option_value::kind::floating: {
      const double d = std::bit_cast<double>(v.bits);
      const auto f = static_cast<float>(d);
      if (std::isfinite(d) && static_cast<double>(f) == d) {
        char text[32];
        const auto end = std::to_chars(text, text + sizeof text, f).ptr;
        j = std::strtod(std::string(text, end).c_str(), nullptr);
      } else {
        j = json_number(d);
      }
      return;
    }
    case option_value::kind::text: j = v.str; return;
  }
  j = nullptr;
}

/// Every option of `o` by name, nested at the dots of the names
/// visit_options gives ("inner.lr" is j["inner"]["lr"]).
template <class Options>
nlohmann::json options_json(const Options& o) {
  nlohmann::json out = nlohmann::json::object();
  for (const option_field& f : option_fields(o)) {
    nlohmann::json* node = &out;
    std::string_view rest = f.name;
    for (auto dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      node = &(*node)[std::string(rest.substr(0, dot))];
      if (!node->is_object() && !node->is_null())
        detail::raise<config_error>("options_json: option \"", f.name, "\" nests under \"", rest.substr(0, dot),
                                    "\", which is an option itself");
      rest.remove_prefix(dot + 1);
    }
    if (node->contains(rest))
      detail::raise<config_error>("options_json: option \"", f.name, "\" is listed twice or is also a group of options");
    (*node)[std::string(rest)] = f.value;
  }
  return out;
}

/// An event as one JSON object, with only the fields its kind fills.
inline void to_json(nlohmann::json& j, const event& e) {
  j = {{"event", to_string(e.kind)}, {"rank", e.rank}, {"world", e.world}, {"inner_step", e.inner_step}};
  switch (e.kind) {
    case event_kind::round:
    case event_kind::rejected:
      j["round"] = e.round;
      j["fragment"] = e.fragment;
      j["fragment_round"] = e.fragment_round;
      j["bytes_sent"] = e.bytes_sent;
      j["bytes_received"] = e.bytes_received;
      j["pseudo_gradient_norm"] = json_number(e.pseudo_gradient_norm);
      j["compression_error_norm"] = json_number(e.compression_error_norm);
      j["blocked_seconds"] = json_number(e.blocked_seconds);
      j["hidden_seconds"] = json_number(e.hidden_seconds);
      if (e.compression) j["compression"] = *e.compression;
      if (e.kind == event_kind::rejected) {
        j["problem"] = e.problem;
        j["corrupt"] = e.corrupt;
      }
      return;
    case event_kind::aborted:
      j["round"] = e.round;
      j["problem"] = e.problem;
      return;
    case event_kind::membership:
      j["generation"] = e.generation;
      j["previous_rank"] = e.previous_rank;
      j["previous_world"] = e.previous_world;
      j["left"] = e.left;
      j["joined"] = e.joined;
      j["after_failure"] = e.after_failure;
      return;
    case event_kind::warning:
      j["problem"] = e.problem;
      return;
  }
}

/// An event as one line of JSON Lines (no newline inside; the caller adds
/// one): `out << diloco::event_json_line(e) << '\n';` in a hook.
inline std::string event_json_line(const event& e) { return nlohmann::json(e).dump(); }

}  // namespace diloco
