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
#include <cstdint>
#include <cstring>
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

// ---------------------------------------------------------------- texts
// Every rank's text, in rank order, over `ranks` ranks: their lengths
// first, then the texts padded to the longest, each through
// `all_gather(mine)`, which returns every rank's bytes (mine.size() each) in
// rank order. A length over 16 MiB is refused on every rank that sees it (a
// rank running another program, or a damaged stream), before any buffer of
// that size is made. The engine (engine/group.hpp) and diloco::sharded
// gather through it.
template <class AllGather>
std::vector<std::string> gather_texts(const std::string& text, std::size_t ranks, AllGather&& all_gather) {
  constexpr std::uint64_t most = std::uint64_t{1} << 24;
  std::vector<std::byte> mine(sizeof(std::uint64_t));
  const std::uint64_t len = text.size();
  std::memcpy(mine.data(), &len, sizeof len);
  const std::vector<std::byte> gathered = all_gather(mine);
  if (gathered.size() != ranks * sizeof len)
    raise<format_error>("gather_texts: the all-gather of the lengths returned ", gathered.size(), " bytes, expected ",
                        ranks * sizeof len);
  std::vector<std::size_t> lengths(ranks);
  std::size_t longest = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    std::uint64_t l = 0;
    std::memcpy(&l, gathered.data() + r * sizeof l, sizeof l);
    if (l > most)
      raise<format_error>("rank ", r, " announced a ", l,
                          "-byte record (at most 16 MiB expected); are all ranks running the same program?");
    lengths[r] = static_cast<std::size_t>(l);
    longest = lengths[r] > longest ? lengths[r] : longest;
  }
  std::vector<std::string> out(ranks);
  if (longest == 0) return out;  // every rank saw the same lengths: none gathers again
  mine.assign(longest, std::byte{0});
  if (!text.empty()) std::memcpy(mine.data(), text.data(), text.size());
  const std::vector<std::byte> all = all_gather(mine);
  if (all.size() != ranks * longest)
    raise<format_error>("gather_texts: the all-gather of the texts returned ", all.size(), " bytes, expected ",
                        ranks * longest);
  for (std::size_t r = 0; r < ranks; ++r)
    out[r].assign(reinterpret_cast<const char*>(all.data() + r * longest), lengths[r]);
  return out;
}

// ------------------------------------------------------------ positions
// Where the ranks must stand at the same point of training: each
// reduction's begin and finish(). Every rank sends this fixed-size record
// (one small all-gather) and every rank compares the same bytes, so all
// raise or none does. A rank that took more or fewer inner steps than the
// others would otherwise pair its collectives with theirs silently (over
// threads) or leave a peer waiting on a closed connection (over Gloo).
enum class position_kind : std::uint64_t { begin = 1, finish = 2 };

struct position_record {
  std::uint64_t kind = 0;        // position_kind
  std::uint64_t position = 0;    // inner steps taken (the schedule's clock)
  std::uint64_t rounds = 0;      // reductions applied so far
  std::uint64_t fragment = 0;    // begin: the fragment whose reduction begins
  std::uint64_t non_finite = 0;  // begin, delayed schedules: non-finite values in the replica
};

inline std::string position_text(const position_record& r) {
  if (r.kind == static_cast<std::uint64_t>(position_kind::finish))
    return concat("inner step ", r.position, " (finish(), ", r.rounds, " rounds applied)");
  if (r.kind == static_cast<std::uint64_t>(position_kind::begin))
    return concat("inner step ", r.position, " (beginning a reduction of fragment ", r.fragment, ", ", r.rounds,
                  " rounds applied)");
  return concat("an unknown point (record kind ", r.kind, "; are all ranks running the same program?)");
}

// Empty when every rank stands where rank 0 does; else the state_error
// every rank raises, naming each rank's inner step count.
inline std::string compare_positions(const std::vector<position_record>& ranks) {
  bool same = true;
  for (const auto& r : ranks)
    same = same && r.kind == ranks.at(0).kind && r.position == ranks[0].position && r.rounds == ranks[0].rounds &&
           r.fragment == ranks[0].fragment;
  if (same) return {};
  std::string each;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    each += concat(r ? ", " : "", "rank ", r, " at ", position_text(ranks[r]));
  return concat("ranks are at different points of training: ", each,
                "; every rank must take the same number of inner steps (step() and inner_step() calls) and call "
                "outer_round() and finish() at the same points; every rank raises this");
}

// Empty when no rank's replica held non-finite values at the round's begin;
// else the problem of the refused round, naming each such rank.
inline std::string non_finite_positions(const std::vector<position_record>& ranks) {
  std::string bad;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].non_finite)
      bad += concat(bad.empty() ? "" : ", ", "rank ", r, " (", ranks[r].non_finite,
                    " non-finite values in its replica at inner step ", ranks[r].position, ")");
  return bad.empty() ? bad : concat("non-finite pseudo-gradient from ", bad);
}

// ------------------------------------------------------------- restores
// What each rank reports after restoring a checkpoint (algorithm::load):
// whether it succeeded (else its error), and the round, schedule position
// and checksum of the state every rank holds identically (theta_global, the
// outer state and counters) that it restored. One text line per rank.
struct restore_record {
  bool ok = false;
  std::uint64_t rounds = 0, position = 0, checksum = 0;
  std::string problem;  // !ok: this rank's error
};

inline std::string restore_text(const restore_record& r) {
  std::string problem = r.problem;
  for (char& c : problem)
    if (c == '\n' || c == '\t') c = ' ';
  return concat(r.ok ? "ok" : "failed", '\t', r.rounds, '\t', r.position, '\t', r.checksum, '\t', problem);
}

inline restore_record parse_restore_text(std::string_view text, int rank) {
  while (!text.empty() && text.back() == '\0') text.remove_suffix(1);
  // Four tab-separated fields, then the problem (the rest of the line).
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  for (std::size_t tab; parts.size() < 4 && (tab = text.find('\t', pos)) != text.npos; pos = tab + 1)
    parts.push_back(text.substr(pos, tab - pos));
  if (parts.size() == 4) parts.push_back(text.substr(pos));
  auto number = [&](std::string_view v) {
    std::uint64_t x = 0;
    for (char c : v) {
      if (c < '0' || c > '9')
        raise<format_error>("the restore record of rank ", rank, " is malformed (\"", std::string(text),
                            "\"); are all ranks running the same program?");
      x = x * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return x;
  };
  if (parts.size() != 5 || (parts[0] != "ok" && parts[0] != "failed"))
    raise<format_error>("the restore record of rank ", rank, " is malformed (\"", std::string(text),
                        "\"); are all ranks running the same program?");
  return {parts[0] == "ok", number(parts[1]), number(parts[2]), number(parts[3]), std::string(parts[4])};
}

// Empty when every rank restored the same round, position and shared
// state; else the state_error every rank raises, naming each rank's round.
inline std::string compare_restores(const std::vector<restore_record>& ranks) {
  bool same = true;
  for (const auto& r : ranks)
    same = same && r.rounds == ranks.at(0).rounds && r.position == ranks[0].position && r.checksum == ranks[0].checksum;
  if (same) return {};
  std::string each;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    each += concat(r ? ", " : "", "rank ", r, " round ", ranks[r].rounds, " (inner step ", ranks[r].position,
                   ", shared-state checksum ", ranks[r].checksum, ")");
  return concat("ranks restored different checkpoints: ", each,
                "; resuming would train on a different theta_global on each rank. Every rank keeps the state it "
                "had before load(); load files of the same round on every rank (load_latest_common() finds the "
                "newest round that every rank has)");
}

}  // namespace detail
}  // namespace diloco
