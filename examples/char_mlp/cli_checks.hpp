// SPDX-License-Identifier: Apache-2.0
#pragma once

// CLI11 checks shared by the examples' command lines (the char-MLP demo,
// the GPT example, the sweep, bench/wan's worker): finite numbers in a range
// (CLI11's Range lets NaN through), integers in a range, comma-separated
// lists of names, and the parse itself (parse_or_help).

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <diloco/core/error.hpp>

namespace char_mlp {

namespace detail {

// A number in [lo, hi] (or (lo, hi] with `open_low`), finite: CLI11's Range
// lets NaN through.
inline CLI::Validator finite_in(double lo, double hi, bool open_low = false) {
  const std::string desc = std::string(open_low ? "(" : "[") + CLI::detail::to_string(lo) + ", " +
                           CLI::detail::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, open_low, desc](std::string& in) -> std::string {
        double x = 0.0;
        if (!CLI::detail::lexical_cast(in, x) || !std::isfinite(x) || x < lo || x > hi || (open_low && x == lo))
          return "value " + in + " is not a number in " + desc;
        return {};
      },
      "in " + desc);
}

// An integer in [lo, hi] (hi = INT_MAX reads ">= lo" in the usage).
inline CLI::Validator int_in(long long lo, long long hi = std::numeric_limits<int>::max()) {
  const std::string desc = hi == std::numeric_limits<int>::max()
                               ? ">= " + std::to_string(lo)
                               : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& in) -> std::string {
        long long x = 0;
        if (!CLI::detail::lexical_cast(in, x) || x < lo || x > hi)
          return "value " + in + " is not an integer in " + range;
        return {};
      },
      desc);
}

// A comma-separated list whose every value is one of `allowed`; given
// twice, it gathers both.
inline void add_list(CLI::App& app, const std::string& name, std::vector<std::string>& target,
                     const std::string& help,
                     const std::vector<std::string>& allowed) {
  app.add_option(name, target, help)
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str()
      ->check(CLI::IsMember(allowed));
}

}  // namespace detail

// Parses the command line. Returns true when --help was asked (the usage
// printed when `print_help`: processes other than the first stay quiet); a
// malformed or out-of-range value or an unknown option is a config_error
// with CLI11's message naming the option, after `prefix`.
inline bool parse_or_help(CLI::App& app, int argc, char** argv, const std::string& prefix, bool print_help = true) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (print_help) std::fputs(app.help().c_str(), stdout);
    return true;
  } catch (const CLI::ParseError& e) {
    throw diloco::config_error(prefix + e.what() + " (--help lists the options)");
  }
  return false;
}

}  // namespace char_mlp
