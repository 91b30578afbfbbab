#pragma once

// PowerSGD-style low-rank compression (Vogels et al. 2019; hivemind and
// DiLoCoX use it for pseudo-gradients). For every 2-D tensor (tensor_traits
// rows x cols) with rank r < min(rows, cols), each worker w holds
//   M_w = delta_w + e_w                     (error feedback, always on)
// and one round is
//   1. P_w = M_w Q                  rows x r    (Q: warm-started, the same on every rank)
//   2. P = mean_w P_w               all-gather of the P_w, summed in rank order
//   3. P^ = orthonormalise(P)       modified Gram-Schmidt, in double, the same on every rank
//   4. Q_w = M_w^T P^               cols x r
//   5. Q = mean_w Q_w               all-gather, summed in rank order
//   6. the mean pseudo-gradient is P^ Q^T; e_w <- M_w - P^ Q_w^T; Q is the next round's start
// Tensors that are vectors (or too small for the rank) travel exactly, in
// fp32, in the first exchange (the fallback). Both exchanges are segments
// with the wire header (codec id low_rank, block size = r) and checksum,
// validated before use; the round ends with the usual vote.
// Bytes per round and worker: 4 r (rows + cols) per matrix plus 4 n per vector.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/compress/compressed_mean.hpp"
#include "diloco/compress/formats.hpp"
#include "diloco/compress/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/kernels/low_rank_passes.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/random.hpp"
#include "diloco/tensor/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"

namespace diloco::compress {

struct low_rank_options {
  std::uint32_t rank = 4;  // r: columns of P and Q, >= 1
  std::uint64_t seed = 0;  // Q's first value (a normal draw per element)
  template <class F>
  friend void visit_options(const low_rank_options& o, F&& f) {
    f("rank", o.rank);
    f("seed", o.seed);
  }
};

// The policy. Error feedback is built in (PowerSGD needs it).
struct low_rank {
  using options = low_rank_options;
  static constexpr const char* name = "low_rank";
  static constexpr bool lossless = false;
  static constexpr bool has_error_feedback = true;
  static constexpr bool stochastic = false;
  static constexpr bool factored = true;  // its own reducer (reduce/factored.hpp), no block codec
  static void validate(const options& o) {
    if (o.rank < 1 || o.rank > 4096) detail::raise<config_error>("low_rank: rank must lie in [1, 4096], got ", o.rank);
  }
};

namespace detail_low_rank {

// A standard normal from (seed, index): Box-Muller on two counter draws.
inline float normal(std::uint64_t seed, std::uint64_t i) {
  const double u1 = (static_cast<double>(kernels::mix64(seed ^ (2 * i)) >> 11) + 1.0) * 0x1p-53;
  const double u2 = static_cast<double>(kernels::mix64(seed ^ (2 * i + 1)) >> 11) * 0x1p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// Orthonormalises the r columns of the row-major rows x r matrix p in place
// (modified Gram-Schmidt in double). A column that is (numerically) in the
// span of the ones before it becomes zero, so P^ P^T projects onto the span.
inline void orthonormalise(float* p, std::size_t rows, std::size_t r) {
  std::vector<double> col(rows);
  std::vector<std::vector<double>> done;
  for (std::size_t c = 0; c < r; ++c) {
    double before = 0.0;
    for (std::size_t i = 0; i < rows; ++i) col[i] = p[i * r + c], before += col[i] * col[i];
    for (const auto& q : done) {
      double dot = 0.0;
      for (std::size_t i = 0; i < rows; ++i) dot += q[i] * col[i];
      for (std::size_t i = 0; i < rows; ++i) col[i] -= dot * q[i];
    }
    double norm = 0.0;
    for (std::size_t i = 0; i < rows; ++i) norm += col[i] * col[i];
    norm = std::sqrt(norm);
    const bool keep = norm > 1e-6 * std::sqrt(before) && norm > 0.0;
    for (std::size_t i = 0; i < rows; ++i) col[i] = keep ? col[i] / norm : 0.0;
    for (std::size_t i = 0; i < rows; ++i) p[i * r + c] = static_cast<float>(col[i]);
    if (keep) done.push_back(col);
  }
}

}  // namespace detail_low_rank

template <class Space>
class low_rank_mean : public diloco::detail::host_ballot {
  static_assert(std::is_same_v<Space, host_space>, "low_rank has no device form yet: keep its parameters in host memory");

 public:
  low_rank_mean(const parameter_set<float, Space>& params, int world, int rank, const low_rank_options& opts,
                std::uint32_t fragment = 0)
      : host_ballot(world), r_(opts.rank), world_(world), rank_(rank), fragment_(fragment) {
    low_rank::validate(opts);
    std::size_t p_floats = 0, q_floats = 0, q_state = 0;
    for (std::size_t k = 0; k < params.count(); ++k) {
      const tensor_shape s = params.shape(k);
      const std::size_t n = params[k].size();
      total_elements_ += n;
      if (s.is_matrix() && r_ < std::min(s.rows, s.cols)) {
        mats_.push_back({k, s.rows, s.cols, params.offset(k), params[k].data(), p_floats, q_floats, q_state});
        p_floats += s.rows * r_;
        q_floats += s.cols * r_;
        q_state += s.cols * r_;
      } else {
        vecs_.push_back({k, n, params.offset(k), params[k].data(), 0});
      }
    }
    for (auto& v : vecs_) v.at = p_floats, p_floats += v.n;
    std::size_t partials = 0;
    for (auto& t : mats_) t.norm_at = partials, partials += kernels::low_rank::norm_chunks(t.rows * t.cols);
    for (auto& v : vecs_) v.norm_at = partials, partials += kernels::low_rank::norm_chunks(v.n);
    partials_.assign(partials, 0.0);
    sources_.assign(static_cast<std::size_t>(world), nullptr);
    p_floats_ = p_floats;
    q_floats_ = q_floats;
    slot1_ = (wire::header_bytes + 4 * p_floats_ + 63) / 64 * 64;
    slot2_ = (wire::header_bytes + 4 * q_floats_ + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world);
    send1_ = host_buffer<std::byte>(slot1_);
    send2_ = host_buffer<std::byte>(slot2_);
    gathered1_ = host_buffer<std::byte>(m * slot1_);
    gathered2_ = host_buffer<std::byte>(m * slot2_);
    residual_ = host_buffer<float>(params.total());
    next_residual_ = host_buffer<float>(params.total());
    work_ = host_buffer<float>(params.total());
    q_ = host_buffer<float>(q_state);
    p_mean_.assign(p_floats_, 0.0f);
    q_mean_.assign(q_floats_, 0.0f);
    for (std::size_t i = 0; i < q_state; ++i) q_[i] = detail_low_rank::normal(opts.seed ^ 0x6c6f775f72616e6bULL, i);
  }

  std::size_t slot_bytes() const { return std::max(slot1_, slot2_); }
  std::span<const float> residual() const { return {residual_.data(), residual_.size()}; }
  // The residual and the warm-started Q are state.
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    v.buffer(std::string(prefix) + ".residual", residual_.data(), residual_.size(), false);
    v.buffer(std::string(prefix) + ".low_rank_q", q_.data(), q_.size(), false);
  }

  // 1. M = delta + residual; P_w = M Q; vectors' deltas; segment 1.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    namespace lr = kernels::low_rank;
    open_round();
    round_ = round;
    float* p = payload(send1_.data());
    for (const auto& t : mats_) {
      const std::size_t n = t.rows * t.cols;
      exec.for_each(n, lr::form_m{global + t.offset, t.local, residual_.data() + t.offset, work_.data() + t.offset});
      exec.for_each(lr::norm_chunks(n), lr::square_partials{global + t.offset, t.local, n, partials_.data() + t.norm_at});
      exec.for_each(t.rows * r_, lr::times_q{work_.data() + t.offset, q_.data() + t.q_state, p + t.p_at, t.cols, r_});
    }
    for (const auto& v : vecs_) {
      exec.for_each(v.n, lr::form_m{global + v.offset, v.local, nullptr, p + v.at});
      exec.for_each(lr::norm_chunks(v.n), lr::square_partials{p + v.at, nullptr, v.n, partials_.data() + v.norm_at});
    }
    out_.delta_norm = std::sqrt(sum_partials());
    wire::write_header(send1_.data(), header(1, rank_, static_cast<float>(out_.delta_norm)));
    out_.encoded_bytes = wire::header_bytes + 4 * p_floats_;
  }
  const std::byte* send1() const { return send1_.data(); }
  std::byte* gathered1() { return gathered1_.data(); }
  std::size_t slot1() const { return slot1_; }
  template <class Exec>
  void self_gather1(Exec&) {
    std::memcpy(gathered1_.data(), send1_.data(), slot1_);
  }

  // 2-4. validate and average the P's, orthonormalise, Q_w = M^T P^; segment 2.
  template <class Exec>
  void second(Exec& exec) {
    namespace lr = kernels::low_rank;
    sum_segments(exec, gathered1_.data(), slot1_, p_floats_, 1, p_mean_);
    for (const auto& t : mats_) detail_low_rank::orthonormalise(p_mean_.data() + t.p_at, t.rows, r_);
    float* q = payload(send2_.data());
    for (const auto& t : mats_)
      exec.for_each(t.cols * r_, lr::times_p{work_.data() + t.offset, p_mean_.data() + t.p_at, q + t.q_at, t.rows,
                                             t.cols, r_});
    // The local error e_w = M_w - P^ Q_w^T (and its norm).
    for (const auto& t : mats_) {
      const std::size_t n = t.rows * t.cols;
      exec.for_each(n, lr::residual_of{work_.data() + t.offset, p_mean_.data() + t.p_at, q + t.q_at,
                                       next_residual_.data() + t.offset, t.cols, r_});
      exec.for_each(lr::norm_chunks(n), lr::square_partials{next_residual_.data() + t.offset, nullptr, n,
                                                            partials_.data() + t.norm_at});
    }
    for (const auto& v : vecs_) std::fill_n(partials_.data() + v.norm_at, lr::norm_chunks(v.n), 0.0);
    out_.error_norm = std::sqrt(sum_partials());
    wire::write_header(send2_.data(), header(2, rank_, static_cast<float>(out_.delta_norm)));
    out_.encoded_bytes += wire::header_bytes + 4 * q_floats_;
  }
  const std::byte* send2() const { return send2_.data(); }
  std::byte* gathered2() { return gathered2_.data(); }
  std::size_t slot2() const { return slot2_; }
  template <class Exec>
  void self_gather2(Exec&) {
    std::memcpy(gathered2_.data(), send2_.data(), slot2_);
  }

  // 5. validate and average the Q's; cast the vote.
  template <class Exec>
  void check_gathered(Exec& exec) {
    sum_segments(exec, gathered2_.data(), slot2_, q_floats_, 2, q_mean_);
    if (found_.local_problem.empty() && found_.bad_senders.empty()) {
      bool finite = true;
      for (float x : p_mean_) finite = finite && std::isfinite(x);
      for (float x : q_mean_) finite = finite && std::isfinite(x);
      if (!finite) found_.bad_shards = "the low-rank factors";
    }
    cast(rank_);
  }
  // Then vote_data() summed over the ranks, and result().

  // 6. the mean P^ Q^T (and the vectors' mean), outer step, merge; keep the
  // residual and warm-start Q with the mean Q.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    using pass = kernels::low_rank::apply_mean<Update, Merge>;
    auto at = [&](std::size_t off) { return state ? state + off : nullptr; };
    for (const auto& t : mats_) {
      exec.for_each(t.rows * t.cols, pass{update, merge, p_mean_.data() + t.p_at, q_mean_.data() + t.q_at, t.cols, r_,
                                          global + t.offset, t.local, at(t.offset), state_stride, t.offset});
      std::memcpy(q_.data() + t.q_state, q_mean_.data() + t.q_at, 4 * t.cols * r_);
    }
    for (const auto& v : vecs_)
      exec.for_each(v.n, pass{update, merge, p_mean_.data() + v.at, nullptr, 1, r_, global + v.offset, v.local,
                              at(v.offset), state_stride, v.offset});
    std::swap(residual_, next_residual_);
  }

 private:
  struct matrix {
    std::size_t tensor, rows, cols, offset;
    float* local;
    std::size_t p_at, q_at, q_state;
    std::size_t norm_at = 0;  // its first partial of a norm
  };
  struct vector_part {
    std::size_t tensor, n, offset;
    float* local;
    std::size_t at;
    std::size_t norm_at = 0;
  };

  // The norm partials of every tensor (kernels::low_rank::square_partials),
  // added in order.
  double sum_partials() const {
    double total = 0.0;
    for (double x : partials_) total += x;
    return total;
  }

  static float* payload(std::byte* seg) { return reinterpret_cast<float*>(seg + wire::header_bytes); }

  // Exchange 1 carries P (and the vectors), exchange 2 carries Q; the
  // exchange number goes into the round field's top bit so a segment of
  // the other exchange is refused.
  wire::header header(int exchange, int sender, float norm) const {
    const std::uint64_t floats = exchange == 1 ? p_floats_ : q_floats_;
    return {codec_id::low_rank, wire::flag_error_feedback, r_, static_cast<std::uint32_t>(sender), total_elements_,
            4 * floats, round_ | (exchange == 2 ? (std::uint64_t{1} << 63) : 0), norm, 0, fragment_};
  }

  // Validates the M segments of an exchange and sums their floats in rank
  // order, divided by M, into `mean`.
  template <class Exec>
  void sum_segments(Exec& exec, const std::byte* all, std::size_t slot, std::size_t floats, int exchange,
                    std::vector<float>& mean) {
    std::fill(mean.begin(), mean.end(), 0.0f);
    if (!found_.local_problem.empty()) return;
    for (int k = 0; k < world_; ++k) {
      const std::byte* seg = all + static_cast<std::size_t>(k) * slot;
      const std::string where = diloco::detail::concat("low-rank round ", round_, ", ", exchange == 1 ? "P" : "Q",
                                                       " segment from rank ", k, " on rank ", rank_);
      try {
        const auto h = wire::read_header(std::span<const std::byte>(seg, slot),
                                         wire::expectation::of(header(exchange, k, 0.0f)),
                                         where.c_str());
        if (exchange == 1) found_.sender(h, k);
      } catch (const format_error& e) {
        found_.local_problem = e.what();
        std::fill(mean.begin(), mean.end(), 0.0f);
        return;
      }
      sources_[static_cast<std::size_t>(k)] = reinterpret_cast<const float*>(seg + wire::header_bytes);
    }
    exec.for_each(floats, kernels::low_rank::segment_mean{sources_.data(), world_, mean.data()});
  }

  std::uint32_t r_;
  int world_;
  int rank_;
  std::uint32_t fragment_;
  std::vector<matrix> mats_;
  std::vector<vector_part> vecs_;
  std::uint64_t total_elements_ = 0;
  std::size_t p_floats_ = 0, q_floats_ = 0, slot1_ = 0, slot2_ = 0;
  host_buffer<std::byte> send1_, send2_, gathered1_, gathered2_;
  host_buffer<float> residual_, next_residual_, work_, q_;
  std::vector<float> p_mean_, q_mean_;
  std::vector<double> partials_;
  std::vector<const float*> sources_;
  std::uint64_t round_ = 0;
};

}  // namespace diloco::compress
