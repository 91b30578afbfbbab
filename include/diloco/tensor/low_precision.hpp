// SPDX-License-Identifier: Apache-2.0
#pragma once

// Low-precision replicas (issue 40 item 2; docs/algorithms.md, "Low-precision
// replicas"): parameter tensors in bf16 or fp16 while theta_global, the outer
// state and the residuals stay in fp32.
//
// The element types: diloco::bfloat16 and diloco::float16 hold the 16 bits
// of a value (the layout of torch.bfloat16 / torch.float16, __nv_bfloat16 /
// __half), so a std::vector<diloco::bfloat16> or a tensor_view over a
// framework's buffer is a replica tensor.
//
// The rules. The library keeps an fp32 mirror S of the replica, one float
// per element, and runs every schedule on S exactly as on an fp32 replica.
// Between the mirror and the replica tensors (T, the user's), with
// RNE = round to nearest, ties to even:
//
//   push  T <- RNE(S)      after every pass that wrote S (a merge, a reset,
//                          a restore)
//   pull  once per call that touches the replica, before its first pass
//         (engine_base::set_replica_access), for each element:
//         S <- S       where T == RNE(S) (untouched since the last write)
//         S <- c = float(T) + (S - float(RNE(S)))   where RNE(c) == T
//         S <- c'      the fp32 neighbour of c toward T, where RNE(c') == T
//         S <- float(T)                              otherwise
//
// S - float(RNE(S)) is the rounding error of the last write, exact in fp32,
// so the pseudo-gradient ref - S the engine forms is, as a real number,
// float(a) - float(T) with a the value actually written at the phase start:
// a phase without inner progress yields Delta = 0 exactly, and no rounding
// drift enters theta_global. c is exact whenever the value stayed in its
// binade or moved to a wider one. Two cases keep the invariant below at a
// small cost: c on a rounding tie that goes to T's neighbour moves one fp32
// ulp toward T (c'); T in a narrower binade, where the old rounding error
// exceeds half the new spacing, drops that error (at most half a spacing of
// the written value). After every pull and push T == RNE(S): S alone
// determines the replica, so a checkpoint holds S (the engine's replica
// entries) and a restore writes T = RNE(S).
//
// Only wrapper mode (inner::external) takes low-precision replicas: the
// library's own inner optimizers update fp32 tensors. A user whose
// optimizer keeps fp32 master weights wraps the masters instead (fp32
// tensors, no mirror): the masters are the replica DiLoCo should average.
// Host or device memory (device tensors as device_view<diloco::bfloat16>,
// e.g. over a __nv_bfloat16 or torch.bfloat16 CUDA buffer: the same bits);
// the mirror's passes run on the engine's executor and stream.

#include <cmath>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"
#include "diloco/exec/executor_for.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/host_simd.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/codec/float_formats.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/tensor_traits.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco {

/// A bfloat16 value: the top 16 bits of an fp32 (torch.bfloat16's layout).
struct bfloat16 {
  std::uint16_t bits = 0;  ///< the code
  /// The value of code `b`.
  static constexpr bfloat16 from_bits(std::uint16_t b) { return bfloat16{b}; }
  /// x rounded to nearest, ties to even (NaN stays NaN, overflow gives inf).
  DILOCO_HD DILOCO_FORCEINLINE static bfloat16 round(float x) { return bfloat16{kernels::bf16_round_nearest(x)}; }
  /// The value as an fp32 (exact).
  DILOCO_HD DILOCO_FORCEINLINE explicit operator float() const { return kernels::bf16_format::decode(bits); }
  /// Same code.
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

/// An IEEE binary16 value (torch.float16's layout).
struct float16 {
  std::uint16_t bits = 0;  ///< the code
  /// The value of code `b`.
  static constexpr float16 from_bits(std::uint16_t b) { return float16{b}; }
  /// x rounded to nearest, ties to even (NaN stays NaN, |x| past 65504's
  /// rounding range gives inf).
  DILOCO_HD DILOCO_FORCEINLINE static float16 round(float x) { return float16{kernels::encode_float16<kernels::fp16_format>(x, -1.0f)}; }
  /// The value as an fp32 (exact, subnormals included).
  DILOCO_HD DILOCO_FORCEINLINE explicit operator float() const { return kernels::fp16_format::decode(bits); }
  /// Same code.
  friend constexpr bool operator==(float16, float16) = default;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

/// Whether T is an element type a replica may have besides float.
template <class T>
inline constexpr bool is_low_precision_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

/// The element type's name in messages.
template <class T>
inline constexpr const char* low_precision_name_v = std::is_same_v<T, bfloat16> ? "bf16" : "fp16";

namespace detail {

/// The element rules of tensor/low_precision.hpp for T's format, host and device.
template <class T>
struct low_precision_ops {
  using format = std::conditional_t<std::is_same_v<T, bfloat16>, kernels::bf16_format, kernels::fp16_format>;
  DILOCO_HD DILOCO_FORCEINLINE static std::uint16_t round_bits(float x) { return T::round(x).bits; }
  // The read rule for one element (the header's comment), without branches
  // so that a host loop vectorizes: t is the replica's code, s the mirror.
  DILOCO_HD DILOCO_FORCEINLINE static float pulled(std::uint16_t t, float s) {
    const std::uint16_t written = round_bits(s);
    const float target = format::decode(t);
    const float c = target + (s - format::decode(written));
    // c's fp32 neighbour toward target: one step of the bits, up in
    // magnitude when target is further from zero on c's side.
    const std::uint32_t cb = kernels::float_bits(c);
    const bool up = (target > c) == (c >= 0.0f);
    const float toward = kernels::bits_float(up ? cb + 1u : cb - 1u);
    const float moved = round_bits(c) == t ? c : (round_bits(toward) == t ? toward : target);
    return t == written ? s : moved;
  }
  // Raises numeric_error naming the first finite value of tensor k's mirror
  // `s` (n elements, host memory) that its rounding made inf; a write-back
  // calls it when the replica it wrote holds an inf code.
  static void raise_if_overflowed(std::size_t k, const float* s, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const float back = format::decode(round_bits(s[i]));
      if (s[i] - s[i] == 0.0f && back - back != 0.0f)
        detail::raise<numeric_error>("low-precision replica: tensor ", k, " element ", i, " is ", s[i],
                                     " after the outer step, beyond the range of ", low_precision_name_v<T>,
                                     " (written as inf); keep the model in a wider type or lower the outer lr");
    }
  }
  // Whether code c is +inf or -inf (how an overflow shows in the replica).
  DILOCO_HD DILOCO_FORCEINLINE static bool is_inf_code(std::uint16_t c) { return (c & 0x7fffu) == format::inf; }
};

/// S <- float(T) (the mirror's start).
template <class T>
struct widen_replica {
  const T* t;  ///< the replica
  float* s;    ///< the mirror
  /// Element i.
  DILOCO_HD void operator()(std::size_t i) const { s[i] = static_cast<float>(t[i]); }
};
/// The mirror's read of the replica.
template <class T>
struct read_replica {
  const T* t;  ///< the replica
  float* s;    ///< the mirror
  /// Element i.
  DILOCO_HD void operator()(std::size_t i) const { s[i] = low_precision_ops<T>::pulled(t[i].bits, s[i]); }
};
/// T <- RNE(S).
template <class T>
struct write_replica {
  const float* s;  ///< the mirror
  T* t;            ///< the replica
  /// Element i.
  DILOCO_HD void operator()(std::size_t i) const { t[i].bits = low_precision_ops<T>::round_bits(s[i]); }
};
/// 1 for each inf code of the replica (an overflow shows as one).
template <class T>
struct inf_codes {
  const T* t;  ///< the replica
  /// Element i.
  DILOCO_HD double operator()(std::size_t i) const {
    return low_precision_ops<T>::is_inf_code(t[i].bits) ? 1.0 : 0.0;
  }
};

/// The mirror's passes on the host over elements [b, e) of one tensor:
/// plain loops that vectorize, and where the CPU has AVX2
/// (kernels::host_simd::enabled()) the same loops compiled for it (the
/// same IEEE operations and integer steps on wider registers, no FMA:
/// the same bits). At 2^24 bf16 elements in pieces of 2^14 on this
/// machine's AMD EPYC, one thread: the read 25 GB/s with AVX2 (STREAM triad
/// 24) and 8 at the baseline ISA, where it is compute-bound (two roundings,
/// decodes and selects per element); the write 22 and 13.
template <class T>
struct mirror_host_loops {
  /// S <- the read rule of T and S, elements [b, e), in two loops: the
  /// first takes the rule's first two cases (S kept where T == RNE(S), else
  /// c where RNE(c) == T), which are nearly every element, and leaves S as
  /// it was elsewhere; there T != RNE(S) still holds, and only those
  /// elements, if any, take the whole rule (pulled) in the second. The same
  /// values as pulled for every element, with one rounding fewer in the
  /// loop that runs over all of them.
  DILOCO_FORCEINLINE static void read(const T* t, float* s, std::size_t b, std::size_t e) {
    using ops = low_precision_ops<T>;
    std::uint32_t left = 0;  // 32-bit lanes: a size_t count would widen the loop to 64-bit ones
    for (std::size_t i = b; i < e; ++i) {
      const float si = s[i];
      const std::uint32_t code = wide(t[i].bits);
      const std::uint32_t written = round_wide(kernels::float_bits(si));
      const float c = value(code) + (si - value(written));
      const bool moved = code != written;
      const bool exact = round_wide(kernels::float_bits(c)) == code;
      // The select on the bits, stored unconditionally (pick): `moved &&
      // exact ? c : si` became a masked store, which is microcoded on some
      // CPUs (AMD EPYC here: the loop ran at 0.4 of the speed).
      s[i] = kernels::bits_float(pick(moved && exact, kernels::float_bits(c), kernels::float_bits(si)));
      left |= moved && !exact ? 1u : 0u;
    }
    if (left == 0) return;
    for (std::size_t i = b; i < e; ++i)
      if (ops::round_bits(s[i]) != t[i].bits) s[i] = ops::pulled(t[i].bits, s[i]);
  }
  /// T <- RNE(S), elements [b, e) (e - b < 2^32: a piece); returns how
  /// many codes written are inf.
  DILOCO_FORCEINLINE static std::size_t write(const float* s, T* t, std::size_t b, std::size_t e) {
    std::uint32_t infinite = 0;  // 32-bit lanes (a size_t count ran the loop at 0.4-0.8 of the speed)
    for (std::size_t i = b; i < e; ++i) {
      const std::uint32_t w = round_wide(kernels::float_bits(s[i]));
      t[i].bits = narrow(w);
      infinite += (w & inf_mask) == inf_wide ? 1u : 0u;
    }
    return infinite;
  }

  /// @name The element math of the loops, in 32-bit lanes and without branches
  /// A code "wide": bf16's bits << 16 (the fp32 bits of its value, so that
  /// RNE keeps the top half of an fp32's bits), fp16's code itself. The same
  /// codes and values as T::round and format::decode (test_low_precision
  /// checks every fp16 code and a sweep of fp32 bit patterns), in the form
  /// GCC vectorizes: every case computed and selected, no 16-bit lanes.
  ///@{
  static constexpr bool bf16 = std::is_same_v<T, bfloat16>;
  static constexpr std::uint32_t inf_mask = bf16 ? 0x7fff0000u : 0x7fffu;  ///< a wide code's magnitude
  static constexpr std::uint32_t inf_wide = bf16 ? 0x7f800000u : 0x7c00u;  ///< +inf, wide
  /// `when ? a : b` as masks: a ternary lets GCC move the case's
  /// computation (a float add here) under a branch, which then does not
  /// vectorize (floating point that may trap is not speculated), and a
  /// ternary into a store becomes a masked store.
  DILOCO_FORCEINLINE static std::uint32_t pick(bool when, std::uint32_t a, std::uint32_t b) {
    const std::uint32_t m = 0u - static_cast<std::uint32_t>(when);
    return (a & m) | (b & ~m);
  }
  /// Code c, wide.
  DILOCO_FORCEINLINE static std::uint32_t wide(std::uint16_t c) {
    return bf16 ? static_cast<std::uint32_t>(c) << 16 : static_cast<std::uint32_t>(c);
  }
  /// The code of wide code w.
  DILOCO_FORCEINLINE static std::uint16_t narrow(std::uint32_t w) {
    return static_cast<std::uint16_t>(bf16 ? w >> 16 : w);
  }
  /// RNE of the fp32 with bits u, wide (NaN gives the quiet NaN of its
  /// sign, beyond the range gives inf).
  DILOCO_FORCEINLINE static std::uint32_t round_wide(std::uint32_t u) {
    if constexpr (bf16) {
      return kernels::bf16_round_nearest_wide(u);
    } else {
      const std::uint32_t a = u & 0x7fffffffu;
      const std::uint32_t sign = (u >> 16) & 0x8000u;
      // Normal in fp16 (|x| >= 2^-14): rebias the exponent (127 - 15) and
      // round the 13 bits dropped to nearest even; the carry reaches the
      // exponent, and past 65504 inf's code, exactly when IEEE's rounding does.
      const std::uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
      // Subnormal: |x| * 2^24 to the nearest even integer, by the FPU's own
      // rounding: 0.5 + |x| has the ulp 2^-24, and 0.5's bits are removed.
      const std::uint32_t subnormal = kernels::float_bits(kernels::bits_float(a) + 0.5f) - 0x3f000000u;
      std::uint32_t r = pick(a < 0x38800000u, subnormal, normal);
      r = pick(a >= 0x47800000u, 0x7c00u, r);  // |x| >= 65536 (inf too): inf
      r = pick(a > 0x7f800000u, 0x7e00u, r);   // NaN: quiet
      return sign | r;
    }
  }
  /// The value of wide code w (exact).
  DILOCO_FORCEINLINE static float value(std::uint32_t w) {
    if constexpr (bf16) {
      return kernels::bits_float(w);
    } else {
      const std::uint32_t sign = (w & 0x8000u) << 16, exp = (w >> 10) & 0x1fu, mant = w & 0x3ffu;
      const std::uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
      const std::uint32_t special = sign | 0x7f800000u | (mant << 13);  // inf, NaN
      const std::uint32_t subnormal =
          sign | kernels::float_bits(static_cast<float>(static_cast<std::int32_t>(mant)) * 5.9604644775390625e-8f);
      return kernels::bits_float(pick(exp == 0, subnormal, pick(exp == 31, special, normal)));
    }
  }
  ///@}
#if defined(DILOCO_HOST_SIMD_X86)
  ///@{
  /// read and write compiled for AVX2.
  __attribute__((target("avx2"))) static void read_avx2(const T* t, float* s, std::size_t b, std::size_t e) {
    read(t, s, b, e);
  }
  __attribute__((target("avx2"))) static std::size_t write_avx2(const float* s, T* t, std::size_t b, std::size_t e) {
    return write(s, t, b, e);
  }
  ///@}
#endif
  ///@{
  /// read and write in the widest form the CPU runs.
  static void read_any(const T* t, float* s, std::size_t b, std::size_t e) {
#if defined(DILOCO_HOST_SIMD_X86)
    if (kernels::host_simd::enabled()) return read_avx2(t, s, b, e);
#endif
    read(t, s, b, e);
  }
  static std::size_t write_any(const float* s, T* t, std::size_t b, std::size_t e) {
#if defined(DILOCO_HOST_SIMD_X86)
    if (kernels::host_simd::enabled()) return write_avx2(s, t, b, e);
#endif
    return write(s, t, b, e);
  }
  ///@}
};

/// One piece of a host mirror pass: elements [p * piece, (p + 1) * piece) of
/// a tensor of n, so that the executor's threads split a tensor into pieces
/// and each runs mirror_host_loops over its own.
template <class T>
struct mirror_host_pieces {
  static constexpr std::size_t piece = std::size_t{1} << 14;  ///< elements per piece
  static constexpr std::size_t elements_per_call = piece;     ///< what one call stands for (exec::host)
  const T* read_from;             ///< the replica, for the read (else null)
  T* write_to;                    ///< the replica, for the write (else null)
  float* s;                       ///< the mirror
  std::size_t n;                  ///< the tensor's elements
  std::uint32_t* inf_per_piece;   ///< the write: inf codes written, per piece
  /// The pieces of n elements.
  static std::size_t count(std::size_t elements) { return (elements + piece - 1) / piece; }
  /// Piece p.
  void operator()(std::size_t p) const {
    const std::size_t b = p * piece, e = std::min(n, b + piece);
    if (read_from)
      mirror_host_loops<T>::read_any(read_from, s, b, e);
    else
      inf_per_piece[p] = static_cast<std::uint32_t>(mirror_host_loops<T>::write_any(s, write_to, b, e));
  }
};

/// The mirror of a low-precision replica, behind the interface the front end
/// (algorithm.hpp) calls, whatever the element type and memory space.
class replica_mirror {
 public:
  virtual ~replica_mirror() = default;
  /// S from the replica tensors, before the engine reads it.
  virtual void pull() = 0;
  /// The replica tensors from S, after the engine wrote it; raises
  /// numeric_error when a finite value of S is beyond the element type's range.
  virtual void push() = 0;
};

/// The mirror of a replica of T tensors in memory of `Space`, its passes run
/// by that space's executor (on `stream` for the device: the engine's).
template <class T, class Space>
class low_precision_mirror_on final : public replica_mirror {
  static_assert(is_low_precision_v<T>);
  static constexpr bool host = std::is_same_v<Space, host_space>;
  using executor = typename executor_for<Space>::type;
  // Where tensor k starts in the flat mirror: 64-byte boundaries on the
  // device (the engine's vector paths), packed on the host.
  static constexpr std::size_t align = host ? 1 : 16;

 public:
  /// S = float(T) for every element (theta_global then starts at the
  /// replica's exact values, so the first anchor is the replica itself).
  low_precision_mirror_on(std::vector<tensor_view<T, Space>> replica, int threads, void* stream)
      : replica_(std::move(replica)), exec_(make_executor<executor>(stream)) {
    if constexpr (requires { exec_.set_threads(threads); }) {
      if (threads > 0) exec_.set_threads(threads);
    } else {
      (void)threads;
    }
    std::size_t total = 0;
    for (const auto& t : replica_) total += (t.size() + align - 1) / align * align;
    mirror_ = buffer<float, Space>(total);
    std::size_t at = 0;
    for (const auto& t : replica_) {
      views_.emplace_back(mirror_.data() + at, t.size());
      at += (t.size() + align - 1) / align * align;
    }
    for (std::size_t k = 0; k < replica_.size(); ++k)
      exec_.for_each(replica_[k].size(), widen_replica<T>{replica_[k].data(), views_[k].data()});
    exec_.synchronize();
  }

  /// The fp32 mirror's tensors, for the engine (the same count and sizes).
  const std::vector<tensor_view<float, Space>>& views() const { return views_; }

  void pull() override {
    for (std::size_t k = 0; k < replica_.size(); ++k) {
      const std::size_t n = replica_[k].size();
      if constexpr (host)
        exec_.for_each(mirror_host_pieces<T>::count(n),
                       mirror_host_pieces<T>{replica_[k].data(), nullptr, views_[k].data(), n, nullptr});
      else
        exec_.for_each(n, read_replica<T>{replica_[k].data(), views_[k].data()});
    }
  }

  void push() override {
    for (std::size_t k = 0; k < replica_.size(); ++k) {
      const std::size_t n = replica_[k].size();
      T* t = replica_[k].data();
      // Overflow shows as an inf code: count those (on the host while
      // writing them, on the device a narrow scan), and look at the mirror
      // only when there are any.
      std::size_t infinite = 0;
      if constexpr (host) {
        const std::size_t pieces = mirror_host_pieces<T>::count(n);
        inf_per_piece_.assign(pieces, 0);
        exec_.for_each(pieces, mirror_host_pieces<T>{nullptr, t, views_[k].data(), n, inf_per_piece_.data()});
        for (const std::uint32_t c : inf_per_piece_) infinite += c;
      } else {
        exec_.for_each(n, write_replica<T>{views_[k].data(), t});
        infinite = static_cast<std::size_t>(exec_.transform_reduce(n, inf_codes<T>{t}));
      }
      if (infinite > 0) check_overflow(k);
    }
  }

 private:
  using ops = low_precision_ops<T>;

  // Raises when a finite value of tensor k's mirror was written as inf.
  void check_overflow(std::size_t k) {
    const std::size_t n = views_[k].size();
    std::vector<float> s(n);
    if constexpr (host)
      std::copy(views_[k].data(), views_[k].data() + n, s.begin());
    else
      exec_.to_host(s.data(), views_[k].data(), n);
    ops::raise_if_overflowed(k, s.data(), n);
  }

  std::vector<tensor_view<T, Space>> replica_;
  buffer<float, Space> mirror_;
  std::vector<tensor_view<float, Space>> views_;
  executor exec_;
  std::vector<std::uint32_t> inf_per_piece_;  // the host write's inf codes, per piece
};

}  // namespace detail
}  // namespace diloco

DILOCO_EXACT_FP_END
