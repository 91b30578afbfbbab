// SPDX-License-Identifier: Apache-2.0
#pragma once

// A test-only fault hook: with DILOCO_FAULT_INJECTION defined when the
// library is compiled (tests and the fault scripts do it; nothing else
// should), the environment variable DILOCO_FAULT=stage:round makes this
// process SIGKILL itself when it reaches `stage` during outer round `round`
// (counted from 1; 0 means start-up); DILOCO_FAULT=stage:round:stop makes
// it SIGSTOP itself there instead (a frozen worker, resumed by SIGCONT).
// Stages: startup, inner (the middle of a round's inner steps),
// pseudo_gradient (a reduction begins), the collectives by name
// (all_reduce, broadcast, all_to_all, all_gather, barrier) and apply (a
// reduction is applied). Without the macro every
// call compiles to nothing.

#include <cstdint>

#ifdef DILOCO_FAULT_INJECTION
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#endif

namespace diloco::detail {

#ifdef DILOCO_FAULT_INJECTION
struct fault_plan {
  std::string stage;
  std::uint64_t round = 0;
  int signal = SIGKILL;
  bool armed = false;
};

inline const fault_plan& planned_fault() {
  static const fault_plan plan = [] {
    fault_plan p;
    const char* v = std::getenv("DILOCO_FAULT");
    if (v == nullptr) return p;
    const std::string s(v);
    const auto colon = s.find(':');
    if (colon == std::string::npos) return p;
    p.stage = s.substr(0, colon);
    char* end = nullptr;
    p.round = std::strtoull(s.c_str() + colon + 1, &end, 10);
    if (end != nullptr && std::string(end) == ":stop") p.signal = SIGSTOP;
    p.armed = true;
    return p;
  }();
  return plan;
}

// The outer round this process is in (set by the engine).
inline std::atomic<std::uint64_t>& fault_round() {
  static std::atomic<std::uint64_t> round{0};
  return round;
}

inline void set_fault_round(std::uint64_t r) { fault_round().store(r); }

// Fires once: a stopped process that is resumed goes on.
inline void fault_point(const char* stage) {
  static std::atomic<bool> fired{false};
  const fault_plan& p = planned_fault();
  if (p.armed && p.round == fault_round().load() && p.stage == stage && !fired.exchange(true))
    ::kill(::getpid(), p.signal);
}
#else
inline void set_fault_round(std::uint64_t) {}
inline void fault_point(const char*) {}
#endif

}  // namespace diloco::detail
