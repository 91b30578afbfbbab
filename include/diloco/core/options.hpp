// SPDX-License-Identifier: Apache-2.0
#pragma once

// visit_options: every option of an options struct as (field name, value)
// pairs, so that checks which must name a field (a checkpoint's header, the
// agreement of options across ranks, experiment rows) work from the fields
// themselves rather than from a hash.
//
// The customisation point: next to each policy's options struct, a function
// found by argument-dependent lookup
//
//   template <class F> void visit_options(const options& o, F&& f)
//
// that calls f(name, value) once per field, in declaration order, with the
// field's own value (float, integer, bool, or an enum with a to_string found
// by ADL). An empty options struct needs none. diloco::visit_policy_options
// dispatches to it; algorithm_options (engine.hpp) composes the policies'
// fields under prefixes and says of each whether it must agree across ranks.

#include <bit>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace diloco {

/// Whether ranks may differ in an option. across_ranks: H, the outer
/// optimizer's, the compressor's and the schedule's options, the parameter
/// layout; ranks that differ pair rounds wrongly or drift apart. per_rank:
/// the inner optimizer's options and host_threads (heterogeneous workers).
enum class agreement : std::uint8_t { across_ranks, per_rank };

/// "across ranks" or "per rank", for messages.
inline const char* to_string(agreement a) { return a == agreement::across_ranks ? "across ranks" : "per rank"; }

/// One option's value, type-erased: what a header stores and a message prints.
struct option_value {
  /// The C++ type an option had.
  enum class kind : std::uint8_t { boolean = 1, signed_integer = 2, unsigned_integer = 3, floating = 4, text = 5 };
  kind type = kind::unsigned_integer;  ///< which of bits and str holds the value, and how to read it
  std::uint64_t bits = 0;  ///< bool 0/1, integers (two's complement), floating: the IEEE double's bits
  std::string str;         ///< text

  /// The value of a bool option.
  static option_value of_bool(bool b) { return {kind::boolean, b ? 1u : 0u, {}}; }
  /// The value of a signed integer option.
  static option_value of_signed(std::int64_t v) { return {kind::signed_integer, static_cast<std::uint64_t>(v), {}}; }
  /// The value of an unsigned integer option.
  static option_value of_unsigned(std::uint64_t v) { return {kind::unsigned_integer, v, {}}; }
  /// The value of a floating-point option (float options widened to double).
  static option_value of_double(double v) { return {kind::floating, std::bit_cast<std::uint64_t>(v), {}}; }
  /// The value of a text option (enums through their to_string).
  static option_value of_text(std::string s) { return {kind::text, 0, std::move(s)}; }

  /// Values compare by kind and bits: a float option stored from the same
  /// float compares equal, and NaN options compare equal to themselves.
  friend bool operator==(const option_value& a, const option_value& b) {
    return a.type == b.type && a.bits == b.bits && a.str == b.str;
  }

  /// The value as a message prints it: true/false, the number, or the text in quotes.
  std::string to_string() const {
    switch (type) {
      case kind::boolean: return bits ? "true" : "false";
      case kind::signed_integer: return std::to_string(static_cast<std::int64_t>(bits));
      case kind::unsigned_integer: return std::to_string(bits);
      case kind::floating: {
        char buf[40];
        // 9 significant digits name a float exactly (most options are
        // floats); 17 a double that is not one.
        const double d = std::bit_cast<double>(bits);
        const bool is_float = static_cast<double>(static_cast<float>(d)) == d;
        std::snprintf(buf, sizeof buf, is_float ? "%.9g" : "%.17g", d);
        return buf;
      }
      case kind::text: return "\"" + str + "\"";
    }
    return "?";
  }
};

/// The kind's name, for messages ("bool", "signed integer", ...).
inline const char* to_string(option_value::kind k) {
  switch (k) {
    case option_value::kind::boolean: return "bool";
    case option_value::kind::signed_integer: return "signed integer";
    case option_value::kind::unsigned_integer: return "unsigned integer";
    case option_value::kind::floating: return "floating";
    case option_value::kind::text: return "text";
  }
  return "unknown";
}

/// A field's value as an option_value: bool, integers, floating point, text,
/// and enums that have a to_string found by argument-dependent lookup.
template <class T>
option_value to_option_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return option_value::of_bool(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return option_value::of_double(static_cast<double>(v));
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    return option_value::of_signed(static_cast<std::int64_t>(v));
  } else if constexpr (std::is_integral_v<T>) {
    return option_value::of_unsigned(static_cast<std::uint64_t>(v));
  } else if constexpr (std::is_enum_v<T>) {
    if constexpr (requires { to_string(v); })
      return option_value::of_text(std::string(to_string(v)));
    else
      return to_option_value(static_cast<std::underlying_type_t<T>>(v));
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    return option_value::of_text(std::string(std::string_view(v)));
  } else {
    static_assert(sizeof(T) == 0,
                  "diloco::to_option_value: an option field must be bool, an integer, a floating-point number, "
                  "text, or an enum (give it a to_string found by argument-dependent lookup)");
  }
}

/// A named field, type-erased, with whether ranks must agree on it.
struct option_field {
  std::string name;  ///< dotted for nested options ("inner.lr")
  option_value value;  ///< its value
  agreement agree = agreement::across_ranks;  ///< whether ranks must agree on it
};

/// Calls f(name, value) for every field of a policy's options struct: its
/// visit_options, found by argument-dependent lookup; nothing for an empty
/// struct. A non-empty struct without one is a compile error that says so.
template <class Options, class F>
void visit_policy_options(const Options& o, F&& f) {
  if constexpr (requires { visit_options(o, f); }) {
    visit_options(o, f);
  } else {
    static_assert(std::is_empty_v<Options>,
                  "diloco::visit_policy_options: this options struct has fields but no visit_options(const "
                  "options&, F&&) next to it (found by argument-dependent lookup) calling f(name, value) for each "
                  "field; checkpoints and the agreement of options across ranks need the fields by name");
    (void)f;
  }
}

// Every field of `o` (a policy's options or algorithm_options) as a list.
// A policy's visit_options calls f(name, value): its fields get `agree`;
// algorithm_options' calls f(name, value, agreement) and says per field.
namespace detail {
struct option_field_collector {
  std::vector<option_field>* out;
  agreement agree;
  template <class T>
  void operator()(std::string_view name, const T& value, agreement a) const {
    out->push_back({std::string(name), to_option_value(value), a});
  }
  template <class T>
  void operator()(std::string_view name, const T& value) const {
    (*this)(name, value, agree);
  }
};
}  // namespace detail

/// Every field of `o` as an option_field (visit_policy_options), each tagged `agree`.
template <class Options>
std::vector<option_field> option_fields(const Options& o, agreement agree = agreement::across_ranks) {
  std::vector<option_field> out;
  visit_policy_options(o, detail::option_field_collector{&out, agree});
  return out;
}

}  // namespace diloco
