// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the ranks compare at construction (engine.hpp runs the exchange):
// each rank writes its policies, parameter layout and options as one text
// record per field, the records of all ranks are gathered, and every rank
// runs the same comparison on the same bytes, so every rank reaches the
// same verdict. Fields that must agree (agreement::across_ranks) name the
// first one that differs with both values; per-rank fields (the inner
// optimizer's options, host_threads) are reported, not enforced; the
// initial-parameter check (without the initial broadcast) travels as a
// field of its own.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/core/error.hpp"
#include "diloco/core/options.hpp"

namespace diloco {

/// A per-rank option whose value differs between ranks: its value on each
/// rank, in rank order.
struct per_rank_option {
  std::string name;                 ///< the option's name, as visit_options gives it
  std::vector<std::string> values;  ///< its value on each rank, in rank order
};

namespace detail {

// One record per line: a tag ('A' must agree, 'R' per rank, 'V' a local
// verdict: empty when fine, else what was wrong), the name, a tab, the
// value. Names and values never hold a newline or a tab (values are
// option_value::to_string()s and our own messages).
struct agreement_record {
  char tag;
  std::string name, value;
};

inline std::string agreement_text(const std::vector<agreement_record>& records) {
  std::string out;
  for (const auto& r : records) {
    out += r.tag;
    out += r.name;
    out += '\t';
    out += r.value;
    out += '\n';
  }
  return out;
}

inline std::vector<agreement_record> parse_agreement_text(std::string_view text, int rank) {
  std::vector<agreement_record> out;
  while (!text.empty() && text.back() == '\0') text.remove_suffix(1);  // padding
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::size_t tab = text.find('\t', pos);
    if (end == std::string_view::npos || tab == std::string_view::npos || tab > end || end == pos)
      raise<format_error>("the start-up agreement record of rank ", rank, " is malformed at byte ", pos,
                          " (expected 'tag name<TAB>value' lines)");
    out.push_back({text[pos], std::string(text.substr(pos + 1, tab - pos - 1)),
                   std::string(text.substr(tab + 1, end - tab - 1))});
    pos = end + 1;
  }
  return out;
}

struct agreement_outcome {
  std::optional<std::string> mismatch;       // the config_error every rank raises
  std::optional<std::string> initial_check;  // the numeric_error every rank raises
  std::vector<per_rank_option> per_rank;     // per-rank options that differ
};

// Compares every rank's records with rank 0's.
inline agreement_outcome compare_agreement(const std::vector<std::vector<agreement_record>>& ranks) {
  agreement_outcome out;
  const auto& first = ranks.at(0);
  for (std::size_t r = 1; r < ranks.size() && !out.mismatch; ++r) {
    std::map<std::string, std::string> theirs;
    for (const auto& f : ranks[r])
      if (f.tag == 'A') theirs.emplace(f.name, f.value);
    for (const auto& f : first) {
      if (f.tag != 'A') continue;
      const auto it = theirs.find(f.name);
      if (it == theirs.end()) {
        out.mismatch = concat("'", f.name, "' is ", f.value, " on rank 0 but rank ", r, " has no such field");
        break;
      }
      if (it->second != f.value) {
        out.mismatch = concat("'", f.name, "' is ", f.value, " on rank 0 but ", it->second, " on rank ", r);
        break;
      }
      theirs.erase(it);
    }
    if (!out.mismatch && !theirs.empty())
      out.mismatch = concat("'", theirs.begin()->first, "' is ", theirs.begin()->second, " on rank ", r,
                            " but rank 0 has no such field");
  }
  if (out.mismatch)
    out.mismatch = concat("options that must agree across ranks differ: ", *out.mismatch,
                          " (policies, the parameter layout, H, broadcast_initial and the outer, compressor and "
                          "schedule options must be the same on every rank; every rank raises this)");

  std::string bad;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    for (const auto& f : ranks[r])
      if (f.tag == 'V' && !f.value.empty()) bad += concat(bad.empty() ? "" : "; ", "rank ", r, ": ", f.value);
  if (!bad.empty())
    out.initial_check = concat("non-finite initial parameters (", bad,
                               "); every rank raises this, since a replica that starts non-finite would make "
                               "every round refused");

  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> order;
  for (const auto& rank_records : ranks)
    for (const auto& f : rank_records)
      if (f.tag == 'R') {
        auto [it, fresh] = values.try_emplace(f.name);
        if (fresh) order.push_back(f.name);
        it->second.push_back(f.value);
      }
  for (const auto& name : order) {
    const auto& v = values[name];
    bool differ = v.size() != ranks.size();
    for (const auto& x : v) differ = differ || x != v.front();
    if (differ) out.per_rank.push_back({name, v});
  }
  return out;
}

}  // namespace detail
}  // namespace diloco
