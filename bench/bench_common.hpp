// SPDX-License-Identifier: Apache-2.0
#pragma once

// Shared by the host benchmarks: timing (median of repetitions), the
// command line, and `name: value` output.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "diloco/core/mix64.hpp"

#if defined(__unix__)
#include <sys/wait.h>
#include <unistd.h>
#endif

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace bench {

inline int threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Median wall time of `reps` calls of f (after one warm-up call).
template <class F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median wall times of several functions measured in alternation (f0, f1,
// ..., f0, f1, ...), so that a burst of noise on a shared machine falls on
// all of them alike and their ratios stay meaningful.
template <class... F>
std::vector<double> interleaved_medians(int reps, F&&... fs) {
  constexpr std::size_t k = sizeof...(F);
  std::vector<std::vector<double>> t(k);
  auto one = [](auto& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  (fs(), ...);  // warm-up
  for (int r = 0; r < reps; ++r) {
    std::size_t i = 0;
    ((t[i++].push_back(one(fs))), ...);
  }
  std::vector<double> out;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

inline void print(const std::string& name, double value) { std::printf("%s: %.6g\n", name.c_str(), value); }
inline void print(const std::string& name, const std::string& value) { std::printf("%s: %s\n", name.c_str(), value.c_str()); }

// The command line: CLI11 (as the demo), so a malformed or out-of-range
// value, or an unknown option, exits non-zero with a message naming it.
//   bench::cli cli("what it measures");
//   long reps = 7;
//   cli.option("--reps", reps, "repetitions (median)", 1, 1000);
//   cli.parse(argc, argv);
class cli {
 public:
  explicit cli(std::string description) : app_(std::move(description)) {}
  template <class T>
  void option(const char* name, T& value, const char* help, T lo, T hi) {
    app_.add_option(name, value, help)->capture_default_str()->check(CLI::Range(lo, hi));
  }
  CLI::App& app() { return app_; }
  void parse(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      std::exit(app_.exit(e));
    }
  }

 private:
  CLI::App app_;
};

// Runs this program again as a separate process with `args` (argv[0]'s
// binary, through /proc/self/exe where there is one) and returns what it
// wrote to stdout; exits non-zero, naming the command, if the child fails.
// Fresh processes see what one process cannot: placement that is fixed
// for a process's life (its pages, its addresses) and differs between runs.
inline std::string run_self(const char* argv0, const std::vector<std::string>& args) {
#if defined(__unix__)
  std::vector<std::string> all{argv0};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fd[2];
  if (::pipe(fd) != 0) {
    std::perror("pipe");
    std::exit(2);
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(2);
  }
  if (pid == 0) {
    ::dup2(fd[1], 1);
    ::close(fd[0]);
    ::close(fd[1]);
    ::execv("/proc/self/exe", argv.data());
    ::execvp(argv0, argv.data());
    std::perror(argv0);
    std::_Exit(127);
  }
  ::close(fd[1]);
  std::string out;
  char chunk[4096];
  for (ssize_t got; (got = ::read(fd[0], chunk, sizeof chunk)) > 0;) out.append(chunk, static_cast<std::size_t>(got));
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (auto& a : all) cmd += " " + a;
    std::fprintf(stderr, "a child process failed (status %d):%s\n", status, cmd.c_str());
    std::exit(1);
  }
  return out;
#else
  (void)argv0;
  (void)args;
  std::fprintf(stderr, "--processes needs fork/exec (POSIX)\n");
  std::exit(2);
#endif
}

// The value of the line `name: value` in text (NaN when absent).
inline double value_of(const std::string& text, const std::string& name) {
  const std::string key = name + ": ";
  for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
    if (at == 0 || text[at - 1] == '\n') return std::strtod(text.c_str() + at + key.size(), nullptr);
  return std::strtod("nan", nullptr);
}

// Parallel first touch, the way the passes will use the pages.
inline void fill(std::span<float> v, float base) {
  const auto n = static_cast<std::ptrdiff_t>(v.size());
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = base + 1e-7f * static_cast<float>(i % 1000);
}

// Normal draws of mean `mean` and deviation `sd` (Box-Muller on two
// uniforms hashed from `seed` and the index: the same values whatever the
// thread count), added to v where `add`, else written; parallel first touch
// as fill's.
inline void fill_normal(std::span<float> v, double mean, double sd, std::uint64_t seed, bool add = false) {
  const auto n = static_cast<std::ptrdiff_t>(v.size());
  const double two_pi = 6.283185307179586;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const std::uint64_t h = diloco::detail::mix64(seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i));
    const double u1 = (static_cast<double>(h >> 40) + 0.5) / 16777216.0;  // (0, 1): 24 bits
    const double u2 = static_cast<double>((h >> 16) & 0xffffffu) / 16777216.0;
    const auto x = static_cast<float>(mean + sd * std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
    float& at = v[static_cast<std::size_t>(i)];
    at = add ? at + x : x;
  }
}

}  // namespace bench
