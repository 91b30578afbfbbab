// SPDX-License-Identifier: Apache-2.0
#pragma once

// The passes of the low-rank round (compress/low_rank.hpp) as DILOCO_HD
// functors, run by the engine's executor: in parallel on the host, on the
// GPU by exec::cuda, with the same bits (every product and sum rounded on
// its own: core/exact_float.hpp; every sum taken in one fixed order, one
// output per item). Matrices are row-major rows x cols; P is rows x r, Q is
// cols x r. The element passes take one tensor at a time; the
// orthonormalisation's passes take every matrix of the fragment at once.
// Bytes moved are per item (an element, an output, a lane's rows).

#include <cstddef>
#include <cstdint>

#include "diloco/core/macros.hpp"
#include "diloco/core/exact_float.hpp"
#include "diloco/kernels/merge.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::kernels::low_rank {

/// Elements per partial sum of a norm: partial c covers [c * chunk, ...) of a
/// tensor, summed in order in double (a float times a float is exact in
/// double, so a fused multiply-add gives the same sum); the partials are
/// added in order by the caller.
inline constexpr std::size_t norm_chunk = 4096;
/// The number of partials of a norm over n elements.
constexpr std::size_t norm_chunks(std::size_t n) { return (n + norm_chunk - 1) / norm_chunk; }

/// M = (global - local) + residual, element by element (the residual may be
/// null: vectors take their delta only): read 12 (8), write 4.
struct form_m {
  const float* global;    ///< theta_global (the tensor's)
  const float* local;     ///< the replica
  const float* residual;  ///< the residual (null: none)
  float* out;             ///< M, written
  /// Element i.
  DILOCO_HD void operator()(std::size_t i) const {
    const float d = sub_rn(global[i], local[i]);
    out[i] = residual ? add_rn(d, residual[i]) : d;
  }
};

/// Partial c of sum (a - b)^2 over [0, n) (b may be null: sum a^2): read
/// 8 (4) per element, write 8 per partial.
struct square_partials {
  const float* a;  ///< a
  const float* b;  ///< b (null: sum a^2)
  std::size_t n;   ///< the elements
  double* out;     ///< out[c]: partial c, written
  /// Partial c.
  DILOCO_HD void operator()(std::size_t c) const {
    const std::size_t end = (c + 1) * norm_chunk < n ? (c + 1) * norm_chunk : n;
    double s = 0.0;
    for (std::size_t i = c * norm_chunk; i < end; ++i) {
      const double d = b ? static_cast<double>(sub_rn(a[i], b[i])) : static_cast<double>(a[i]);
      s += d * d;
    }
    out[c] = s;
  }
};

/// P = M Q: item o = (i, c) sums M[i][j] Q[j][c] over j in order: read
/// 8 cols (row i of M, column c of Q), write 4. The r outputs of a row read
/// the same row of M, and neighbouring rows' outputs the same Q, so caches
/// serve most of it: memory traffic is about 4 rows cols + 4 cols r.
struct times_q {
  const float* m;  ///< M, rows x cols
  const float* q;  ///< Q, cols x r
  float* p;        ///< P, rows x r, written
  ///@{
  /// Columns of M, and the rank r.
  std::size_t cols, r;
  ///@}
  /// Output o = (i, c) = (o / r, o % r).
  DILOCO_HD void operator()(std::size_t o) const {
    const std::size_t i = o / r, c = o % r;
    float s = 0.0f;
    for (std::size_t j = 0; j < cols; ++j) s = add_rn(s, mul_rn(m[i * cols + j], q[j * r + c]));
    p[o] = s;
  }
};

/// Q = M^T P: item o = (j, c) sums M[i][j] P[i][c] over i in order: read
/// 8 rows, write 4 (neighbouring items read neighbouring columns of M).
struct times_p {
  const float* m;  ///< M, rows x cols
  const float* p;  ///< P, rows x r
  float* q;        ///< Q, cols x r, written
  ///@{
  /// M's shape, and the rank r.
  std::size_t rows, cols, r;
  ///@}
  /// Output o = (j, c) = (o / r, o % r).
  DILOCO_HD void operator()(std::size_t o) const {
    const std::size_t j = o / r, c = o % r;
    float s = 0.0f;
    for (std::size_t i = 0; i < rows; ++i) s = add_rn(s, mul_rn(m[i * cols + j], p[i * r + c]));
    q[o] = s;
  }
};

/// (P Q^T)[i][j], summed over c in order.
DILOCO_HD DILOCO_FORCEINLINE float outer_product_at(const float* p, const float* q, std::size_t i, std::size_t j,
                                                    std::size_t r) {
  float a = 0.0f;
  for (std::size_t c = 0; c < r; ++c) a = add_rn(a, mul_rn(p[i * r + c], q[j * r + c]));
  return a;
}

/// The new residual e = M - P^ Q_w^T: read 4 + 8 r (P and Q rows, cached),
/// write 4.
struct residual_of {
  const float* m;  ///< M, rows x cols
  const float* p;  ///< P^, rows x r
  const float* q;  ///< Q_w, cols x r
  float* out;      ///< the new residual, written
  ///@{
  /// Columns of M, and the rank r.
  std::size_t cols, r;
  ///@}
  /// Element o of the matrix (row o / cols, column o % cols).
  DILOCO_HD void operator()(std::size_t o) const { out[o] = sub_rn(m[o], outer_product_at(p, q, o / cols, o % cols, r)); }
};

/// mean[i] = (x_0[i] + x_1[i] + ... + x_{M-1}[i]) / M, in rank order: read
/// 4 M, write 4.
struct segment_mean {
  const float* const* x;  ///< M payloads
  int world;              ///< M
  float* mean;            ///< the mean, written
  /// Element i.
  DILOCO_HD void operator()(std::size_t i) const {
    float s = x[0][i];
    for (int k = 1; k < world; ++k) s = add_rn(s, x[k][i]);
    mean[i] = s / static_cast<float>(world);
  }
};

/// The outer step with the mean pseudo-gradient P^ Q^T of a matrix (q
/// non-null) or a vector's mean (q null: p[i]), then the merge into the
/// replica. `offset`: the tensor's place in the flat buffers. Read 8 + 8 r
/// (P and Q rows, cached) + the update's state, write 8 + the state.
template <class Update, class Merge>
struct apply_mean {
  Update update;   ///< the outer optimizer's element step
  Merge merge;     ///< how theta_global reaches the replica, indexed in the flat layout
  const float* p;  ///< the mean P^ (or a vector's mean)
  const float* q;  ///< the mean Q (null: a vector)
  ///@{
  /// Columns of the matrix, and the rank r.
  std::size_t cols, r;
  ///@}
  float* global;  ///< the tensor's, as are local and state
  float* local;   ///< the replica
  float* state;   ///< the outer optimizer's slots (null when it keeps none)
  std::size_t state_stride;  ///< elements between an element's slots
  std::size_t offset;  ///< the tensor's place in the flat buffers (the merge's index)
  /// Element o of the tensor.
  DILOCO_HD void operator()(std::size_t o) const {
    const float mean = q ? outer_product_at(p, q, o / cols, o % cols, r) : p[o];
    float g = global[o];
    float l = local[o];
    merge::apply_element(update, merge, offset + o, g, mean, state ? state + o : nullptr, state_stride, l);
    global[o] = g;
    local[o] = l;
  }
};

// ------------------------------------------------------- orthonormalisation
// Modified Gram-Schmidt in double over the r columns of every matrix's mean
// P at once, as a sequence of passes (compress/low_rank.hpp runs them):
//   for c in 0..r-1:
//     load_column(c)                 x = column c of P, before = |x|^2
//     gram_schmidt_step(c, j)        j = 0..c-1: x -= (q_{j-1} . x) q_{j-1};
//                                    then the next dot product, q_j . x
//     gram_schmidt_step(c, c)        x -= (q_{c-1} . x) q_{c-1}; |x|^2
//     scale_column(c)                q_c = x / |x|, or 0 when |x| <= 1e-6 |P_c|
// A dropped column is zero, so later projections onto it subtract nothing
// and P^ P^T projects onto the span of the kept columns. Every sum over the
// rows of a matrix is taken in `gram_schmidt_lanes` lanes: lane l adds rows
// l, l + lanes, l + 2 lanes, ... in order, then the lanes are added
// pairwise (lane_total); one item is one lane of one matrix, so a pass has
// (matrices x lanes) items, and every item of a matrix recomputes the
// previous pass's total from its lanes (deterministic, no extra launch).
// Passes per round: r (r + 5) / 2, whatever the number of matrices.

/// Lanes of every sum over a matrix's rows (a pass's items per matrix).
inline constexpr std::size_t gram_schmidt_lanes = 64;

/// One matrix's P in the orthonormalisation.
struct factor_matrix {
  std::uint64_t rows;      ///< rows of the matrix
  std::uint64_t p_at;      ///< its P (rows x r, row-major) in the mean P
  std::uint64_t basis_at;  ///< its columns in double: column c at basis_at + c rows
};

/// What the passes share: P, the columns in double, and three lane sums per
/// matrix (|column|^2 as loaded, and two for the running sums, used in turn).
struct gram_schmidt {
  const factor_matrix* mats;  ///< the matrices
  float* p;        ///< the mean P of every matrix
  double* basis;   ///< every matrix's columns, in double
  double* before;  ///< matrices x lanes
  double* sums;    ///< 2 x matrices x lanes
  ///@{
  /// The number of matrices, and the rank r.
  std::size_t matrices, r;
  ///@}

  /// A pass's item: lane l of matrix k.
  struct lane {
    ///@{
    /// The matrix and the lane.
    std::size_t k, l;
    ///@}
    factor_matrix m;  ///< matrix k
  };
  /// The lane an item stands for.
  DILOCO_HD DILOCO_FORCEINLINE lane lane_of(std::size_t item) const {
    return {item / gram_schmidt_lanes, item % gram_schmidt_lanes, mats[item / gram_schmidt_lanes]};
  }
  /// Column c of matrix m, in double.
  DILOCO_HD DILOCO_FORCEINLINE double* column(const factor_matrix& m, std::size_t c) const {
    return basis + m.basis_at + c * m.rows;
  }
  /// Running-sum buffer `buf` (0 or 1) of matrix k.
  DILOCO_HD DILOCO_FORCEINLINE double* lanes_of(std::size_t buf, std::size_t k) const {
    return sums + (buf * matrices + k) * gram_schmidt_lanes;
  }
};

/// The lanes of a sum added pairwise: lanes/2 sums of two, then of four, ...
DILOCO_HD DILOCO_FORCEINLINE double lane_total(const double* lane) {
  double s[gram_schmidt_lanes];
  for (std::size_t l = 0; l < gram_schmidt_lanes; ++l) s[l] = lane[l];
  for (std::size_t width = gram_schmidt_lanes / 2; width > 0; width /= 2)
    for (std::size_t l = 0; l < width; ++l) s[l] = add_rn(s[l], s[l + width]);
  return s[0];
}

/// Column c of P into the basis (double), and its lane of |column|^2: read 4,
/// write 8 per row; write 8 per item.
struct load_column {
  gram_schmidt g;  ///< what the passes share
  std::size_t c;   ///< the column
  /// Item: one lane of one matrix.
  DILOCO_HD void operator()(std::size_t item) const {
    const auto [k, l, m] = g.lane_of(item);
    double* x = g.column(m, c);
    double acc = 0.0;
    for (std::size_t i = l; i < m.rows; i += gram_schmidt_lanes) {
      const double v = static_cast<double>(g.p[m.p_at + i * g.r + c]);
      x[i] = v;
      acc = add_rn(acc, mul_rn(v, v));
    }
    g.before[k * gram_schmidt_lanes + l] = acc;
  }
};

/// Step j of column c: subtract the projection onto q_{j-1} (its dot product
/// is the previous step's lanes, in buffer (j - 1) % 2), then this lane of
/// q_j . x (j < c) or of |x|^2 (j == c) into buffer j % 2. Read 16 and
/// write 8 per row to subtract, read 16 (8) per row to sum; read 64 lanes x 8
/// and write 8 per item.
struct gram_schmidt_step {
  gram_schmidt g;  ///< what the passes share
  ///@{
  /// The column c, and the step j.
  std::size_t c, j;
  ///@}
  /// Item: one lane of one matrix.
  DILOCO_HD void operator()(std::size_t item) const {
    const auto [k, l, m] = g.lane_of(item);
    double* x = g.column(m, c);
    if (j > 0) {
      const double dot = lane_total(g.lanes_of((j - 1) % 2, k));
      const double* q = g.column(m, j - 1);
      for (std::size_t i = l; i < m.rows; i += gram_schmidt_lanes) x[i] = sub_rn(x[i], mul_rn(dot, q[i]));
    }
    const double* y = j < c ? g.column(m, j) : x;
    double acc = 0.0;
    for (std::size_t i = l; i < m.rows; i += gram_schmidt_lanes) acc = add_rn(acc, mul_rn(y[i], x[i]));
    g.lanes_of(j % 2, k)[l] = acc;
  }
};

/// q_c = x / |x| into the basis and P (as float), or zeros when x is
/// (numerically) in the span of the columns before it. Read 8, write 12 per
/// row; read 2 x 64 lanes x 8 per item.
struct scale_column {
  gram_schmidt g;  ///< what the passes share
  std::size_t c;   ///< the column
  /// Item: one lane of one matrix.
  DILOCO_HD void operator()(std::size_t item) const {
    const auto [k, l, m] = g.lane_of(item);
    const double norm = sqrt_rn(lane_total(g.lanes_of(c % 2, k)));
    const double before = lane_total(g.before + k * gram_schmidt_lanes);
    const bool keep = norm > mul_rn(1e-6, sqrt_rn(before)) && norm > 0.0;
    double* x = g.column(m, c);
    for (std::size_t i = l; i < m.rows; i += gram_schmidt_lanes) {
      const double v = keep ? div_rn(x[i], norm) : 0.0;
      x[i] = v;
      g.p[m.p_at + i * g.r + c] = static_cast<float>(v);
    }
  }
};

/// Runs the orthonormalisation's passes on `exec`.
template <class Exec>
void orthonormalise(Exec& exec, const gram_schmidt& g) {
  const std::size_t items = g.matrices * gram_schmidt_lanes;
  if (items == 0) return;
  for (std::size_t c = 0; c < g.r; ++c) {
    exec.for_each(items, load_column{g, c});
    for (std::size_t j = 0; j <= c; ++j) exec.for_each(items, gram_schmidt_step{g, c, j});
    exec.for_each(items, scale_column{g, c});
  }
}

}  // namespace diloco::kernels::low_rank

DILOCO_EXACT_FP_END
