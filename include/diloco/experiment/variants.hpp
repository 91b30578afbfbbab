// SPDX-License-Identifier: Apache-2.0
#pragma once

// The variants an experiment compares, as types: a DiLoCo variant is one
// choice of inner optimizer x outer optimizer x compressor x schedule (the
// communicator comes from the experiment's launcher, so one list runs on
// threads, MPI or Gloo); the baselines are synchronous data parallel and
// one worker alone. A list of them is variants<...>; grid<...> spells the
// product of four lists; named<"label", V> gives a variant its own label.

#include <cstddef>
#include <string>
#include <type_traits>

#include "diloco/algorithm.hpp"
#include "diloco/compress/fingerprint.hpp"
#include "diloco/compress/none.hpp"
#include "diloco/inner/adamw.hpp"
#include "diloco/outer/nesterov.hpp"
#include "diloco/sync/blocking.hpp"

namespace diloco::experiment {

/// What a variant runs: DiLoCo, or one of the two baselines.
enum class method { diloco, data_parallel, single_worker };

/// The method's name, as rows report it.
inline const char* method_name(method m) {
  switch (m) {
    case method::diloco: return "diloco";
    case method::data_parallel: return "data_parallel";
    case method::single_worker: return "single_worker";
  }
  return "?";
}

/// A compressor's short label: its name, "+ef" with error feedback.
template <class Compressor>
std::string compressor_label() {
  std::string out = Compressor::name;
  if constexpr (!Compressor::lossless && requires { Compressor::has_error_feedback; })
    if (Compressor::has_error_feedback) out += "+ef";
  return out;
}

/// DiLoCo with these four policies; the launcher's communicator completes
/// the algorithm type. Options: the algorithm's (algorithm_options).
template <class Inner = inner::adamw, class Outer = outer::nesterov, class Compressor = compress::none,
          class Sync = sync::blocking>
struct variant {
  static constexpr method kind = method::diloco;  ///< what the variant runs
  ///@{
  /// The policies.
  using inner_type = Inner;
  using outer_type = Outer;
  using compressor_type = Compressor;
  using sync_type = Sync;
  ///@}
  using options = algorithm_options<Inner, Outer, Compressor, Sync>;  ///< the options of the algorithm it runs
  /// The algorithm type, once the launcher's communicator is known.
  template <class Comm>
  using algorithm_for = diloco::algorithm<Inner, Outer, Compressor, Comm, Sync>;

  /// "diloco", then what differs from the defaults (AdamW inside, Nesterov
  /// outside, fp32 pseudo-gradients, the blocking schedule).
  static std::string name() {
    std::string out = "diloco";
    if constexpr (!std::is_same_v<Compressor, compress::none>) out += "+" + compressor_label<Compressor>();
    if constexpr (!std::is_same_v<Sync, sync::blocking>) out += std::string(" ") + Sync::name;
    if constexpr (!std::is_same_v<Inner, inner::adamw>) out += std::string(" inner ") + Inner::name;
    if constexpr (!std::is_same_v<Outer, outer::nesterov>) out += std::string(" ") + Outer::name;
    return out;
  }
  ///@{
  /// Labels for the rows' policy columns: the outer optimizer, the compressor (its
  /// fingerprint), the schedule.
  static std::string outer_name() { return Outer::name; }
  static std::string compressor_name() { return compress::fingerprint<Compressor>(); }
  static std::string sync_name() { return Sync::name; }
  ///@}
};

/// The policies of a DiLoCo variant's options type, for configure callables
/// that set per-compressor, per-schedule or per-outer-optimizer options:
///   if constexpr (std::is_same_v<compressor_of_t<O>, my_compressor>) o.compress = ...;
template <class Options>
struct policies_of {
  ///@{
  /// Not a DiLoCo variant's options: no outer optimizer, compressor or schedule.
  using outer = void;
  using compressor = void;
  using sync = void;
  ///@}
};
/// The policies of algorithm_options.
template <class Inner, class Outer, class Compressor, class Sync>
struct policies_of<algorithm_options<Inner, Outer, Compressor, Sync>> {
  ///@{
  /// The outer optimizer, the compressor and the schedule the options are for.
  using outer = Outer;
  using compressor = Compressor;
  using sync = Sync;
  ///@}
};
/// The outer optimizer of a variant's options type (void for the baselines).
template <class Options>
using outer_of_t = typename policies_of<std::remove_cvref_t<Options>>::outer;
/// The compressor of a variant's options type (void for the baselines).
template <class Options>
using compressor_of_t = typename policies_of<std::remove_cvref_t<Options>>::compressor;
/// The schedule of a variant's options type (void for the baselines).
template <class Options>
using sync_of_t = typename policies_of<std::remove_cvref_t<Options>>::sync;

/// Options of a baseline: its optimizer's.
template <class Inner>
struct baseline_options {
  typename Inner::options inner{};  ///< the optimizer's options
};

/// Synchronous data parallel: every worker's gradient, averaged by an
/// all-reduce every step, then the same optimizer step on every replica.
template <class Inner = inner::adamw>
struct data_parallel {
  static constexpr method kind = method::data_parallel;  ///< what the variant runs
  using inner_type = Inner;  ///< the optimizer every replica runs
  using options = baseline_options<Inner>;  ///< the optimizer's options
  ///@{
  /// Labels for the rows: the variant's name, no outer optimizer or compressor, one exchange
  /// every step.
  static std::string name() { return "data parallel"; }
  static std::string outer_name() { return "-"; }
  static std::string compressor_name() { return "-"; }
  static std::string sync_name() { return "every step"; }
  ///@}
};

/// One worker alone with worker 0's data: the same compute per worker as
/// each DiLoCo or data-parallel worker, and no communication.
template <class Inner = inner::adamw>
struct single_worker {
  static constexpr method kind = method::single_worker;  ///< what the variant runs
  using inner_type = Inner;  ///< the optimizer it runs
  using options = baseline_options<Inner>;  ///< the optimizer's options
  ///@{
  /// Labels for the rows: the variant's name; no outer optimizer, compressor or schedule.
  static std::string name() { return "single worker"; }
  static std::string outer_name() { return "-"; }
  static std::string compressor_name() { return "-"; }
  static std::string sync_name() { return "-"; }
  ///@}
};

/// A string usable as a template argument: named<"diloco int4", V>.
template <std::size_t N>
struct fixed_string {
  char text[N]{};  ///< the characters, the terminating null included
  /// From a string literal (implicit, so that named<"label", V> works).
  constexpr fixed_string(const char (&s)[N]) {  // NOLINT: implicit on purpose
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

/// V under its own label (two variants of one type with different options
/// need two labels: the configure callable sees the label).
template <fixed_string Label, class V>
struct named : V {
  /// The label.
  static std::string name() { return Label.text; }
};

/// A variant type (variant, data_parallel, single_worker, or named of one):
/// its kind, options, inner optimizer and name.
template <class V>
concept experiment_variant = requires {
  { V::kind } -> std::convertible_to<method>;
  typename V::options;
  typename V::inner_type;
  { V::name() } -> std::convertible_to<std::string>;
};

/// A list of variants, run in order by experiment::run.
template <class... V>
struct variants {
  static_assert((experiment_variant<V> && ...),
                "diloco::experiment::variants: every entry must be a variant<Inner, Outer, Compressor, Sync>, "
                "data_parallel<Inner>, single_worker<Inner> or named<\"label\", one of those>");
  static constexpr std::size_t size = sizeof...(V);  ///< the number of variants
};

/// A list of policy types: one axis of grid.
template <class... T>
struct list {};

namespace detail {

template <class... L>
struct join;
template <>
struct join<> {
  using type = variants<>;
};
template <class... A>
struct join<variants<A...>> {
  using type = variants<A...>;
};
template <class... A, class... B, class... Rest>
struct join<variants<A...>, variants<B...>, Rest...> {
  using type = typename join<variants<A..., B...>, Rest...>::type;
};

template <class I, class O, class C, class Ss>
struct grid_line;
template <class I, class O, class C, class... S>
struct grid_line<I, O, C, list<S...>> {
  using type = variants<variant<I, O, C, S>...>;
};
template <class I, class O, class Cs, class Ss>
struct grid_plane;
template <class I, class O, class... C, class Ss>
struct grid_plane<I, O, list<C...>, Ss> {
  using type = typename join<typename grid_line<I, O, C, Ss>::type...>::type;
};
template <class I, class Os, class Cs, class Ss>
struct grid_cube;
template <class I, class... O, class Cs, class Ss>
struct grid_cube<I, list<O...>, Cs, Ss> {
  using type = typename join<typename grid_plane<I, O, Cs, Ss>::type...>::type;
};
template <class Is, class Os, class Cs, class Ss>
struct grid;
template <class... I, class Os, class Cs, class Ss>
struct grid<list<I...>, Os, Cs, Ss> {
  using type = typename join<typename grid_cube<I, Os, Cs, Ss>::type...>::type;
};

}  // namespace detail

/// variants<A...> followed by variants<B...> ...
template <class... Lists>
using join = typename detail::join<Lists...>::type;

/// Every DiLoCo variant of list<Inner...> x list<Outer...> x
/// list<Compressor...> x list<Sync...>, the last list varying fastest.
template <class Inners, class Outers, class Compressors, class Syncs>
using grid = typename detail::grid<Inners, Outers, Compressors, Syncs>::type;

}  // namespace diloco::experiment
