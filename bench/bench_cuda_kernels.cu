// SPDX-License-Identifier: Apache-2.0
// Achieved memory bandwidth of each fused kernel (the optimizer passes and
// the compression passes: encode with and without error feedback, the
// reduce of 4 workers' encodings, decode-apply, the payload checksum, the
// structure check,
// low_rank's products and residual), next
// to a device-to-device copy (cudaMemcpyAsync) measured in the same run, and
// their ratio: a fused pass that streams its bytes as fast as the copy
// engine reaches ~1.0.
// Bytes per element are the counts written beside each kernel in
// include/diloco/kernels/. Prints `name: value` lines.
//
//   bench_cuda_kernels [--elements N] [--iterations K] [--tensors 1,64,1024,4096,mixed]
//
// Without a GPU it prints a "no GPU" line and exits 0.
#include <CLI/CLI.hpp>
#include <diloco/cuda.hpp>
#include <diloco/kernels/tensor_passes.hpp>
#include <diloco/tensor/tensor_list.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "layouts.hpp"

namespace dc = diloco;
namespace k = dc::kernels;
namespace cp = dc::compress;

namespace {

// Values in [-scale, scale) that vary per element (zeros would take the
// quantizer's all-zero shortcut).
struct fill_pattern {
  float* p;
  float scale;
  DILOCO_HD void operator()(std::size_t i) const {
    p[i] = scale * (static_cast<float>((i * 2654435761u) % 2001u) - 1000.0f) * 1e-3f;
  }
};

// Tensors of the given sizes cut into codec blocks (each tensor's last
// block partial), on the device; or a single tensor of n elements.
struct device_layout {
  std::size_t count = 0;
  dc::device_buffer<cp::block_ref> blocks;
  device_layout(const std::vector<std::size_t>& sizes, std::size_t block, dc::exec::cuda& ex) {
    const cp::block_layout l(sizes, block, 1);
    count = l.block_count();
    blocks = dc::device_buffer<cp::block_ref>(count);
    ex.from_host(blocks.data(), l.blocks(), count);
  }
  device_layout(std::size_t n, std::size_t block, dc::exec::cuda& ex)
      : device_layout(std::vector<std::size_t>{n}, block, ex) {}
};

struct timer {
  cudaEvent_t start{}, stop{};
  timer() {
    dc::detail::cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    dc::detail::cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  }
  ~timer() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  // Median seconds of `iterations` runs of f, after 3 warm-up runs.
  template <class F>
  double median_seconds(int iterations, F&& f) {
    for (int i = 0; i < 3; ++i) f();
    std::vector<double> t;
    for (int i = 0; i < iterations; ++i) {
      dc::detail::cuda_check(cudaEventRecord(start), "cudaEventRecord");
      f();
      dc::detail::cuda_check(cudaEventRecord(stop), "cudaEventRecord");
      dc::detail::cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0.0f;
      dc::detail::cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      t.push_back(static_cast<double>(ms) * 1e-3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{1} << 26;  // 256 MiB per fp32 array
  int iterations = 20;
  // CLI11, as the host benchmarks: a malformed or out-of-range value exits
  // non-zero with a message naming the option.
  CLI::App app("The fused CUDA kernels' bandwidth against a device-to-device copy");
  app.add_option("--elements", n, "fp32 elements per array")->capture_default_str()->check(
      CLI::Range(std::size_t{8}, std::size_t{1} << 31));
  app.add_option("--iterations", iterations, "timed runs per kernel (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  std::string layouts = "1,64,1024,4096,mixed";
  app.add_option("--tensors", layouts, "layouts of the same parameters for the multi-tensor rows")
      ->capture_default_str()
      ->check(bench::check_layouts);
  CLI11_PARSE(app, argc, argv);
  if (dc::cuda_device_count() == 0) {
    std::printf("no GPU: skipping the CUDA kernel benchmark\n");
    return 0;
  }

  cudaDeviceProp prop{};
  dc::detail::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s\n", prop.name);
  std::printf("elements: %zu\n", n);

  // Six arrays (zero-filled), each with spare elements at the end so views
  // starting one float in (misaligned: the scalar path) stay in range.
  std::vector<dc::device_buffer<float>> a;
  for (int i = 0; i < 6; ++i) a.emplace_back(n + 4);
  float* p = a[0].data();
  float* g = a[1].data();
  float* m = a[2].data();  // wire, or SGD momentum
  float* v = a[3].data();  // outer momentum
  float* x = a[4].data();
  float* y = a[5].data();
  // AdamW's two state slots at stride n.
  dc::device_buffer<float> state(2 * n);
  dc::exec::cuda ex;

  timer t;
  const double memcpy_s = t.median_seconds(iterations, [&] { ex.copy(y, x, n); });
  const double memcpy_gbps = 8.0 * static_cast<double>(n) / memcpy_s * 1e-9;
  std::printf("memcpy_d2d_gbps: %.1f\n", memcpy_gbps);

  struct row {
    std::string name;
    double bytes_per_element;
    double seconds;
  };
  std::vector<row> rows;
  const auto adamw = dc::inner::adamw::make_update({}, 10);
  const auto sgd_momentum = dc::inner::sgd::make_update({.lr = 0.01f, .momentum = 0.9f}, 10);
  const auto nesterov = dc::outer::nesterov::make_update({}, 10);

  rows.push_back({"pseudo_gradient", 12, t.median_seconds(iterations, [&] {
                    (void)ex.transform_reduce(n, k::pseudo_gradient{x, y, m});
                  })});
  rows.push_back({"outer_nesterov", 24, t.median_seconds(iterations, [&] {
                    ex.for_each(n, k::outer_apply<k::sgd_update>{nesterov, m, 0.25f, x, v, n, y});
                  })});
  rows.push_back({"inner_adamw", 28, t.median_seconds(iterations, [&] {
                    ex.for_each(n, k::inner_step<k::adamw_update>{adamw, p, g, 1.0f, state.data(), n});
                  })});
  rows.push_back({"inner_sgd_momentum", 20, t.median_seconds(iterations, [&] {
                    ex.for_each(n, k::inner_step<k::sgd_update>{sgd_momentum, p, g, 1.0f, m, n});
                  })});
  rows.push_back({"copy_functor", 8, t.median_seconds(iterations, [&] { ex.for_each(n, k::copy{x, y}); })});
  // The same outer pass with every pointer one float off 16-byte alignment:
  // the launcher falls back to 4-byte accesses.
  rows.push_back({"outer_nesterov_scalar", 24, t.median_seconds(iterations, [&] {
                    ex.for_each(n - 1, k::outer_apply<k::sgd_update>{nesterov, m + 1, 0.25f, x + 1, v + 1, n, y + 1});
                  })});

  // The compression passes (kernels/compressed_blocks.hpp): int8 / int4
  // blocks of 128 and bf16 blocks of 64. Bytes per element as written
  // beside each pass, plus 32/B for the block's descriptor and norm sums.
  using int8_e = k::codec_elements<cp::blockwise_codec<dc::int8, 128, cp::round_nearest>>;
  using int4_e = k::codec_elements<cp::blockwise_codec<dc::int4, 128, cp::round_nearest>>;
  using bf16_e = k::codec_elements<cp::cast_codec<dc::bf16, cp::round_nearest>>;
  constexpr int sources = 4;  // workers whose encodings a reduce reads
  ex.for_each(n, fill_pattern{x, 1.0f});
  ex.for_each(n, fill_pattern{y, 0.9f});
  dc::device_buffer<float> residual(n), next_residual(n);
  ex.for_each(n, fill_pattern{residual.data(), 1e-3f});
  const device_layout l128(n, 128, ex), l64(n, 64, ex);
  const k::device_tensor replica{y, 0, 0};
  dc::device_buffer<k::device_tensor> tensors(1);
  ex.from_host(tensors.data(), &replica, 1);
  dc::device_buffer<k::sums2> block_sums(l64.count);
  std::vector<dc::device_buffer<std::byte>> int8_payloads;
  std::vector<const std::byte*> int8_pointers;
  for (int r = 0; r < sources; ++r) {
    int8_payloads.emplace_back(l128.count * int8_e::stride);
    int8_pointers.push_back(int8_payloads.back().data());
  }
  dc::device_buffer<const std::byte*> received(sources);
  ex.from_host(received.data(), int8_pointers.data(), sources);
  dc::device_buffer<std::byte> int4_payload(l128.count * int4_e::stride), bf16_payload(l64.count * bf16_e::stride),
      reduced(l128.count * int8_e::stride);
  const std::uint64_t stream = k::make_stream(1, 2, 3, 1);
  auto encode_int8 = [&](std::byte* payload, const float* e, float* next) {
    ex.run_teams(l128.count, k::encode_blocks<int8_e>{l128.blocks.data(), tensors.data(), x, e, next, payload, stream,
                                                       block_sums.data(), true});
  };
  for (auto& payload : int8_payloads) encode_int8(payload.data(), residual.data(), next_residual.data());
  constexpr double per_block = 32.0;
  rows.push_back({"encode_int8_ef", 17 + (4 + per_block) / 128, t.median_seconds(iterations, [&] {
                    encode_int8(int8_payloads[0].data(), residual.data(), next_residual.data());
                  })});
  rows.push_back({"encode_int8", 9 + (4 + per_block) / 128, t.median_seconds(iterations, [&] {
                    encode_int8(int8_payloads[0].data(), nullptr, nullptr);
                  })});
  rows.push_back({"encode_int4_ef", 16.5 + (4 + per_block) / 128, t.median_seconds(iterations, [&] {
                    ex.run_teams(l128.count, k::encode_blocks<int4_e>{l128.blocks.data(), tensors.data(), x,
                                                                      residual.data(), next_residual.data(),
                                                                      int4_payload.data(), stream, block_sums.data(),
                                                                      true});
                  })});
  rows.push_back({"encode_bf16_ef", 18 + per_block / 64, t.median_seconds(iterations, [&] {
                    ex.run_teams(l64.count, k::encode_blocks<bf16_e>{l64.blocks.data(), tensors.data(), x,
                                                                     residual.data(), next_residual.data(),
                                                                     bf16_payload.data(), stream, block_sums.data(),
                                                                     true});
                  })});
  // The block norms at growing B: each block's squares meet in
  // norm_lanes(B) lanes (8 at B = 64 and 128, 64 at 1024, 256 at 4096) and
  // their tree, across the team; int8 encode with error feedback.
  auto encode_int8_at = [&]<std::size_t B>(std::integral_constant<std::size_t, B>) {
    using e = k::codec_elements<cp::blockwise_codec<dc::int8, B, cp::round_nearest>>;
    const device_layout l(n, B, ex);
    dc::device_buffer<std::byte> payload(l.count * e::stride);
    rows.push_back({"encode_int8_ef_b" + std::to_string(B), 17 + (4 + per_block) / static_cast<double>(B),
                    t.median_seconds(iterations, [&] {
                      ex.run_teams(l.count, k::encode_blocks<e>{l.blocks.data(), tensors.data(), x, residual.data(),
                                                                next_residual.data(), payload.data(), stream,
                                                                block_sums.data(), true});
                    })});
  };
  encode_int8_at(std::integral_constant<std::size_t, 64>{});
  encode_int8_at(std::integral_constant<std::size_t, 128>{});
  encode_int8_at(std::integral_constant<std::size_t, 1024>{});
  encode_int8_at(std::integral_constant<std::size_t, 4096>{});
  rows.push_back({"reduce_int8_m4", (sources + 1) * (1 + 4.0 / 128) + per_block / 128,
                  t.median_seconds(iterations, [&] {
                    ex.run_teams(l128.count, k::reduce_blocks<int8_e>{l128.blocks.data(), tensors.data(),
                                                                      received.data(), sources, reduced.data(), stream,
                                                                      block_sums.data()});
                  })});
  // Momentum at stride n: 16-byte slots only when n is a multiple of 4.
  rows.push_back({"decode_apply_int8_nesterov", 21 + (4 + per_block / 2) / 128, t.median_seconds(iterations, [&] {
                    ex.run_teams(l128.count, k::decode_apply_blocks<int8_e, k::sgd_update>{
                                                 nesterov, l128.blocks.data(), tensors.data(), reduced.data(), x, v, n,
                                                 n % 4 == 0});
                  })});
  // The structure check of a received int8 segment (kernels::check_blocks,
  // a team per block scanning its bytes): reads the codes and factor (1 +
  // 4/B) and the block's 16-byte descriptor.
  {
    using int8_codec = cp::blockwise_codec<dc::int8, 128, cp::round_nearest>;
    using check = k::check_blocks<int8_codec>;
    const k::segment_ref segment{int8_payloads[0].data(), l128.count * int8_e::stride, 0, l128.count, 0};
    dc::device_buffer<k::segment_ref> segments(1);
    ex.from_host(segments.data(), &segment, 1);
    dc::device_buffer<std::uint64_t> first_bad(1);
    rows.push_back({"check_blocks_int8", 1 + (4 + 16.0) / 128, t.median_seconds(iterations, [&] {
                      ex.for_each(1, k::fill_words{first_bad.data(), ~std::uint64_t{0}});
                      ex.for_each(check::items(l128.count),
                                  check{int8_codec{}, segments.data(), 1, l128.blocks.data(), first_bad.data()});
                    })});
    std::uint64_t found = 0;
    ex.to_host(&found, first_bad.data(), 1);
    if (found != ~std::uint64_t{0})
      std::printf("check_blocks_int8: unexpected malformed block %llu\n", static_cast<unsigned long long>(found));
  }
  // chunk_topk (SparseLoCo's 64 of every 4096 as int2, kernels/topk_blocks.hpp):
  // the encode reads 12 bytes per element and writes the new residual (4)
  // and 0.028 of payload; decode-apply reads M sparse payloads, theta and
  // the momentum, and writes theta, the momentum and the replica.
  {
    using topk = cp::chunk_topk_codec<4096, 64, dc::int2, cp::round_nearest>;
    const device_layout l4096(n, 4096, ex);
    std::vector<dc::device_buffer<std::byte>> topk_payloads;
    std::vector<const std::byte*> topk_pointers;
    for (int r = 0; r < sources; ++r) {
      topk_payloads.emplace_back(l4096.count * topk::stride());
      topk_pointers.push_back(topk_payloads.back().data());
    }
    dc::device_buffer<const std::byte*> topk_received(sources);
    ex.from_host(topk_received.data(), topk_pointers.data(), sources);
    auto encode_topk = [&](std::byte* payload) {
      ex.run_teams(l4096.count, k::topk_encode_blocks<topk>{l4096.blocks.data(), tensors.data(), x, residual.data(),
                                                            next_residual.data(), payload, stream, block_sums.data(),
                                                            0.95f, true});
    };
    for (auto& payload : topk_payloads) encode_topk(payload.data());
    const double payload_per_element = static_cast<double>(topk::stride()) / 4096;
    rows.push_back({"encode_topk4096_int2_ef", 16 + payload_per_element + per_block / 4096,
                    t.median_seconds(iterations, [&] { encode_topk(topk_payloads[0].data()); })});
    rows.push_back({"decode_apply_topk4096_m4_nesterov", 20 + sources * payload_per_element + per_block / 2 / 4096,
                    t.median_seconds(iterations, [&] {
                      ex.run_teams(l4096.count, k::topk_decode_apply_blocks<topk, k::sgd_update>{
                                                    nesterov, l4096.blocks.data(), tensors.data(), topk_received.data(),
                                                    sources, x, v, n});
                    })});
  }
  // low_rank (kernels/low_rank_passes.hpp) at rank 4 on one square-ish
  // matrix held in x (2^k columns, 2^(2k) <= n, and n / 2^k rows): the
  // products read M once (the factors are cached), the residual reads M and
  // writes e'. Bytes per element are scaled to the n elements the rows
  // report against. The orthonormalisation (r (r + 5) / 2 launches of 64
  // lanes per matrix) is reported in milliseconds.
  double orthonormalise_ms = 0.0;
  if (n >= 64) {
    constexpr std::size_t r = 4;
    std::size_t cols = 8;
    while (4 * cols * cols <= n) cols *= 2;
    const std::size_t matrix_rows = n / cols;
    const double share = static_cast<double>(matrix_rows * cols) / static_cast<double>(n);
    dc::device_buffer<float> q(cols * r), factor_p(matrix_rows * r), factor_q(cols * r);
    ex.for_each(cols * r, fill_pattern{q.data(), 1.0f});
    ex.for_each(matrix_rows * cols, fill_pattern{x, 1.0f});
    rows.push_back({"low_rank_times_q_r4", 4 * share, t.median_seconds(iterations, [&] {
                      ex.for_each(matrix_rows * r, k::low_rank::times_q{x, q.data(), factor_p.data(), cols, r});
                    })});
    rows.push_back({"low_rank_times_p_r4", 4 * share, t.median_seconds(iterations, [&] {
                      ex.for_each(cols * r, k::low_rank::times_p{x, factor_p.data(), factor_q.data(), matrix_rows, cols, r});
                    })});
    rows.push_back({"low_rank_residual_r4", 8 * share, t.median_seconds(iterations, [&] {
                      ex.for_each(matrix_rows * cols,
                                  k::low_rank::residual_of{x, factor_p.data(), factor_q.data(), y, cols, r});
                    })});
    const k::low_rank::factor_matrix matrix{matrix_rows, 0, 0};
    dc::device_buffer<k::low_rank::factor_matrix> matrices(1);
    ex.from_host(matrices.data(), &matrix, 1);
    dc::device_buffer<double> basis(matrix_rows * r), before(k::low_rank::gram_schmidt_lanes),
        sums(2 * k::low_rank::gram_schmidt_lanes);
    const k::low_rank::gram_schmidt gs{matrices.data(), factor_p.data(), basis.data(), before.data(), sums.data(), 1, r};
    orthonormalise_ms = 1e3 * t.median_seconds(iterations, [&] { k::low_rank::orthonormalise(ex, gs); });
  }
  {
    const k::segment_ref segment{int8_payloads[0].data(), l128.count * int8_e::stride, 0, l128.count, 0};
    dc::device_buffer<k::segment_ref> segments(1);
    ex.from_host(segments.data(), &segment, 1);
    dc::device_buffer<std::uint64_t> sum(1);
    // Bytes per element: the int8 payload's (1 + 4/B), read once.
    rows.push_back({"checksum_int8_payload", 1 + 4.0 / 128, t.median_seconds(iterations, [&] {
                      ex.checksum_segments(segments.data(), 1, segment.payload_bytes, sum.data());
                    })});
  }

  // The multi-tensor passes (exec/chunks.hpp): the same n parameters as T
  // tensors (or a transformer-like mix), one launch per pass over all of
  // them. Rows `<pass>_tensors_<T>`, the int8 codec's encode (with and without error feedback) and
  // decode-apply among them; on a GPU each should stream at the single
  // tensor's rate.
  for (const std::string& layout : bench::layout_names(layouts)) {
    const auto sizes = bench::layout_sizes(layout, n);
    std::vector<dc::device_view<float>> params;
    std::vector<std::size_t> offsets;
    std::size_t off = 0;
    for (std::size_t size : sizes) {
      params.emplace_back(y + off, size);
      offsets.push_back(off);
      off += size;
    }
    const dc::parameter_set<float, dc::device_space> set(params);
    const dc::tensor_list<dc::device_space> list(set, ex, offsets);
    dc::gradient_list<dc::device_space> grad_list(sizes.size());
    const float* const* grads = grad_list.update(ex, [&](std::size_t i) { return g + offsets[i]; });
    const std::string tag = "_tensors_" + layout;
    rows.push_back({"pseudo_gradient" + tag, 12, t.median_seconds(iterations, [&] {
                      (void)ex.transform_reduce_chunked(list.chunks(), k::pseudo_gradients{x, list.ptrs(), m});
                    })});
    rows.push_back({"outer_nesterov" + tag, 24, t.median_seconds(iterations, [&] {
                      ex.for_each_chunked(list.chunks(), k::outer_applies<k::sgd_update, k::merge::overwrite>{
                                                             nesterov, m, 0.25f, x, v, n, list.ptrs(), {}});
                    })});
    rows.push_back({"inner_adamw" + tag, 28, t.median_seconds(iterations, [&] {
                      ex.for_each_chunked(list.chunks(), k::inner_steps<k::adamw_update>{adamw, list.ptrs(), grads, 1.0f,
                                                                                         state.data(), n});
                    })});

    // The codec passes over the same tensors, as the device compressed
    // mean runs them: blocks of 128 cut per tensor (the last one of each
    // partial), flat buffers at the device set's padded offsets, 16-byte
    // accesses only where every tensor and offset allows them. Bytes per
    // element as in the single-tensor rows above.
    const device_layout blocks_of(sizes, 128, ex);
    const std::size_t block_count = blocks_of.count;
    std::vector<k::device_tensor> table;
    bool vector = true;
    std::uint64_t packed = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      table.push_back({y + offsets[i], set.offset(i), packed});
      packed += sizes[i];
      vector = vector && k::aligned16(y + offsets[i]);
    }
    dc::device_buffer<k::device_tensor> layout_tensors(table.size());
    ex.from_host(layout_tensors.data(), table.data(), table.size());
    const std::size_t flat = set.total();
    dc::device_buffer<float> flat_global(flat), flat_residual(flat), flat_next(flat), flat_momentum(flat);
    ex.for_each(flat, fill_pattern{flat_global.data(), 1.0f});
    ex.for_each(flat, fill_pattern{flat_residual.data(), 1e-3f});
    dc::device_buffer<std::byte> layout_payload(block_count * int8_e::stride);
    dc::device_buffer<k::sums2> layout_sums(block_count);
    rows.push_back({"encode_int8_ef" + tag, 17 + (4 + per_block) / 128, t.median_seconds(iterations, [&] {
                      ex.run_teams(block_count, k::encode_blocks<int8_e>{blocks_of.blocks.data(), layout_tensors.data(),
                                                                         flat_global.data(), flat_residual.data(),
                                                                         flat_next.data(), layout_payload.data(), stream,
                                                                         layout_sums.data(), vector});
                    })});
    rows.push_back({"encode_int8" + tag, 9 + (4 + per_block) / 128, t.median_seconds(iterations, [&] {
                      ex.run_teams(block_count, k::encode_blocks<int8_e>{blocks_of.blocks.data(), layout_tensors.data(),
                                                                         flat_global.data(), nullptr, nullptr,
                                                                         layout_payload.data(), stream,
                                                                         layout_sums.data(), vector});
                    })});
    rows.push_back({"decode_apply_int8_nesterov" + tag, 21 + (4 + per_block / 2) / 128,
                    t.median_seconds(iterations, [&] {
                      ex.run_teams(block_count, k::decode_apply_blocks<int8_e, k::sgd_update>{
                                                    nesterov, blocks_of.blocks.data(), layout_tensors.data(),
                                                    layout_payload.data(), flat_global.data(), flat_momentum.data(), flat,
                                                    vector && k::stride_keeps_alignment(flat_momentum.data(), flat)});
                    })});
  }

  double vector_gbps = 0.0, scalar_gbps = 0.0;
  for (const auto& r : rows) {
    const std::size_t elements = r.name.ends_with("_scalar") ? n - 1 : n;
    const double gbps = r.bytes_per_element * static_cast<double>(elements) / r.seconds * 1e-9;
    std::printf("%s_gbps: %.1f\n", r.name.c_str(), gbps);
    std::printf("%s_vs_memcpy: %.3f\n", r.name.c_str(), gbps / memcpy_gbps);
    if (r.name == "outer_nesterov") vector_gbps = gbps;
    if (r.name == "outer_nesterov_scalar") scalar_gbps = gbps;
  }
  std::printf("outer_nesterov_vector_over_scalar: %.3f\n", vector_gbps / scalar_gbps);
  if (orthonormalise_ms > 0.0) std::printf("low_rank_orthonormalise_r4_ms: %.3f\n", orthonormalise_ms);
  return 0;
}
