// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "diloco/exec/chunks.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::exec {

/// Runs DILOCO_HD element functors on the CPU: serially, or with OpenMP when
/// the library is built with it (target diloco::diloco links OpenMP when the
/// DILOCO_ENABLE_OPENMP option finds it).
///
/// The executor interface the engine relies on (exec::cuda has the same):
///   for_each(n, f)            f(i) for i in [0, n)
///   transform_reduce(n, f)    the same, returning the sum of f(i) as double
///   copy(dst, src, n)         within the executor's memory space
///   to_host(dst, src, n)      from the executor's space into host memory
///   from_host(dst, src, n)    from host memory into the executor's space
///   synchronize()             wait for everything issued so far
///   for_each_chunked(t, m)    m.bind(k)(i) for every element of every tensor
///                             of chunk table t (exec/chunks.hpp): one
///                             parallel region for a whole tensor list (on
///                             the host, f.range(begin, end) for a piece
///                             where the bound functor f has that member)
///   transform_reduce_chunked(t, m)   the same, returning the sum in the
///                             fixed chunk/lane order exec/chunks.hpp defines
///
/// Reductions are deterministic: the index range is cut into fixed chunks
/// whose partial sums are combined in chunk order, so the result is the same
/// bits whatever the number of threads.
class host {
 public:
  /// What transform_reduce accumulates for a functor F.
  template <class F>
  using sum_type = std::conditional_t<std::is_arithmetic_v<std::invoke_result_t<const F&, std::size_t>>, double,
                                      std::invoke_result_t<const F&, std::size_t>>;

  /// Below this many elements a pass runs on the calling thread: starting a
  /// parallel region costs more than it saves.
  static constexpr std::size_t parallel_threshold = std::size_t{1} << 15;

  /// The elements one call of F stands for: F::elements_per_call where F
  /// says so (the codec passes, called once per block of B elements), else 1;
  /// for_each and transform_reduce weigh n by it against parallel_threshold.
  template <class F>
  static constexpr std::size_t elements_per_call() {
    if constexpr (requires { F::elements_per_call; })
      return F::elements_per_call;
    else
      return 1;
  }
  /// Elements per reduction chunk; part of the reduction's definition.
  static constexpr std::size_t reduce_chunk = 8192;
  /// Independent accumulators inside a chunk (lets the compiler vectorize
  /// the sum without reassociating it).
  static constexpr std::size_t reduce_lanes = 8;

  /// threads == 0: OpenMP's default team size.
  explicit host(int threads = 0) : threads_(threads) {}

  /// The threads a parallel pass uses (1 without OpenMP).
  int threads() const {
#if defined(_OPENMP)
    return threads_ > 0 ? threads_ : omp_get_max_threads();
#else
    return 1;
#endif
  }
  /// Sets the team size of later passes (0: OpenMP's default).
  void set_threads(int threads) { threads_ = threads; }

  /// f(i) for every i in [0, n).
  template <class F>
  void for_each(std::size_t n, const F& functor) const {
    // A local copy: its fields (flags, scalars, pointers) cannot alias the
    // floats the loop stores, so the compiler hoists the functor's uniform
    // branches out of the loop and vectorizes it.
    const F f = functor;
#if defined(_OPENMP)
    const int team = threads();
    if (n * elements_per_call<F>() >= parallel_threshold && team > 1) {
      const auto sn = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel num_threads(team)
      {
        const F mine = f;  // per thread, for the same reason as above
#pragma omp for schedule(static)
        for (std::ptrdiff_t i = 0; i < sn; ++i) mine(static_cast<std::size_t>(i));
      }
      return;
    }
#endif
    for (std::size_t i = 0; i < n; ++i) f(i);
  }

  /// Runs f(i) for every i in [0, n) and returns the sum of what it returns:
  /// as double when f returns a number, else as f's own type (a struct of
  /// several sums with += and a zero default). f may also write: this is how
  /// a pass fuses its side effects with its norms.
  template <class F>
  auto transform_reduce(std::size_t n, const F& functor) {
    using R = sum_type<F>;
    const F f = functor;  // see for_each
    const std::size_t chunks = (n + reduce_chunk - 1) / reduce_chunk;
#if defined(_OPENMP)
    // Fewer chunks than threads, and calls heavy enough to share (a codec
    // pass over a few thousand blocks, such as chunk_topk's 4096-element
    // chunks): the calls run on the team, their results kept, and are then
    // summed in the fixed order on this thread, so the same sum.
    // (Only functors that stand for several elements a call: the codec
    // passes; a plain one's range is shared by chunks below.)
    if constexpr (elements_per_call<F>() > 1)
      if (const int team = threads(); team > 1 && chunks < static_cast<std::size_t>(team) &&
                                      n * elements_per_call<F>() >= parallel_threshold)
        return sum_of_calls(n, f, team);
#endif
    if (n <= reduce_chunk) return chunk_sum(0, n, f);
    std::vector<R> local;
    R* partials;
    if constexpr (std::is_same_v<R, double>) {
      if (partials_.size() < chunks) partials_.resize(chunks);
      partials = partials_.data();
    } else {
      local.resize(chunks);
      partials = local.data();
    }
#if defined(_OPENMP)
    const int team = threads();
    if (n * elements_per_call<F>() >= parallel_threshold && team > 1) {
      const auto sc = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel for schedule(static) num_threads(team)
      for (std::ptrdiff_t c = 0; c < sc; ++c) {
        const auto lo = static_cast<std::size_t>(c) * reduce_chunk;
        partials[c] = chunk_sum(lo, std::min(n, lo + reduce_chunk), f);
      }
    } else
#endif
    {
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t lo = c * reduce_chunk;
        partials[c] = chunk_sum(lo, std::min(n, lo + reduce_chunk), f);
      }
    }
    R total{};
    for (std::size_t c = 0; c < chunks; ++c) total += partials[c];
    return total;
  }

  /// m.bind(k)(i) for every element i of every piece of t, chunk by chunk:
  /// one parallel region whatever the number of tensors (the chunks are
  /// equal, so a static schedule balances them).
  template <class M>
  void for_each_chunked(const chunk_view& t, const M& multi) const {
    const M m = multi;  // see for_each
#if defined(_OPENMP)
    const int team = threads();
    if (t.elements >= parallel_threshold && team > 1) {
      const auto chunks = static_cast<std::ptrdiff_t>(t.chunks);
#pragma omp parallel for schedule(static) num_threads(team)
      for (std::ptrdiff_t c = 0; c < chunks; ++c) run_chunk(m, t, static_cast<std::size_t>(c));
      return;
    }
#endif
    for (std::size_t c = 0; c < t.chunks; ++c) run_chunk(m, t, c);
  }

  /// The sum of m.bind(k)(i) over every element, in exec/chunks.hpp's order
  /// (lanes within a chunk, added pairwise; chunks in order): the same bits
  /// as the GPU's, for any layout of the same elements.
  template <class M>
  auto transform_reduce_chunked(const chunk_view& t, const M& multi) {
    using R = chunk_sum_t<M>;
    const M m = multi;
    std::vector<R> local;
    R* partials;
    if constexpr (std::is_same_v<R, double>) {
      if (partials_.size() < t.chunks) partials_.resize(t.chunks);
      partials = partials_.data();
    } else {
      local.resize(t.chunks);
      partials = local.data();
    }
#if defined(_OPENMP)
    const int team = threads();
    if (t.elements >= parallel_threshold && team > 1) {
      const auto chunks = static_cast<std::ptrdiff_t>(t.chunks);
#pragma omp parallel for schedule(static) num_threads(team)
      for (std::ptrdiff_t c = 0; c < chunks; ++c)
        partials[c] = sum_chunk(m, t, static_cast<std::size_t>(c));
    } else
#endif
    {
      for (std::size_t c = 0; c < t.chunks; ++c) partials[c] = sum_chunk(m, t, c);
    }
    R total{};
    for (std::size_t c = 0; c < t.chunks; ++c) total += partials[c];
    return total;
  }

  ///@{
  /// Copies n elements (memcpy: host memory is the executor's memory, so every direction is a
  /// plain copy).
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }
  template <class T>
  static void to_host(T* dst, const T* src, std::size_t n) {
    copy(dst, src, n);
  }
  template <class T>
  static void from_host(T* dst, const T* src, std::size_t n) {
    copy(dst, src, n);
  }
  ///@}
  /// Nothing to wait for: every host pass has completed when it returns.
  static void synchronize() {}

  /// transform_reduce's sum by calls on `team` threads: r[i] = f(i) (in
  /// runs of reduce_lanes from a multiple of it, by f.batch where F has it,
  /// as chunk_sum calls it), then each chunk of r summed by chunk_sum in
  /// chunk order, the same terms in the same order as chunk_sum over f.
#if defined(_OPENMP)
  template <class F>
  static sum_type<F> sum_of_calls(std::size_t n, const F& f, int team) {
    using R = sum_type<F>;
    std::vector<R> r(n);
    const auto runs = static_cast<std::ptrdiff_t>((n + reduce_lanes - 1) / reduce_lanes);
#pragma omp parallel num_threads(team)
    {
      const F mine = f;  // per thread, as in for_each
#pragma omp for schedule(static)
      for (std::ptrdiff_t g = 0; g < runs; ++g) {
        const std::size_t i = static_cast<std::size_t>(g) * reduce_lanes;
        const std::size_t count = std::min(reduce_lanes, n - i);
        if constexpr (requires(R* out) { mine.batch(i, count, out); })
          mine.batch(i, count, r.data() + i);
        else
          for (std::size_t j = 0; j < count; ++j) r[i + j] = static_cast<R>(mine(i + j));
      }
    }
    struct stored {
      const R* r;
      R operator()(std::size_t i) const { return r[i]; }
    };
    if (n <= reduce_chunk) return chunk_sum(0, n, stored{r.data()});  // one chunk: its sum, as transform_reduce's
    R total{};
    for (std::size_t lo = 0; lo < n; lo += reduce_chunk) total += chunk_sum(lo, std::min(n, lo + reduce_chunk), stored{r.data()});
    return total;
  }
#endif

  /// The fixed-order sum of f over [lo, hi): lane l accumulates the indices
  /// congruent to l modulo reduce_lanes, then the lanes are added pairwise.
  /// A functor with batch(i, n, r) (r[j] = f(i + j), j < n <= reduce_lanes:
  /// kernels::reduce_shard) is called that way, the same sums in the same order.
  /// A functor returning float is summed in float lanes within the chunk
  /// (each lane adds reduce_chunk / reduce_lanes = 1024 terms, so the
  /// relative error stays near 1e-4 at worst) and chunks in double: the
  /// lanes then vectorize as wide as the data, which a float-to-double
  /// conversion per element would halve. Other types sum as they are.
  template <class F>
  static sum_type<F> chunk_sum(std::size_t lo, std::size_t hi, const F& functor) {
    const F f = functor;  // a local copy, as in for_each: its pointers cannot alias the stores
    using R = sum_type<F>;
    R lane[reduce_lanes] = {};
    std::size_t i = lo;
    if constexpr (requires(R* r) { f.batch(i, hi, r); }) {
      // f.batch(i, n, r): r[j] = f(i + j) for j < n, computed together.
      R r[reduce_lanes];
      for (; i < hi; i += reduce_lanes) {
        const std::size_t n = std::min(reduce_lanes, hi - i);
        f.batch(i, n, r);
        for (std::size_t l = 0; l < n; ++l) lane[l] += r[l];
      }
    } else {
      for (; i + reduce_lanes <= hi; i += reduce_lanes)
        for (std::size_t l = 0; l < reduce_lanes; ++l) lane[l] += static_cast<R>(f(i + l));
      for (std::size_t l = 0; l < reduce_lanes && i < hi; ++i, ++l) lane[l] += static_cast<R>(f(i));  // the tail
    }
    for (std::size_t width = reduce_lanes / 2; width > 0; width /= 2)
      for (std::size_t l = 0; l < width; ++l) lane[l] += lane[l + width];
    return lane[0];
  }

 private:
  template <class M>
  static void run_chunk(const M& m, const chunk_view& t, std::size_t c) {
    for (std::uint32_t p = t.first[c]; p < t.first[c + 1]; ++p) {
      const piece pc = t.pieces[p];
      const auto f = m.bind(pc.tensor);  // a local copy, as in for_each
      const std::size_t end = pc.begin + pc.count;
      if constexpr (requires { f.range(pc.begin, end); })
        f.range(pc.begin, end);  // the functor's own loop over a range (kernels::outer_apply with eager)
      else
        for (std::size_t i = pc.begin; i < end; ++i) f(i);
    }
  }

  /// Chunk c's sum: lane l adds the elements at positions congruent to l in
  /// position order, then the lanes are added pairwise (exec/chunks.hpp).
  template <class M>
  static chunk_sum_t<M> sum_chunk(const M& m, const chunk_view& t, std::size_t c) {
    using R = chunk_sum_t<M>;
    R lane[chunk_lanes] = {};
    for (std::uint32_t p = t.first[c]; p < t.first[c + 1]; ++p) {
      const piece pc = t.pieces[p];
      const auto f = m.bind(pc.tensor);
      std::size_t j = 0;
      for (; j < pc.count && (pc.position + j) % chunk_lanes != 0; ++j)  // up to the next lane 0
        lane[(pc.position + j) % chunk_lanes] += static_cast<R>(f(pc.begin + j));
      for (; j + chunk_lanes <= pc.count; j += chunk_lanes)
        for (unsigned l = 0; l < chunk_lanes; ++l) lane[l] += static_cast<R>(f(pc.begin + j + l));
      for (; j < pc.count; ++j) lane[(pc.position + j) % chunk_lanes] += static_cast<R>(f(pc.begin + j));
    }
    for (unsigned width = chunk_lanes / 2; width > 0; width /= 2)
      for (unsigned l = 0; l < width; ++l) chunk_tree_step(lane, l, width);
    return lane[0];
  }

  int threads_ = 0;
  std::vector<double> partials_;
};

}  // namespace diloco::exec

DILOCO_EXACT_FP_END
