#pragma once

// The passes of the low-rank round (compress/low_rank.hpp) as DILOCO_HD
// functors over one tensor at a time, run by the engine's executor: in
// parallel on the host, and written so a device executor gives the same
// bits (every product and sum rounded on its own: kernels/exact_float.hpp;
// every dot product summed in one fixed order, one output per item).
// Matrices are row-major rows x cols; P is rows x r, Q is cols x r.

#include <cstddef>
#include <cstdint>

#include "diloco/core/macros.hpp"
#include "diloco/kernels/exact_float.hpp"
#include "diloco/kernels/merge.hpp"

namespace diloco::kernels::low_rank {

// Elements per partial sum of a norm: partial c covers [c * chunk, ...) of a
// tensor, summed in order in double (a float times a float is exact in
// double, so a fused multiply-add gives the same sum); the partials are
// added in order by the caller.
inline constexpr std::size_t norm_chunk = 4096;
constexpr std::size_t norm_chunks(std::size_t n) { return (n + norm_chunk - 1) / norm_chunk; }

// M = (global - local) + residual, element by element (the residual may be
// null: vectors take their delta only).
struct form_m {
  const float* global;
  const float* local;
  const float* residual;
  float* out;
  DILOCO_HD void operator()(std::size_t i) const {
    const float d = sub_rn(global[i], local[i]);
    out[i] = residual ? add_rn(d, residual[i]) : d;
  }
};

// Partial c of sum (a - b)^2 over [0, n) (b may be null: sum a^2).
struct square_partials {
  const float* a;
  const float* b;
  std::size_t n;
  double* out;
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

// P = M Q: item o = (i, c) sums M[i][j] Q[j][c] over j in order.
struct times_q {
  const float* m;
  const float* q;
  float* p;
  std::size_t cols, r;
  DILOCO_HD void operator()(std::size_t o) const {
    const std::size_t i = o / r, c = o % r;
    float s = 0.0f;
    for (std::size_t j = 0; j < cols; ++j) s = add_rn(s, mul_rn(m[i * cols + j], q[j * r + c]));
    p[o] = s;
  }
};

// Q = M^T P: item o = (j, c) sums M[i][j] P[i][c] over i in order.
struct times_p {
  const float* m;
  const float* p;
  float* q;
  std::size_t rows, cols, r;
  DILOCO_HD void operator()(std::size_t o) const {
    const std::size_t j = o / r, c = o % r;
    float s = 0.0f;
    for (std::size_t i = 0; i < rows; ++i) s = add_rn(s, mul_rn(m[i * cols + j], p[i * r + c]));
    q[o] = s;
  }
};

// (P Q^T)[i][j], summed over c in order.
DILOCO_HD DILOCO_FORCEINLINE float outer_product_at(const float* p, const float* q, std::size_t i, std::size_t j,
                                                    std::size_t r) {
  float a = 0.0f;
  for (std::size_t c = 0; c < r; ++c) a = add_rn(a, mul_rn(p[i * r + c], q[j * r + c]));
  return a;
}

// The new residual e = M - P^ Q_w^T.
struct residual_of {
  const float* m;
  const float* p;
  const float* q;
  float* out;
  std::size_t cols, r;
  DILOCO_HD void operator()(std::size_t o) const { out[o] = sub_rn(m[o], outer_product_at(p, q, o / cols, o % cols, r)); }
};

// mean[i] = (x_0[i] + x_1[i] + ... + x_{M-1}[i]) / M, in rank order.
struct segment_mean {
  const float* const* x;  // M payloads
  int world;
  float* mean;
  DILOCO_HD void operator()(std::size_t i) const {
    float s = x[0][i];
    for (int k = 1; k < world; ++k) s = add_rn(s, x[k][i]);
    mean[i] = s / static_cast<float>(world);
  }
};

// The outer step with the mean pseudo-gradient P^ Q^T of a matrix (q
// non-null) or a vector's mean (q null: p[i]), then the merge into the
// replica. `offset`: the tensor's place in the flat buffers.
template <class Update, class Merge>
struct apply_mean {
  Update update;
  Merge merge;
  const float* p;
  const float* q;
  std::size_t cols, r;
  float* global;  // the tensor's, as are local and state
  float* local;
  float* state;
  std::size_t state_stride;
  std::size_t offset;
  DILOCO_HD void operator()(std::size_t o) const {
    const float mean = q ? outer_product_at(p, q, o / cols, o % cols, r) : p[o];
    float g = global[o];
    float l = local[o];
    merge::apply_element(update, merge, offset + o, g, mean, state ? state + o : nullptr, state_stride, l);
    global[o] = g;
    local[o] = l;
  }
};

}  // namespace diloco::kernels::low_rank
