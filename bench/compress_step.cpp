// SPDX-License-Identifier: Apache-2.0
// The compressed round's fused passes on the host against STREAM triad on
// the same sizes, in one run: stage-1 encode (pseudo-gradient + residual ->
// encoded shard + new residual), the shard reduction (decode M encodings,
// sum, re-encode), decode + outer step + copy-back (and the same with one-step
// delay's rebase and eager's merges), a receiver's structure check of the blocks
// (one thread, `check`), its checksum and structure check in one pass on the
// executor's threads as validate_segment runs them (`validate`), and a
// sender's checksum of the payload (`checksum`).
// Communication is excluded. Bytes are the minimum each pass must move per parameter.
// chunk_topk (gathered aggregation) has no shard reduction: its rows are the
// encode and the pass that decodes M segments, sums them and applies.
// Where a codec has hand-vectorised host passes (kernels/host_simd.hpp;
// `host_simd: 1` when they run here, `host_simd_avx512: 1` when their
// AVX-512 forms do, kernels/host_simd512.hpp; DILOCO_HOST_SIMD=avx2 keeps
// AVX2), `*_simd_vs_portable` is the portable
// code's time over theirs, measured in alternation in the same run, and
// `*.reduce_runs_vs_single_block` the shard reduction called one block at a
// time over it called a run of blocks at a time (reduce_shard::batch).
//
//   bench_compress_step [--log2 24] [--reps 7] [--workers 4]

#include <diloco/diloco.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

namespace {

// One worker's round over one tensor of n parameters: theta_global as the
// encode reads it and as the outer step writes it, the error-feedback
// residual and its successor, the outer momentum (flat), the replica the
// encode reads and the one the outer step writes. The encode's inputs are
// not written by any pass: with one theta_global or one replica the outer
// steps would move theta_global towards the replica (its copy-back makes
// them equal), and every later encode would time a pseudo-gradient that
// shrinks round by round to a few ulps of the parameters (nearly constant:
// what this benchmark timed before 2026-12-01, when every pseudo-gradient
// was one value plus a ramp), a special case rather than the round's work.
// The replica holds normal draws of deviation 0.02 (initialised weights)
// and theta_global that plus normal draws of deviation 1e-3 (a phase's
// progress), so each block's pseudo-gradient spreads as a real one does:
// the magnitudes chunk_topk selects among, the codes of every grid value.
struct round_buffers {
  struct flat_buffers {
    std::vector<float> global, stepped, residual, next, momentum;
  } flat;
  std::vector<float> local, applied;
  std::vector<float*> ptrs, applied_ptrs;
  std::vector<std::size_t> offsets{0};
  explicit round_buffers(std::size_t n)
      : flat{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
             std::vector<float>(n)},
        local(n),
        applied(n) {
    // Each buffer drawn where it is first touched (fill_normal's draws are
    // a function of seed and index): the replicas from seed 1, theta_global
    // those plus seed 2's.
    for (std::vector<float>* replica : {&local, &applied}) bench::fill_normal(*replica, 0.0, 0.02, 1);
    for (std::vector<float>* theta : {&flat.global, &flat.stepped}) {
      bench::fill_normal(*theta, 0.0, 0.02, 1);
      bench::fill_normal(*theta, 0.0, 1e-3, 2, true);
    }
    bench::fill(flat.residual, 0.0f);
    bench::fill(flat.next, 0.0f);
    bench::fill(flat.momentum, 0.0f);
    ptrs = {local.data()};
    applied_ptrs = {applied.data()};
  }
  dc::kernels::tensor_table table() const { return {ptrs.data(), offsets.data()}; }
  dc::kernels::tensor_table applied_table() const { return {applied_ptrs.data(), offsets.data()}; }
};

// A codec pass run by its portable code only (where kernels/host_simd.hpp
// has a hand-vectorised form, the rows `*_simd_vs_portable` compare them).
template <class Pass>
struct portable_only {
  static constexpr std::size_t elements_per_call = Pass::elements_per_call;
  Pass pass;
  auto operator()(std::size_t b) const { return pass.portable(b); }
};

// A pass called block by block: without the shard reduction's batch(),
// exec::host calls operator() once per block (its single-block path). Not
// inlined into the executor's eight lanes, which would compile the pass
// (its portable code included) sixteen times over for this one row.
template <class Pass>
struct block_by_block {
  static constexpr std::size_t elements_per_call = Pass::elements_per_call;
  Pass pass;
  __attribute__((noinline)) auto operator()(std::size_t b) const { return pass(b); }
};

// The encode pass's rows: bytes it must move per parameter and its rate
// against triad's.
void print_encode(const std::string& p, double enc, double encode_bytes, double gn, double t_encode, double triad_gbps) {
  bench::print(p + "triad_gbps", triad_gbps);
  bench::print(p + "encoded_bytes_per_param", enc);
  bench::print(p + "encode_bytes_per_param", encode_bytes);
  bench::print(p + "encode_gbps", encode_bytes * gn / t_encode);
  bench::print(p + "encode_vs_triad", encode_bytes * gn / t_encode / triad_gbps);
}

template <class Compressor, class Triad>
void run(const char* name, std::size_t n, int world, int reps, Triad&& triad) {
  using codec = typename Compressor::codec;
  const codec c = Compressor::make_codec({});
  const cp::block_layout layout({n}, codec::block, world);
  const std::size_t stride = c.stride();
  const double enc = static_cast<double>(layout.block_count() * stride) / static_cast<double>(n);  // encoded B/param
  round_buffers b(n);
  // Plain references, not a structured binding: Clang before 16 cannot
  // capture a binding in the lambdas below.
  std::vector<float>& global = b.flat.global;
  std::vector<float>& stepped = b.flat.stepped;
  std::vector<float>& residual = b.flat.residual;
  std::vector<float>& next = b.flat.next;
  std::vector<float>& momentum = b.flat.momentum;
  const dc::kernels::tensor_table table = b.table();
  const std::vector<std::size_t>& offsets = b.offsets;
  std::vector<std::byte> payload(layout.block_count() * stride);
  dc::exec::host ex(bench::threads());
  constexpr bool ef = Compressor::has_error_feedback;

  // Stage 1 over all shards: read global, local (+ residual), write the
  // encoding (+ the new residual).
  const dc::kernels::encode_pseudo_gradient<codec> encode_pass{c,      layout.blocks(), table, global.data(),
                                                               ef ? residual.data() : nullptr,
                                                               ef ? next.data() : nullptr,
                                                               payload.data(), stride, 1};
  auto encode = [&] { ex.transform_reduce(layout.block_count(), encode_pass); };
  const double encode_bytes = (ef ? 16.0 : 8.0) + enc;

  // Stages 3+4 for one shard: read M encodings of the shard, write one.
  // The M received segments lie in M buffers, as in a receiver's M slots
  // (each a copy of this encode's shard: the same bytes), so the pass reads
  // M streams; until 2026-12-01 all M pointed at one buffer, which the
  // pass read M times, mostly from cache.
  const int shard = 0;
  const std::size_t shard_blocks = layout.blocks_in(shard);
  std::vector<std::byte> out(shard_blocks * stride);
  encode();
  std::vector<std::vector<std::byte>> slots(static_cast<std::size_t>(world),
                                            std::vector<std::byte>(payload.begin(),
                                                                   payload.begin() + static_cast<std::ptrdiff_t>(shard_blocks * stride)));
  std::vector<const std::byte*> received;
  for (const auto& slot : slots) received.push_back(slot.data());
  const dc::kernels::reduce_shard<codec> reduce_pass{c,   layout.blocks(), offsets.data(), received.data(),
                                                     world, out.data(),     stride,         2};
  auto reduce = [&] { ex.transform_reduce(shard_blocks, reduce_pass); };
  const double shard_elements = static_cast<double>(layout.elements_in(shard));
  const double reduce_bytes = (world + 1) * enc;

  // Stage 7 over all shards: read the mean's encoding, momentum and
  // theta_global, write momentum, theta_global and the replica (`stepped`
  // and `applied`: not the encode's inputs, round_buffers says why).
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  auto apply_with = [&](auto merge) {
    for (int s = 0; s < world; ++s)
      ex.for_each(layout.blocks_in(s),
                  dc::kernels::decode_apply<codec, dc::kernels::sgd_update, decltype(merge)>{
                      c, nesterov, layout.blocks() + layout.first_block(s), b.applied_table(),
                      payload.data() + layout.first_block(s) * stride, stride, stepped.data(), momentum.data(), n,
                      merge});
  };
  auto apply = [&] { apply_with(dc::kernels::merge::overwrite{}); };
  // The same with one-step delay's merge (rebase): the replica keeps its
  // phase's progress, so the pass also reads the replica and reads and
  // writes where the phase started.
  std::vector<float> start(n);
  bench::fill(start, 0.25f);
  auto apply_rebase = [&] { apply_with(dc::kernels::merge::rebase{{}, start.data()}); };
  // The same with eager's merge: before the shared step the worker takes
  // its own (its own slot), and reads and writes its anchor and the
  // pseudo-gradient it sent.
  std::vector<float> anchor(n), own(n), eager_slots(n);
  bench::fill(anchor, 0.5f);
  bench::fill(own, 0.125f);
  bench::fill(eager_slots, 0.0625f);
  auto apply_eager = [&] {
    apply_with(dc::kernels::merge::eager<dc::kernels::sgd_update>{
        {}, nesterov, anchor.data(), own.data(), eager_slots.data(), n, 1.0f / static_cast<float>(world)});
  };
  // The structure check a receiver runs on every block of a segment
  // (compress::validate_segment's compress::first_bad_block, the checksum
  // aside), on one thread as the receiver runs it.
  std::size_t malformed = 0;
  auto check = [&] {
    malformed += cp::first_bad_block(c, payload.data(), layout.blocks(), layout.block_count()).index !=
                 layout.block_count();
  };
  // What a receiver runs on a received segment's payload: its checksum and
  // the structure check in one pass on the executor's threads
  // (compress::scan_payload, as validate_segment does on the host); and the
  // checksum a sender writes into each segment's header, on the same threads.
  std::uint64_t sums = 0;
  auto validate = [&] {
    const auto r = cp::scan_payload(ex, c, payload.data(), layout.blocks(), layout.block_count(), true);
    malformed += r.bad.index != layout.block_count();
    sums += r.sum;
  };
  auto checksum = [&] { sums += cp::payload_words_sum(ex, payload.data(), payload.size()); };
  // In alternation with STREAM triad on buffers of the same size, so the
  // ratios compare passes measured under the same conditions.
  const auto t = bench::interleaved_medians(reps, encode, reduce, apply, triad, apply_rebase, check, apply_eager,
                                            validate, checksum);
  if (malformed != 0) throw std::runtime_error(std::string(name) + ": the encode wrote blocks its check refuses");
  // The hand-vectorised passes against the portable code they stand in for
  // (the same bits: test_host_simd), in alternation, in the same run.
  if constexpr (dc::kernels::host_simd::supports<codec>::value) {
    auto encode_portable = [&] { ex.transform_reduce(layout.block_count(), portable_only<decltype(encode_pass)>{encode_pass}); };
    auto reduce_portable = [&] { ex.transform_reduce(shard_blocks, portable_only<decltype(reduce_pass)>{reduce_pass}); };
    auto reduce_single = [&] { ex.transform_reduce(shard_blocks, block_by_block<decltype(reduce_pass)>{reduce_pass}); };
    const auto v = bench::interleaved_medians(reps, encode, encode_portable, reduce, reduce_portable, reduce_single);
    bench::print(std::string(name) + ".encode_simd_vs_portable", v[1] / v[0]);
    bench::print(std::string(name) + ".reduce_simd_vs_portable", v[3] / v[2]);
    // Runs of blocks (reduce_shard::batch, host_simd::reduce_blocks) against one block a call.
    bench::print(std::string(name) + ".reduce_runs_vs_single_block", v[4] / v[2]);
  }
  const double t_encode = t[0], t_reduce = t[1], t_apply = t[2];
  const double triad_gbps = 12.0 * static_cast<double>(n) / 1e9 / t[3];
  const double apply_bytes = 20.0 + enc;

  const double gn = static_cast<double>(n) / 1e9;
  const std::string p = std::string(name) + ".";
  print_encode(p, enc, encode_bytes, gn, t_encode, triad_gbps);
  bench::print(p + "reduce_bytes_per_param", reduce_bytes);
  bench::print(p + "reduce_gbps", reduce_bytes * shard_elements / 1e9 / t_reduce);
  bench::print(p + "reduce_vs_triad", reduce_bytes * shard_elements / 1e9 / t_reduce / triad_gbps);
  bench::print(p + "decode_apply_bytes_per_param", apply_bytes);
  bench::print(p + "decode_apply_gbps", apply_bytes * gn / t_apply);
  bench::print(p + "decode_apply_vs_triad", apply_bytes * gn / t_apply / triad_gbps);
  const double rebase_bytes = apply_bytes + 8.0;  // the replica read, the phase's start read and written
  bench::print(p + "decode_apply_rebase_bytes_per_param", rebase_bytes);
  bench::print(p + "decode_apply_rebase_gbps", rebase_bytes * gn / t[4]);
  bench::print(p + "decode_apply_rebase_vs_triad", rebase_bytes * gn / t[4] / triad_gbps);
  // The replica read, anchor, own and the worker's slot read and written.
  const double eager_bytes = apply_bytes + 28.0;
  bench::print(p + "decode_apply_eager_bytes_per_param", eager_bytes);
  bench::print(p + "decode_apply_eager_gbps", eager_bytes * gn / t[6]);
  bench::print(p + "decode_apply_eager_vs_triad", eager_bytes * gn / t[6] / triad_gbps);
  bench::print(p + "check_gbps", enc * gn / t[5]);
  bench::print(p + "check_vs_triad", enc * gn / t[5] / triad_gbps);
  bench::print(p + "validate_gbps", enc * gn / t[7]);
  bench::print(p + "validate_vs_triad", enc * gn / t[7] / triad_gbps);
  bench::print(p + "checksum_gbps", enc * gn / t[8]);
  bench::print(p + "checksum_vs_triad", enc * gn / t[8] / triad_gbps);
  if (sums == 1) std::printf("%s: unlikely checksum\n", name);  // keeps the sums
}

// A gathered (sparse) compressor: stage-1 encode over the whole model, and
// the aggregation pass that decodes M segments, sums them in rank order and
// applies the outer step (all M segments are this rank's here).
template <class Compressor, class Triad>
void run_gathered(const char* name, std::size_t n, int world, int reps, Triad&& triad) {
  using codec = typename Compressor::codec;
  const codec c = Compressor::make_codec({});
  const cp::block_layout layout({n}, codec::block, 1);
  const std::size_t stride = c.stride();
  const double enc = static_cast<double>(layout.block_count() * stride) / static_cast<double>(n);
  round_buffers b(n);
  // Plain references, not a structured binding: Clang before 16 cannot
  // capture a binding in the lambdas below.
  std::vector<float>& global = b.flat.global;
  std::vector<float>& residual = b.flat.residual;
  std::vector<float>& next = b.flat.next;
  std::vector<float>& momentum = b.flat.momentum;
  const dc::kernels::tensor_table table = b.table();
  std::vector<std::byte> payload(layout.block_count() * stride);
  dc::exec::host ex(bench::threads());
  constexpr bool ef = Compressor::has_error_feedback;
  auto encode = [&] {
    ex.transform_reduce(layout.block_count(),
                        dc::kernels::encode_pseudo_gradient<codec>{c, layout.blocks(), table, global.data(),
                                                                   ef ? residual.data() : nullptr,
                                                                   ef ? next.data() : nullptr, payload.data(), stride, 1,
                                                                   0.95f});
  };
  const double encode_bytes = (ef ? 16.0 : 8.0) + enc;
  // The M gathered segments in M buffers (copies of this encode's), as run()'s reduction reads them.
  encode();
  std::vector<std::vector<std::byte>> slots(static_cast<std::size_t>(world), payload);
  std::vector<const std::byte*> payloads;
  for (const auto& slot : slots) payloads.push_back(slot.data());
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  auto aggregate = [&] {
    ex.for_each(layout.block_count(),
                dc::kernels::gathered_decode_apply<codec, dc::kernels::sgd_update>{
                    c, nesterov, layout.blocks(), b.applied_table(), payloads.data(), world, stride, b.flat.stepped.data(),
                    momentum.data(), n});
  };
  const double aggregate_bytes = world * enc + 20.0;
  const auto t = bench::interleaved_medians(reps, encode, aggregate, triad);
  const double triad_gbps = 12.0 * static_cast<double>(n) / 1e9 / t[2];
  const double gn = static_cast<double>(n) / 1e9;
  const std::string p = std::string(name) + ".";
  print_encode(p, enc, encode_bytes, gn, t[0], triad_gbps);
  bench::print(p + "aggregate_apply_bytes_per_param", aggregate_bytes);
  bench::print(p + "aggregate_apply_gbps", aggregate_bytes * gn / t[1]);
  bench::print(p + "aggregate_apply_vs_triad", aggregate_bytes * gn / t[1] / triad_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  long log2 = 24, reps_option = 7, workers = 4;
  bench::cli cli("The compressed round's fused host passes against STREAM triad");
  cli.option("--log2", log2, "log2 of the parameter count", 4L, 30L);
  cli.option("--reps", reps_option, "timed repetitions (the median is reported)", 1L, 1000L);
  cli.option("--workers", workers, "workers M of the simulated round", 1L, 64L);
  cli.parse(argc, argv);
  const std::size_t n = std::size_t{1} << log2;
  const int reps = static_cast<int>(reps_option);
  const int world = static_cast<int>(workers);
  bench::print("threads", bench::threads());
  bench::print("parameters", static_cast<double>(n));
  bench::print("host_simd", dc::kernels::host_simd::enabled() ? 1.0 : 0.0);
  bench::print("host_simd_avx512", dc::kernels::host_simd::avx512() ? 1.0 : 0.0);

  std::vector<float> x(n), y(n), z(n);
  bench::fill(x, 1.0f);
  bench::fill(y, 2.0f);
  bench::fill(z, 0.0f);
  const auto sn = static_cast<std::ptrdiff_t>(n);
  float* zp = z.data();
  const float* xp = x.data();
  const float* yp = y.data();
  auto triad = [&] {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < sn; ++i) zp[i] = xp[i] + 0.5f * yp[i];
  };

  run<cp::cast<dc::bf16>>("bf16", n, world, reps, triad);
  run<cp::error_feedback<cp::cast<dc::bf16>>>("bf16_ef", n, world, reps, triad);
  run<cp::blockwise<dc::int8>>("int8", n, world, reps, triad);
  run<cp::error_feedback<cp::blockwise<dc::int8>>>("int8_ef", n, world, reps, triad);
  run<cp::blockwise<dc::int4>>("int4", n, world, reps, triad);
  run<cp::error_feedback<cp::blockwise<dc::int4>>>("int4_ef", n, world, reps, triad);
  run<cp::blockwise<dc::fp8_e4m3>>("fp8_e4m3", n, world, reps, triad);
  run<cp::error_feedback<cp::blockwise<dc::fp8_e4m3>>>("fp8_e4m3_ef", n, world, reps, triad);
  run<cp::blockwise<dc::fp8_e5m2>>("fp8_e5m2", n, world, reps, triad);
  run<cp::error_feedback<cp::blockwise<dc::fp8_e5m2>>>("fp8_e5m2_ef", n, world, reps, triad);
  run<cp::blockwise<dc::fp4_e3m0>>("fp4_e3m0", n, world, reps, triad);
  run<cp::error_feedback<cp::blockwise<dc::fp4_e3m0>>>("fp4_e3m0_ef", n, world, reps, triad);
  run<cp::blockwise<dc::int2>>("int2", n, world, reps, triad);
  run<cp::error_feedback<cp::blockwise<dc::int2>>>("int2_ef", n, world, reps, triad);
  run_gathered<cp::chunk_topk<4096, 64, dc::int2>>("chunk_topk_64_4096_int2", n, world, reps, triad);
  run_gathered<cp::error_feedback<cp::chunk_topk<4096, 64, dc::int2>>>("chunk_topk_64_4096_int2_ef", n, world, reps, triad);
  return 0;
}
