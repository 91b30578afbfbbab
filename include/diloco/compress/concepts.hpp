// SPDX-License-Identifier: Apache-2.0
#pragma once

// The compressor axis: the concept a Compressor policy satisfies, beside
// the policies (as sync/concepts.hpp is beside the schedules). What the
// library needs of a compressor is asked of the compressor itself, not of a
// list of the compressors it knows:
//
//   reducer   the reducer its pseudo-gradients travel through: its member
//             alias template `reducer<Comm, Space, Exec>` where it names one
//             (low_rank: reduce::factored; adaptive: reduce::adaptive), else
//             by its kind (reduce/select.hpp): lossless -> reduce::fp32_mean,
//             a block codec with `gathered = true` -> reduce::gathered, any
//             other block codec -> reduce::compressed.
//   fingerprint  how checkpoint headers and the agreement across ranks name
//             it (compress/fingerprint.hpp): its static `fingerprint()`
//             where it has one, else its name, and for a block codec the
//             codec's part (the codec's static `fingerprint()`, else
//             ", block B"), the rounding and error feedback.

#include <concepts>
#include <type_traits>

#include "diloco/compress/codec.hpp"

namespace diloco {

namespace compress {

namespace detail_concepts {
template <template <class, class, class> class>
struct reducer_probe {};
}  // namespace detail_concepts

/// A compressor that names the reducer its pseudo-gradients travel through:
/// a member alias template `template <class Comm, class Space, class Exec>
/// using reducer = ...;` (a type with the reducer interface of
/// docs/architecture.md's "A reducer", constructed from the fragment's
/// parameters, world, rank, options, fragment and executor).
template <class C>
concept names_reducer = requires { typename detail_concepts::reducer_probe<C::template reducer>; };

/// Whether a compressor travels through a reducer of its own (it names one,
/// or says `factored` or `switching`) rather than as block codec segments.
template <class C>
constexpr bool own_reducer_v = names_reducer<C> || declares_own_reducer_v<C>;

/// What the compressor concept checks against lossy_compressor: C itself when
/// it travels as block codec segments, the stand-in otherwise (lossless, or a
/// reducer of its own). So the concept is a conjunction, and a compiler names
/// the requirement a lossy compressor misses instead of reporting that "no
/// operand of the disjunction is satisfied".
template <class C>
using block_codec_policy_t = std::conditional_t<!C::lossless && !own_reducer_v<C>, C, stand_in::any_lossy_compressor>;

}  // namespace compress

/// What a pseudo-gradient becomes before it travels. `lossless` codecs are
/// reduced with the communicator's own all-reduce; lossy ones provide a block
/// codec (compress/codec.hpp) and travel through the compressed mean (or
/// all-gathered, chunk_topk), or name a reducer of their own
/// (compress::names_reducer: low_rank's factors, adaptive's rungs) and
/// validate their options.
template <class C>
concept compressor = requires {
  typename C::options;
  { C::name } -> std::convertible_to<const char*>;
  { C::lossless } -> std::convertible_to<bool>;
} && compress::lossy_compressor<compress::block_codec_policy_t<C>> &&
                     (C::lossless || compress::lossy_compressor<C> ||
                      (compress::own_reducer_v<C> &&
                       requires(const typename C::options& o) { C::validate(o); }));

}  // namespace diloco
