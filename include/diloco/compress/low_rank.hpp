// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "diloco/compress/device_segments.hpp"
#include "diloco/codec/formats.hpp"
#include "diloco/compress/round_state.hpp"
#include "diloco/codec/segment.hpp"
#include "diloco/codec/wire_format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/exec/cuda/team_plan.hpp"
#include "diloco/exec/host.hpp"
#include "diloco/kernels/low_rank_passes.hpp"
#include "diloco/kernels/merge.hpp"
#include "diloco/kernels/pseudo_gradient.hpp"
#include "diloco/core/random.hpp"
#include "diloco/kernels/wire_passes.hpp"
#include "diloco/memory/buffer.hpp"
#include "diloco/tensor/parameter_set.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::compress {

/// The options of low_rank.
struct low_rank_options {
  std::uint32_t rank = 4;  ///< r: columns of P and Q, >= 1
  std::uint64_t seed = 0;  ///< Q's first value (a normal draw per element)
  /// Every field by name (core/options.hpp's visit_options customisation point).
  template <class F>
  friend void visit_options(const low_rank_options& o, F&& f) {
    f("rank", o.rank);
    f("seed", o.seed);
  }
};

}  // namespace diloco::compress

namespace diloco::reduce {
template <class Compressor, class Comm, class Space, class Exec>
class factored;
}  // namespace diloco::reduce

namespace diloco::compress {

/// PowerSGD-style low-rank compression (Vogels et al. 2019; hivemind and
/// DiLoCoX use it for pseudo-gradients). For every 2-D tensor (tensor_traits
/// rows x cols) with rank r < min(rows, cols), each worker w holds
/// ```
/// M_w = delta_w + e_w                     (error feedback, always on)
/// ```
/// and one round is
/// ```
/// 1. P_w = M_w Q                  rows x r    (Q: warm-started, the same on every rank)
/// 2. P = mean_w P_w               all-gather of the P_w, summed in rank order
/// 3. P^ = orthonormalise(P)       modified Gram-Schmidt, in double, the same on every rank
/// 4. Q_w = M_w^T P^               cols x r
/// 5. Q = mean_w Q_w               all-gather, summed in rank order
/// 6. the mean pseudo-gradient is P^ Q^T; e_w <- M_w - P^ Q_w^T; Q is the next round's start
/// ```
/// Tensors that are vectors (or too small for the rank) travel exactly, in
/// fp32, in the first exchange (the fallback). Both exchanges are segments
/// with the wire header (codec id low_rank, block size = r) and checksum,
/// validated before use; the round ends with the usual vote.
/// Bytes per round and worker: 4 r (rows + cols) per matrix plus 4 n per vector.
///
/// One engine for host and device tensors (low_rank_mean<Space>): every pass
/// is a DILOCO_HD functor of kernels/low_rank_passes.hpp run by the
/// executor, the orthonormalisation included, with every buffer in the
/// parameters' memory space. Only the segments' headers differ by space: on
/// the host they are written and read in place; on the device the payload
/// checksums are computed there and only the 64-byte headers, the checksum
/// sums and the norms' partials come to the host (device_segments.hpp's
/// device_headers), which writes and validates the same headers. So host and
/// device workers put the same bytes on the wire and can share a round.
/// Memory beyond the three replica-sized buffers (M, two residuals): the
/// segments (M + 1 slots per exchange), the mean P and Q, Q, 8 r rows per
/// matrix (the columns in double) and 1.5 KB per matrix (the lane sums).
struct low_rank {
  using options = low_rank_options;  ///< the rank r and Q's seed
  /// The compressor's name in checkpoint headers, messages and reports.
  static constexpr const char* name = "low_rank";
  static constexpr bool lossless = false;  ///< values change on the way
  static constexpr bool has_error_feedback = true;  ///< the residual is built in
  static constexpr bool stochastic = false;  ///< deterministic
  static constexpr bool factored = true;  ///< its own reducer, no block codec
  /// Its reducer: the factor exchanges of reduce/factored.hpp (declared
  /// here, defined there; reduce/select.hpp includes it).
  template <class Comm, class Space, class Exec>
  using reducer = reduce::factored<low_rank, Comm, Space, Exec>;
  /// Throws config_error unless rank is in [1, 4096].
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

template <class Space>
using ballot = device_detail::space_ballot<Space>;

}  // namespace detail_low_rank

/// The engine of the low-rank round over tensors in memory space Space (the steps of
/// low_rank's description), run by reduce::factored.
template <class Space>
class low_rank_mean : public detail_low_rank::ballot<Space> {
  static constexpr bool on_device = !std::is_same_v<Space, host_space>;
  using ballot = detail_low_rank::ballot<Space>;
  template <class T>
  using space_buffer = buffer<T, Space>;

 public:
  /// The host form (reduce::staged builds host engines without an executor).
  low_rank_mean(const parameter_set<float, Space>& params, int world, int rank, const low_rank_options& opts,
                std::uint32_t fragment = 0)
    requires(!on_device)
      : ballot(world), r_(opts.rank), world_(world), rank_(rank), fragment_(fragment) {
    exec::host uploads(1);
    build(params, opts, uploads);
  }
  /// Any space: `exec` uploads the tables and Q's first value.
  template <class Exec>
  low_rank_mean(const parameter_set<float, Space>& params, int world, int rank, const low_rank_options& opts,
                Exec& exec, std::uint32_t fragment = 0)
      : ballot(world), r_(opts.rank), world_(world), rank_(rank), fragment_(fragment) {
    build(params, opts, exec);
  }

  /// The larger of the two exchanges' slots: a rank's segment, header included.
  std::size_t slot_bytes() const { return std::max(slot1_, slot2_); }
  /// The residual in the flat layout, in the parameters' space.
  auto residual() const {
    if constexpr (on_device)
      return tensor_view<const float, Space>{residual_.data(), residual_.size()};
    else
      return std::span<const float>{residual_.data(), residual_.size()};
  }
  /// The residual and the warm-started Q are state.
  template <class Visitor>
  void visit_state(Visitor& v, std::string_view prefix) {
    v.buffer(std::string(prefix) + ".residual", residual_.data(), residual_.size(), on_device);
    v.buffer(std::string(prefix) + ".low_rank_q", q_.data(), q_.size(), on_device);
  }

  /// 1. M = delta + residual; P_w = M Q; vectors' deltas; segment 1.
  template <class Exec>
  void encode(Exec& exec, const float* global, std::uint64_t round) {
    namespace lr = kernels::low_rank;
    this->open_round();
    round_ = round;
    float* p = payload(send1_.data());
    for (const auto& t : mats_) {
      const std::size_t n = t.rows * t.cols;
      exec.for_each(n, lr::form_m{global + t.offset, t.local, residual_.data() + t.offset, work_.data() + t.offset});
      exec.for_each(lr::norm_chunks(n), lr::square_partials{global + t.offset, t.local, n, partials_.data() + t.norm_at});
      exec.for_each(t.rows * r_, lr::times_q{work_.data() + t.offset, q_.data() + t.q_at, p + t.p_at, t.cols, r_});
    }
    for (const auto& v : vecs_) {
      exec.for_each(v.n, lr::form_m{global + v.offset, v.local, nullptr, p + v.at});
      exec.for_each(lr::norm_chunks(v.n), lr::square_partials{p + v.at, nullptr, v.n, partials_.data() + v.norm_at});
    }
    out_.delta_norm = std::sqrt(sum_partials(exec, host_partials_.size()));
    seal(exec, 1, header(1, rank_, static_cast<float>(out_.delta_norm)));
    out_.encoded_bytes = wire::header_bytes + 4 * p_floats_;
  }
  ///@{
  /// Exchange 1: this rank's segment (P and the vectors), the M gathered slots, the slot size;
  /// in a world of one the segment is copied to the gathered slot.
  const std::byte* send1() const { return send1_.data(); }
  std::byte* gathered1() { return gathered1_.data(); }
  std::size_t slot1() const { return slot1_; }
  template <class Exec>
  void self_gather1(Exec& exec) {
    exec.copy(gathered1_.data(), send1_.data(), slot1_);
  }
  ///@}

  /// 2-4. validate and average the P's, orthonormalise, Q_w = M^T P^; segment 2.
  template <class Exec>
  void second(Exec& exec) {
    namespace lr = kernels::low_rank;
    mean_of(exec, 1);
    lr::orthonormalise(exec, lr::gram_schmidt{factors_.data(), p_mean_.data(), basis_.data(), before_.data(),
                                              sums_.data(), mats_.size(), r_});
    float* q = payload(send2_.data());
    for (const auto& t : mats_)
      exec.for_each(t.cols * r_, lr::times_p{work_.data() + t.offset, p_mean_.data() + t.p_at, q + t.q_at, t.rows,
                                             t.cols, r_});
    // The local error e_w = M_w - P^ Q_w^T (and its norm: the matrices'
    // partials, which come first; vectors travel exactly).
    for (const auto& t : mats_) {
      const std::size_t n = t.rows * t.cols;
      exec.for_each(n, lr::residual_of{work_.data() + t.offset, p_mean_.data() + t.p_at, q + t.q_at,
                                       next_residual_.data() + t.offset, t.cols, r_});
      exec.for_each(lr::norm_chunks(n), lr::square_partials{next_residual_.data() + t.offset, nullptr, n,
                                                            partials_.data() + t.norm_at});
    }
    out_.error_norm = std::sqrt(sum_partials(exec, matrix_partials_));
    seal(exec, 2, header(2, rank_, static_cast<float>(out_.delta_norm)));
    out_.encoded_bytes += wire::header_bytes + 4 * q_floats_;
  }
  ///@{
  /// Exchange 2: this rank's segment (Q), the M gathered slots, the slot size; in a world of one
  /// the segment is copied to the gathered slot.
  const std::byte* send2() const { return send2_.data(); }
  std::byte* gathered2() { return gathered2_.data(); }
  std::size_t slot2() const { return slot2_; }
  template <class Exec>
  void self_gather2(Exec& exec) {
    exec.copy(gathered2_.data(), send2_.data(), slot2_);
  }
  ///@}

  /// 5. validate and average the Q's; cast the vote.
  template <class Exec>
  void check_gathered(Exec& exec) {
    mean_of(exec, 2);
    if (found_.local_problem.empty() && found_.bad_senders.empty()) {
      const double bad = exec.transform_reduce(p_floats_, kernels::count_non_finite{p_mean_.data()}) +
                         exec.transform_reduce(q_floats_, kernels::count_non_finite{q_mean_.data()});
      if (bad != 0.0) found_.bad_shards = "the low-rank factors";
    }
    if constexpr (on_device)
      this->cast(exec, rank_);
    else
      this->cast(rank_);
  }
  // Then vote_data() summed over the ranks, and result().

  /// What step 6 reads once the round has completed, under `prefix`
  /// (checkpoints of a reduction in flight): the mean P and Q (P holding the
  /// vectors' mean too) and the residual it keeps.
  template <class Visitor>
  void visit_ready(Visitor& v, const std::string& prefix) {
    v.floats(prefix + "p_mean", p_mean_.data(), p_mean_.size(), on_device);
    v.floats(prefix + "q_mean", q_mean_.data(), q_mean_.size(), on_device);
    v.floats(prefix + "next_residual", next_residual_.data(), next_residual_.size(), on_device);
  }

  /// 6. the mean P^ Q^T (and the vectors' mean), outer step, merge; keep the
  /// residual and warm-start Q with the mean Q.
  template <class Exec, class Update, class Merge = kernels::merge::overwrite>
  void apply(Exec& exec, const Update& update, float* global, float* state, std::size_t state_stride,
             const Merge& merge = {}) {
    using pass = kernels::low_rank::apply_mean<Update, Merge>;
    auto at = [&](std::size_t off) { return state ? state + off : nullptr; };
    for (const auto& t : mats_)
      exec.for_each(t.rows * t.cols, pass{update, merge, p_mean_.data() + t.p_at, q_mean_.data() + t.q_at, t.cols, r_,
                                          global + t.offset, t.local, at(t.offset), state_stride, t.offset});
    for (const auto& v : vecs_)
      exec.for_each(v.n, pass{update, merge, p_mean_.data() + v.at, nullptr, 1, r_, global + v.offset, v.local,
                              at(v.offset), state_stride, v.offset});
    exec.copy(q_.data(), q_mean_.data(), q_floats_);  // Q and the mean Q share their layout
    std::swap(residual_, next_residual_);
  }

 private:
  struct matrix {
    std::size_t tensor, rows, cols, offset;
    float* local;
    std::size_t p_at, q_at;
    std::size_t norm_at = 0;  ///< its first partial of a norm
  };
  struct vector_part {
    std::size_t tensor, n, offset;
    float* local;
    std::size_t at;
    std::size_t norm_at = 0;
  };

  template <class Exec>
  void build(const parameter_set<float, Space>& params, const low_rank_options& opts, Exec& exec) {
    low_rank::validate(opts);
    if (on_device && static_cast<std::size_t>(world_) > diloco::exec::grid::max_checksum_segments)
      diloco::detail::raise<config_error>("low_rank over device tensors takes at most ",
                                          diloco::exec::grid::max_checksum_segments, " workers, got ", world_);
    using device_detail::upload;
    std::size_t p_floats = 0, q_floats = 0, basis = 0;
    std::vector<kernels::low_rank::factor_matrix> factors;
    for (std::size_t k = 0; k < params.count(); ++k) {
      const tensor_shape s = params.shape(k);
      const std::size_t n = params[k].size();
      total_elements_ += n;
      if (s.is_matrix() && r_ < std::min(s.rows, s.cols)) {
        mats_.push_back({k, s.rows, s.cols, params.offset(k), params[k].data(), p_floats, q_floats});
        factors.push_back({s.rows, p_floats, basis});
        p_floats += s.rows * r_;
        q_floats += s.cols * r_;
        basis += s.rows * r_;
      } else {
        vecs_.push_back({k, n, params.offset(k), params[k].data(), 0});
      }
    }
    for (auto& v : vecs_) v.at = p_floats, p_floats += v.n;
    std::size_t partials = 0;
    for (auto& t : mats_) t.norm_at = partials, partials += kernels::low_rank::norm_chunks(t.rows * t.cols);
    matrix_partials_ = partials;
    for (auto& v : vecs_) v.norm_at = partials, partials += kernels::low_rank::norm_chunks(v.n);
    partials_ = space_buffer<double>(partials);
    host_partials_ = host_buffer<double>(partials);
    p_floats_ = p_floats;
    q_floats_ = q_floats;
    slot1_ = (wire::header_bytes + 4 * p_floats_ + 63) / 64 * 64;
    slot2_ = (wire::header_bytes + 4 * q_floats_ + 63) / 64 * 64;
    const auto m = static_cast<std::size_t>(world_);
    send1_ = space_buffer<std::byte>(slot1_);
    send2_ = space_buffer<std::byte>(slot2_);
    gathered1_ = space_buffer<std::byte>(m * slot1_);
    gathered2_ = space_buffer<std::byte>(m * slot2_);
    residual_ = space_buffer<float>(params.total());
    next_residual_ = space_buffer<float>(params.total());
    work_ = space_buffer<float>(params.total());
    p_mean_ = space_buffer<float>(p_floats_);
    q_mean_ = space_buffer<float>(q_floats_);
    const std::size_t lane_sums = mats_.size() * kernels::low_rank::gram_schmidt_lanes;
    basis_ = space_buffer<double>(basis);
    before_ = space_buffer<double>(lane_sums);
    sums_ = space_buffer<double>(2 * lane_sums);
    factors_ = upload<Space>(exec, factors.data(), factors.size());
    std::vector<float> q0(q_floats_);
    for (std::size_t i = 0; i < q0.size(); ++i) q0[i] = detail_low_rank::normal(opts.seed ^ 0x6c6f775f72616e6bULL, i);
    q_ = upload<Space>(exec, q0.data(), q0.size());
    // Where each rank's P and Q land: the rank-order means read them.
    std::vector<const float*> sources1, sources2;
    for (std::size_t k = 0; k < m; ++k) {
      sources1.push_back(payload(gathered1_.data() + k * slot1_));
      sources2.push_back(payload(gathered2_.data() + k * slot2_));
    }
    sources1_ = upload<Space>(exec, sources1.data(), m);
    sources2_ = upload<Space>(exec, sources2.data(), m);
    if constexpr (on_device) {
      heads1_ = device_detail::device_headers<Space>(m, slot1_, 4 * p_floats_);
      heads2_ = device_detail::device_headers<Space>(m, slot2_, 4 * q_floats_);
      std::vector<kernels::segment_ref> refs1, refs2;
      for (std::size_t k = 0; k < m; ++k) {
        refs1.push_back({gathered1_.data() + k * slot1_ + wire::header_bytes, 4 * p_floats_, 0, 0, 0});
        refs2.push_back({gathered2_.data() + k * slot2_ + wire::header_bytes, 4 * q_floats_, 0, 0, 0});
      }
      refs1.push_back({send1_.data() + wire::header_bytes, 4 * p_floats_, 0, 0, 0});
      refs2.push_back({send2_.data() + wire::header_bytes, 4 * q_floats_, 0, 0, 0});
      refs1_ = upload<Space>(exec, refs1.data(), refs1.size());
      refs2_ = upload<Space>(exec, refs2.data(), refs2.size());
    }
  }

  /// The first `count` norm partials (kernels::low_rank::square_partials),
  /// added in order on the host.
  template <class Exec>
  double sum_partials(Exec& exec, std::size_t count) {
    exec.to_host(host_partials_.data(), partials_.data(), count);
    double total = 0.0;
    for (std::size_t i = 0; i < count; ++i) total += host_partials_[i];
    return total;
  }

  static float* payload(std::byte* seg) { return reinterpret_cast<float*>(seg + wire::header_bytes); }

  /// Exchange 1 carries P (and the vectors), exchange 2 carries Q; the
  /// exchange number goes into the round field's top bit so a segment of
  /// the other exchange is refused.
  wire::header header(int exchange, int sender, float norm) const {
    const std::uint64_t floats = exchange == 1 ? p_floats_ : q_floats_;
    return {codec_id::low_rank, wire::flag_error_feedback, r_, static_cast<std::uint32_t>(sender), total_elements_,
            4 * floats, round_ | (exchange == 2 ? (std::uint64_t{1} << 63) : 0), norm, 0, fragment_};
  }

  /// Writes the header, with its checksum, of this rank's segment of
  /// `exchange`, whose payload is in place.
  template <class Exec>
  void seal(Exec& exec, int exchange, const wire::header& h) {
    std::byte* seg = exchange == 1 ? send1_.data() : send2_.data();
    if constexpr (on_device) {
      auto& heads = exchange == 1 ? heads1_ : heads2_;
      const auto& refs = exchange == 1 ? refs1_ : refs2_;
      heads.checksums(exec, refs.data() + world_, 1, h.payload_bytes);
      wire::write_header(heads.host_header(0), h, heads.checksum(0));
      heads.put_headers(exec, seg, 1);
    } else {
      (void)exec;
      wire::write_header(seg, h);
    }
  }

  /// Validates the M segments of an exchange and sums their floats in rank
  /// order, divided by M, into the mean P or Q; zeros once this rank has
  /// found bad bytes.
  template <class Exec>
  void mean_of(Exec& exec, int exchange) {
    const bool first = exchange == 1;
    std::byte* all = first ? gathered1_.data() : gathered2_.data();
    const std::size_t slot = first ? slot1_ : slot2_, floats = first ? p_floats_ : q_floats_;
    float* mean = first ? p_mean_.data() : q_mean_.data();
    if (found_.local_problem.empty()) {
      if constexpr (on_device) (first ? heads1_ : heads2_).inspect(exec, all, (first ? refs1_ : refs2_).data());
      for (int k = 0; k < world_ && found_.local_problem.empty(); ++k) {
        const std::string where = diloco::detail::concat("low-rank round ", round_, ", ", first ? "P" : "Q",
                                                         " segment from rank ", k, " on rank ", rank_);
        const auto want = wire::expectation::of(header(exchange, k, 0.0f));
        try {
          wire::header h;
          if constexpr (on_device) {
            h = (first ? heads1_ : heads2_).check(static_cast<std::size_t>(k), want, where.c_str());
          } else {
            const std::byte* seg = all + static_cast<std::size_t>(k) * slot;
            h = validate_plain_segment(seg, slot, want, where.c_str(), [&](std::uint64_t bytes) {
              return wire::detail::payload_words_sum(seg + wire::header_bytes, bytes);
            });
          }
          if (first) found_.sender(h, k);
        } catch (const format_error& e) {
          found_.local_problem = e.what();
        }
      }
    }
    if (found_.local_problem.empty())
      exec.for_each(floats, kernels::low_rank::segment_mean{(first ? sources1_ : sources2_).data(), world_, mean});
    else
      exec.for_each(floats, kernels::fill{mean, 0.0f});
  }

  std::uint32_t r_;
  int world_;
  int rank_;
  std::uint32_t fragment_;
  std::vector<matrix> mats_;
  std::vector<vector_part> vecs_;
  std::uint64_t total_elements_ = 0;
  std::size_t p_floats_ = 0, q_floats_ = 0, slot1_ = 0, slot2_ = 0, matrix_partials_ = 0;
  space_buffer<std::byte> send1_, send2_, gathered1_, gathered2_;
  space_buffer<float> residual_, next_residual_, work_, q_, p_mean_, q_mean_;
  space_buffer<double> partials_, basis_, before_, sums_;
  host_buffer<double> host_partials_;
  space_buffer<kernels::low_rank::factor_matrix> factors_;
  space_buffer<const float*> sources1_, sources2_;  ///< the M payloads of each exchange
  /// Device only: the segments' headers and checksums, and the payloads of
  /// the M gathered segments and this rank's (last) of each exchange.
  device_detail::device_headers<Space> heads1_, heads2_;
  space_buffer<kernels::segment_ref> refs1_, refs2_;
  std::uint64_t round_ = 0;
  using ballot::found_;
  using ballot::out_;
};

}  // namespace diloco::compress

DILOCO_EXACT_FP_END
