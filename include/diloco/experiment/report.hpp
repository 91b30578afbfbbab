// SPDX-License-Identifier: Apache-2.0
#pragma once

// An experiment's rows as a table (for people), CSV (one line per row, and
// the curves one line per point, for plotting scripts) and JSON (every
// field, curves included; reads back with from_json). The tags of the rows
// become CSV columns (the union of their names, in order of appearance).
// Doubles are written with 17 significant digits, so they read back
// exactly; CSV writes a missing value (NaN) as "nan", JSON as null.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "diloco/core/json.hpp"
#include "diloco/experiment/run.hpp"

namespace diloco::experiment {

namespace detail {

inline std::vector<std::string> tag_names(const std::vector<row>& rows) {
  std::vector<std::string> names;
  for (const auto& r : rows)
    for (const auto& [name, value] : r.tags)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  return names;
}

inline std::string tag_value(const row& r, const std::string& name) {
  for (const auto& [n, v] : r.tags)
    if (n == name) return v;
  return "";
}

// A CSV field: quoted (quotes doubled) when it holds a comma, quote or line break.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

inline std::string number(double x) {
  if (std::isnan(x)) return "nan";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

inline std::string bytes_text(std::uint64_t b) {
  char buf[32];
  if (b >= 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(b) / 1e9);
  else if (b >= 1'000'000)
    std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(b) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f kB", static_cast<double>(b) / 1e3);
  return buf;
}

}  // namespace detail

/// Writes a fixed-width table for people: one line per row, tags last.
inline void write_table(std::FILE* out, const std::vector<row>& rows) {
  std::size_t width = 7;
  for (const auto& r : rows) width = std::max(width, r.variant.size());
  const auto tags = detail::tag_names(rows);
  std::fprintf(out, "%-*s %7s %5s %13s %10s %14s %7s %9s %9s", static_cast<int>(width), "variant", "workers", "H",
               "held-out loss", "train loss", "bytes/worker", "rounds", "seconds", "blocked");
  for (const auto& t : tags) std::fprintf(out, "  %s", t.c_str());
  std::fprintf(out, "\n");
  for (const auto& r : rows) {
    const std::string h = r.inner_steps ? std::to_string(r.inner_steps) : "-";
    std::fprintf(out, "%-*s %7d %5s %13.4f %10.4f %14s %7llu %9.1f %9.2f", static_cast<int>(width),
                 r.variant.c_str(), r.workers, h.c_str(), r.final_loss, r.final_train_loss,
                 detail::bytes_text(r.bytes_sent).c_str(), static_cast<unsigned long long>(r.rounds), r.seconds,
                 r.blocked_seconds);
    for (const auto& t : tags) std::fprintf(out, "  %s", detail::tag_value(r, t).c_str());
    std::fprintf(out, "\n");
  }
}

/// Writes CSV, one line per row: the summary columns (no curve).
inline void write_csv(std::ostream& out, const std::vector<row>& rows) {
  const auto tags = detail::tag_names(rows);
  out << "variant,kind,inner,outer,compressor,sync,workers,inner_steps,steps";
  for (const auto& t : tags) out << ',' << detail::csv_field(t);
  out << ",final_loss,final_train_loss,bytes_sent,rounds,seconds,blocked_seconds,hidden_seconds\n";
  for (const auto& r : rows) {
    out << detail::csv_field(r.variant) << ',' << r.kind << ',' << detail::csv_field(r.inner) << ','
        << detail::csv_field(r.outer) << ',' << detail::csv_field(r.compressor) << ',' << detail::csv_field(r.sync)
        << ',' << r.workers << ',' << r.inner_steps << ',' << r.steps;
    for (const auto& t : tags) out << ',' << detail::csv_field(detail::tag_value(r, t));
    out << ',' << detail::number(r.final_loss) << ',' << detail::number(r.final_train_loss) << ',' << r.bytes_sent
        << ',' << r.rounds << ',' << detail::number(r.seconds) << ',' << detail::number(r.blocked_seconds) << ','
        << detail::number(r.hidden_seconds) << '\n';
  }
}

/// Writes CSV, one line per curve point: the row's identity (variant, workers, H, tags)
/// and the point.
inline void write_curves_csv(std::ostream& out, const std::vector<row>& rows) {
  const auto tags = detail::tag_names(rows);
  out << "variant,workers,inner_steps";
  for (const auto& t : tags) out << ',' << detail::csv_field(t);
  out << ",step,train_loss,held_out_loss\n";
  for (const auto& r : rows)
    for (const auto& p : r.curve) {
      out << detail::csv_field(r.variant) << ',' << r.workers << ',' << r.inner_steps;
      for (const auto& t : tags) out << ',' << detail::csv_field(detail::tag_value(r, t));
      out << ',' << p.step << ',' << detail::number(p.train_loss) << ',' << detail::number(p.held_out_loss) << '\n';
    }
}

///@{
/// nlohmann-json's ADL customisation points: json j = rows; rows = j.get<std::vector<row>>().
inline void to_json(nlohmann::json& j, const curve_point& p) {
  j = {{"step", p.step}, {"train_loss", json_number(p.train_loss)}, {"held_out_loss", json_number(p.held_out_loss)}};
}
inline void from_json(const nlohmann::json& j, curve_point& p) {
  p.step = j.at("step").get<std::uint64_t>();
  p.train_loss = number_from_json(j.at("train_loss"));
  p.held_out_loss = number_from_json(j.at("held_out_loss"));
}

inline void to_json(nlohmann::json& j, const row& r) {
  j = {{"variant", r.variant},
       {"kind", r.kind},
       {"inner", r.inner},
       {"outer", r.outer},
       {"compressor", r.compressor},
       {"sync", r.sync},
       {"workers", r.workers},
       {"inner_steps", r.inner_steps},
       {"steps", r.steps},
       {"tags", r.tags},  // [[name, value], ...]: in order
       {"final_loss", json_number(r.final_loss)},
       {"final_train_loss", json_number(r.final_train_loss)},
       {"bytes_sent", r.bytes_sent},
       {"rounds", r.rounds},
       {"seconds", json_number(r.seconds)},
       {"blocked_seconds", json_number(r.blocked_seconds)},
       {"hidden_seconds", json_number(r.hidden_seconds)},
       {"curve", r.curve}};
}

inline void from_json(const nlohmann::json& j, row& r) {
  j.at("variant").get_to(r.variant);
  j.at("kind").get_to(r.kind);
  j.at("inner").get_to(r.inner);
  j.at("outer").get_to(r.outer);
  j.at("compressor").get_to(r.compressor);
  j.at("sync").get_to(r.sync);
  j.at("workers").get_to(r.workers);
  j.at("inner_steps").get_to(r.inner_steps);
  j.at("steps").get_to(r.steps);
  j.at("tags").get_to(r.tags);
  r.final_loss = number_from_json(j.at("final_loss"));
  r.final_train_loss = number_from_json(j.at("final_train_loss"));
  j.at("bytes_sent").get_to(r.bytes_sent);
  j.at("rounds").get_to(r.rounds);
  r.seconds = number_from_json(j.at("seconds"));
  r.blocked_seconds = number_from_json(j.at("blocked_seconds"));
  r.hidden_seconds = number_from_json(j.at("hidden_seconds"));
  j.at("curve").get_to(r.curve);
}
///@}

/// Writes the rows as JSON, `{"rows": [...]}`, indented.
inline void write_json(std::ostream& out, const std::vector<row>& rows) {
  out << nlohmann::json{{"rows", rows}}.dump(2) << '\n';
}

/// Writes DIR/STEM.csv, DIR/STEM_curves.csv and DIR/STEM.json (DIR created if
/// missing); throws diloco::error if a file cannot be written.
inline void write_files(const std::filesystem::path& dir, const std::string& stem, const std::vector<row>& rows) {
  std::filesystem::create_directories(dir);
  auto open = [&](const std::string& name) {
    std::ofstream f(dir / name);
    if (!f) diloco::detail::raise<error>("diloco::experiment: cannot write ", (dir / name).string());
    return f;
  };
  auto csv = open(stem + ".csv");
  write_csv(csv, rows);
  auto curves = open(stem + "_curves.csv");
  write_curves_csv(curves, rows);
  auto json = open(stem + ".json");
  write_json(json, rows);
  if (!csv || !curves || !json) diloco::detail::raise<error>("diloco::experiment: writing ", stem, " files in ", dir.string(), " failed");
}

}  // namespace diloco::experiment
