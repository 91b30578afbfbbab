// SPDX-License-Identifier: Apache-2.0
#pragma once

// A save/load round trip on one rank (every rank calls it: save and load are
// collective): `t` over replica `a` takes steps [0, saved_at), saves, and
// goes on to `end`; a fresh `u` over replica `b` loads the bytes and takes
// the same steps [saved_at, end). θ_global, the replica and the
// error-feedback residual must equal t's bit for bit, and so must the round
// count: state a load dropped (a residual, a seed's round counter, Q's warm
// start) would give other bits. Also what a refused load said
// (load_error), for the damaged- and hand-built-checkpoint tests.

#include <doctest/doctest.h>

#include <cstring>
#include <diloco/core/error.hpp>
#include <span>
#include <string>
#include <vector>

// What loading `bytes` into `t` raised as format_error, or "(no
// format_error)" (the damaged- and hand-built-checkpoint tests).
template <class T>
std::string load_error(T& t, std::span<const std::byte> bytes) {
  try {
    t.load(bytes);
  } catch (const diloco::format_error& e) {
    return e.what();
  }
  return "(no format_error)";
}
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class T, class Grads>
void check_resume_bits(T& t, T& u, const std::vector<float>& a, const std::vector<float>& b, Grads&& grads,
                       int saved_at, int end) {
  for (int s = 0; s < saved_at; ++s) t.step(grads(s));
  const auto bytes = t.save_bytes();
  for (int s = saved_at; s < end; ++s) t.step(grads(s));
  const auto g = t.global_parameters();
  const std::vector<float> want_global(g.data(), g.data() + g.size()), want_local = a;
  const auto res = t.compression_residual();
  const std::vector<float> want_residual(res.data(), res.data() + res.size());
  u.load(std::span<const std::byte>(bytes));
  for (int s = saved_at; s < end; ++s) u.step(grads(s));
  const auto ug = u.global_parameters();
  const auto ures = u.compression_residual();
  CHECK(std::memcmp(ug.data(), want_global.data(), want_global.size() * 4) == 0);
  CHECK(std::memcmp(b.data(), want_local.data(), want_local.size() * 4) == 0);
  REQUIRE(ures.size() == want_residual.size());
  CHECK(std::memcmp(ures.data(), want_residual.data(), want_residual.size() * 4) == 0);
  CHECK(u.stats().rounds == t.stats().rounds);
}
