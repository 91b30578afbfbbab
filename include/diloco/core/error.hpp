// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace diloco {

/// Every failure the library reports is a diloco::error. The subclasses say
/// which side was wrong, so callers can react differently to a bad option
/// (fix the code), a lost peer (restart the round) or corrupt bytes.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An option, policy argument or tensor that does not fit what was expected.
class config_error : public error {
 public:
  using error::error;
};

/// A collective that could not complete: a peer vanished, timed out, or the
/// ranks disagree about the operation's arguments.
class comm_error : public error {
 public:
  using error::error;
};

/// Bytes that crossed a process boundary (wire buffers, checkpoints) and do
/// not decode: wrong magic, version, sizes or checksum, truncation.
class format_error : public error {
 public:
  using error::error;
};

/// An operation that is not valid in the object's current state.
class state_error : public error {
 public:
  using error::error;
};

/// Non-finite values (NaN/Inf) where finite numbers are required, such as a
/// pseudo-gradient. The round that produced them is rejected.
class numeric_error : public error {
 public:
  using error::error;
};

namespace detail {

// Builds messages from pieces without dragging <format> (not in every
// toolchain we support) into device compilations.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  auto append = [&out](const auto& p) {
    using P = std::decay_t<decltype(p)>;
    if constexpr (std::is_convertible_v<P, std::string_view>) {
      out += std::string_view(p);
    } else if constexpr (std::is_same_v<P, char>) {
      out += p;
    } else if constexpr (std::is_same_v<P, bool>) {
      out += p ? "true" : "false";
    } else if constexpr (std::is_floating_point_v<P>) {
      if (p != p) {
        out += "nan";  // printf writes "-nan" for a NaN with its sign bit set; the sign means nothing
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(p));
        out += buf;
      }
    } else {
      out += std::to_string(p);
    }
  };
  (append(parts), ...);
  return out;
}

// `message` without the library's "diloco: " prefix, for quoting one
// error inside another (which has its own prefix).
inline std::string_view unprefixed(std::string_view message) {
  constexpr std::string_view prefix = "diloco: ";
  return message.substr(0, prefix.size()) == prefix ? message.substr(prefix.size()) : message;
}

// A pseudo-gradient's norm in a rejection message: "inf", or for NaN what
// it means (an Inf gradient turns into NaN in an update such as AdamW's,
// m / sqrt(v) = inf / inf).
inline std::string norm_text(double norm) {
  if (norm != norm)
    return "nan: the pseudo-gradient holds NaN, from a NaN gradient or an Inf one that the inner optimizer's "
           "update turned into NaN";
  return concat(norm);
}

template <class Error = config_error, class... Parts>
[[noreturn]] void raise(const Parts&... parts) {
  throw Error(concat("diloco: ", parts...));
}

}  // namespace detail
}  // namespace diloco
