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

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "diloco/core/stats.hpp"

namespace diloco {

inline nlohmann::json json_number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

inline double number_from_json(const nlohmann::json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

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

}  // namespace diloco
