// SPDX-License-Identifier: Apache-2.0
// exec::cuda on a real GPU: every fused kernel against the host executor on
// random inputs of awkward sizes and misaligned offsets, reductions against
// double sums and against themselves (same bits every run), copies, streams,
// buffers. Without a GPU only the error paths run (see gpu_test_main.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <diloco/cuda.hpp>
#include <random>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/fill.h>
#include <vector>

#include "../device_tensor_set.hpp"
#include "../random_inputs.hpp"

namespace dc = diloco;
namespace k = dc::kernels;

namespace {

// Host memory and device memory holding the same values, each starting
// `offset` floats into an aligned allocation.
struct twin {
  std::vector<float> host;
  thrust::device_vector<float> device;
  std::size_t offset;
  twin(const std::vector<float>& v, std::size_t off) : host(v.size() + off + 4), device(v.size() + off + 4), offset(off) {
    std::copy(v.begin(), v.end(), host.begin() + static_cast<std::ptrdiff_t>(off));
    thrust::copy(host.begin(), host.end(), device.begin());
  }
  float* h() { return host.data() + offset; }
  float* d() { return thrust::raw_pointer_cast(device.data()) + offset; }
  // The device values of the range [0, n) back on the host.
  std::vector<float> device_values(std::size_t n) {
    std::vector<float> out(n);
    if (n) thrust::copy(device.begin() + static_cast<std::ptrdiff_t>(offset),
                        device.begin() + static_cast<std::ptrdiff_t>(offset + n), out.begin());
    return out;
  }
  std::vector<float> host_values(std::size_t n) { return {h(), h() + n}; }
};

// The device contracts a*b+c into one rounding (FMA) where the host rounds
// twice: equal to a few ulps.
void check_close(const std::vector<float>& device, const std::vector<float>& host) {
  REQUIRE(device.size() == host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    const float tol = 2e-6f * std::max(1.0f, std::fabs(host[i]));
    if (!(std::fabs(device[i] - host[i]) <= tol)) {
      CAPTURE(i);
      CHECK(device[i] == doctest::Approx(host[i]));
      return;
    }
  }
}

std::vector<std::size_t> sizes_for(std::size_t offset) {
  std::vector<std::size_t> s = {0, 1, 3, 4, 5, 1023, 1025};
  // Larger than one sweep of the capped grid: the stride loop runs.
  if (offset < 2) s.push_back((std::size_t{1} << 22) + 3);
  return s;
}

}  // namespace

TEST_CASE("cuda_check turns a failed status into cuda_error naming the call") {
  try {
    dc::detail::cuda_check(cudaErrorInvalidValue, "cudaMemcpyAsync", " (a test)");
    FAIL("cuda_check did not throw");
  } catch (const dc::cuda_error& e) {
    CHECK(std::string(e.what()) == "diloco: cudaMemcpyAsync failed: invalid argument (cudaErrorInvalidValue) (a test)");
    CHECK(std::string(e.call()) == "cudaMemcpyAsync");
    CHECK(e.code() == cudaErrorInvalidValue);
  }
  CHECK_NOTHROW(dc::detail::cuda_check(cudaSuccess, "cudaMalloc"));
}

TEST_CASE("no gpu: allocations, launches and copies fail with a cuda_error naming the call") {
  CHECK_THROWS_WITH_AS(dc::device_buffer<float>(16), doctest::Contains("cudaMalloc failed"), dc::cuda_error);
  CHECK_THROWS_WITH_AS(dc::pinned_buffer<float>(16), doctest::Contains("cudaMallocHost failed"), dc::cuda_error);
  dc::exec::cuda ex;
  float host[4] = {};
  float* not_device = host;
  CHECK_THROWS_WITH_AS(ex.for_each(4, k::copy{not_device, not_device}),
                       doctest::Contains("diloco::exec::kernel::for_each launch failed"), dc::cuda_error);
  CHECK_THROWS_AS(ex.transform_reduce(4, k::squares{not_device}), dc::cuda_error);
  CHECK_THROWS_WITH_AS(ex.synchronize(), doctest::Contains("cudaStreamSynchronize failed"), dc::cuda_error);
  // Empty work needs no device and succeeds.
  CHECK_NOTHROW(ex.for_each(0, k::copy{not_device, not_device}));
  CHECK(ex.transform_reduce(0, k::squares{not_device}) == 0.0);
}

TEST_CASE("gpu: device and pinned buffers are zero-filled; copies round-trip") {
  const auto v = random_floats(1025, 5);
  dc::device_buffer<float> a(v.size()), b(v.size());
  dc::pinned_buffer<float> staging(v.size());
  dc::exec::cuda ex;
  std::vector<float> back(v.size(), 1.0f);
  ex.to_host(back.data(), a.data(), v.size());
  for (float x : back) REQUIRE(x == 0.0f);
  for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(staging[i] == 0.0f);
  ex.from_host(a.data(), v.data(), v.size());
  ex.copy(b.data(), a.data(), v.size());
  ex.to_host(staging.data(), b.data(), v.size());
  CHECK(std::memcmp(staging.data(), v.data(), v.size() * sizeof(float)) == 0);
}

TEST_CASE("gpu: every fused kernel matches the host executor at awkward sizes and offsets") {
  const auto adamw = dc::inner::adamw::make_update({.lr = 1e-2f, .weight_decay = 0.1f}, 3);
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  const auto sgd_momentum = dc::inner::sgd::make_update({.lr = 0.1f, .momentum = 0.9f}, 2);
  const auto sgd_plain = dc::inner::sgd::make_update({.lr = 0.1f}, 1);
  dc::exec::host host;
  dc::exec::cuda device;

  for (std::size_t off : {0, 1, 2, 3})
    for (std::size_t n : sizes_for(off)) {
      CAPTURE(off);
      CAPTURE(n);
      const auto x0 = random_floats(n, 1), y0 = random_floats(n, 2), z0 = random_floats(n, 3);
      const std::size_t stride = (n + 3) / 4 * 4;
      const auto s0 = random_floats(2 * stride, 4, 0.0f, 1.0f);

      // make(x, y, z, s, on_device) builds the functor over either copy.
      auto run_both = [&](const char* name, auto make) {
        CAPTURE(name);
        twin x(x0, off), y(y0, off), z(z0, off), s(s0, off);
        host.for_each(n, make(x.h(), y.h(), z.h(), s.h()));
        device.for_each(n, make(x.d(), y.d(), z.d(), s.d()));
        device.synchronize();
        check_close(x.device_values(n), x.host_values(n));
        check_close(y.device_values(n), y.host_values(n));
        check_close(z.device_values(n), z.host_values(n));
        check_close(s.device_values(2 * stride), s.host_values(2 * stride));
      };
      run_both("inner adamw", [&](float* x, float* g, float*, float* s) {
        return k::inner_step<k::adamw_update>{adamw, x, g, 0.75f, s, stride};
      });
      run_both("inner sgd momentum", [&](float* x, float* g, float*, float* s) {
        return k::inner_step<k::sgd_update>{sgd_momentum, x, g, 1.0f, s, stride};
      });
      run_both("inner sgd", [&](float* x, float* g, float*, float*) {
        return k::inner_step<k::sgd_update>{sgd_plain, x, g, 1.0f, nullptr, stride};
      });
      run_both("outer nesterov + copy-back", [&](float* r, float* gl, float* l, float* s) {
        return k::outer_apply<k::sgd_update>{nesterov, r, 0.25f, gl, s, stride, l};
      });
      run_both("outer nesterov, world of one", [&](float* gl, float*, float* l, float* s) {
        return k::outer_apply_local<k::sgd_update>{nesterov, gl, s, stride, l};
      });
      run_both("copy", [&](float* src, float*, float* dst, float*) { return k::copy{src, dst}; });

      // Pseudo-gradient into the wire, with its norm: the wire bit for bit
      // (one subtraction), the sum to double rounding of a reference sum.
      double ref_sq = 0.0, ref_x2 = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const float d = x0[i] - y0[i];
        ref_sq += static_cast<double>(d * d);
        ref_x2 += static_cast<double>(x0[i] * x0[i]);
      }
      twin gl(x0, off), lo(y0, off), wire(z0, off);
      const double sum = device.transform_reduce(n, k::pseudo_gradient{gl.d(), lo.d(), wire.d()});
      host.for_each(n, [&](std::size_t i) { wire.h()[i] = x0[i] - y0[i]; });
      const auto wire_device = wire.device_values(n);
      CHECK(std::memcmp(wire_device.data(), wire.h(), n * sizeof(float)) == 0);
      CHECK(sum == doctest::Approx(ref_sq).epsilon(1e-12));
      CHECK(device.transform_reduce(n, k::pseudo_gradient_sq{gl.d(), lo.d()}) ==
            doctest::Approx(ref_sq).epsilon(1e-12));
      CHECK(device.transform_reduce(n, k::squares{gl.d()}) == doctest::Approx(ref_x2).epsilon(1e-12));
    }
}

TEST_CASE("gpu: a reduction gives the same bits on every run") {
  const auto v = random_floats((std::size_t{1} << 22) + 7, 11);
  thrust::device_vector<float> d(v.begin(), v.end());
  dc::exec::cuda ex;
  const double first = ex.transform_reduce(v.size(), k::squares{thrust::raw_pointer_cast(d.data())});
  for (int run = 0; run < 5; ++run) {
    const double again = ex.transform_reduce(v.size(), k::squares{thrust::raw_pointer_cast(d.data())});
    REQUIRE(std::memcmp(&first, &again, sizeof first) == 0);
  }
}

TEST_CASE("gpu: the executor and the free launcher run on the stream they are given") {
  cudaStream_t stream = nullptr;
  dc::detail::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const auto v = random_floats(100003, 12);
  thrust::device_vector<float> src(v.begin(), v.end()), dst(v.size(), 0.0f);
  dc::exec::cuda ex(stream);
  CHECK(ex.stream() == stream);
  dc::exec::launch_for_each(v.size(), k::copy{thrust::raw_pointer_cast(src.data()), thrust::raw_pointer_cast(dst.data())},
                            stream);
  double ref = 0.0;
  for (float x : v) ref += static_cast<double>(x * x);
  CHECK(ex.transform_reduce(v.size(), k::squares{thrust::raw_pointer_cast(dst.data())}) ==
        doctest::Approx(ref).epsilon(1e-12));
  dc::detail::cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

// ------------------------------------------------------------ compression
// The compression passes on the GPU (kernels/compressed_blocks.hpp,
// kernels/wire_passes.hpp run by exec::cuda) against the host reference
// functors (kernels/compressed_passes.hpp) and the host checksum and
// checks: the wire bytes, the residuals and the norms' per-block sums bit
// for bit; theta_global and the outer state bit for bit under outer SGD
// with lr 1 (no product to fuse), to FMA rounding under Nesterov.
namespace {

namespace cp = dc::compress;

template <class T>
thrust::device_vector<T> to_device(const std::vector<T>& v) {
  return thrust::device_vector<T>(v.begin(), v.end());
}
template <class T>
std::vector<T> to_host(const thrust::device_vector<T>& d) {
  std::vector<T> v(d.size());
  if (!v.empty()) thrust::copy(d.begin(), d.end(), v.begin());
  return v;
}
template <class T>
T* raw(thrust::device_vector<T>& d) {
  return thrust::raw_pointer_cast(d.data());
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

template <class Codec, class Update>
void gpu_compare_passes(const std::vector<std::size_t>& sizes, bool residual, int world, std::uint32_t seed,
                        const Update& update, bool exact_apply) {
  using E = k::codec_elements<Codec>;
  const Codec codec{};
  CAPTURE(Codec::block);
  CAPTURE(residual);
  CAPTURE(world);
  std::vector<std::size_t> packed, padded;
  std::size_t np = 0, nd = 0;
  for (auto n : sizes) {
    packed.push_back(np);
    padded.push_back(nd);
    np += n;
    nd += (n + 15) / 16 * 16;
  }
  const cp::block_layout layout(sizes, Codec::block, 1);
  const std::size_t nb = layout.block_count();
  std::vector<std::vector<float>> local;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    local.push_back(random_floats(sizes[t], seed + static_cast<std::uint32_t>(t), -0.01f, 0.01f));
  std::vector<float> global_h = random_floats(np, seed + 100), residual_h = random_floats(np, seed + 200, -1e-3f, 1e-3f);
  std::vector<float> global_pad(nd, 0.0f), residual_pad(nd, 0.0f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      global_pad[padded[t] + i] = global_h[packed[t] + i];
      residual_pad[padded[t] + i] = residual_h[packed[t] + i];
    }
  std::vector<float*> local_ptr;
  for (auto& l : local) local_ptr.push_back(l.data());
  // The replica on the device (test/device_tensor_set.hpp, whose pointers
  // test_device_tensor_set checks on the host).
  const test_support::device_tensor_set replica(local, padded, packed);
  auto& local_d = replica.storage;
  const auto& tensors = replica.tensors;
  const k::tensor_table table{local_ptr.data(), packed.data()};
  const std::uint64_t stream = k::make_stream(seed, 3, 1, 1);
  std::vector<cp::block_ref> blocks(layout.blocks(), layout.blocks() + nb);
  auto blocks_d = to_device(blocks);
  auto tensors_d = to_device(tensors);
  auto global_d = to_device(global_pad), residual_d = to_device(residual_pad);
  thrust::device_vector<float> next_d(nd, 0.0f);
  thrust::device_vector<std::byte> pay_d(nb * Codec::stride());
  thrust::device_vector<k::sums2> sums_d(nb);
  dc::exec::cuda ex;

  // Stage 1.
  std::vector<std::byte> pay_h(nb * Codec::stride());
  std::vector<float> next_h(np, 0.0f);
  std::vector<k::sums2> sums_h(nb);
  const k::encode_pseudo_gradient<Codec> host{codec, layout.blocks(), table, global_h.data(),
                                              residual ? residual_h.data() : nullptr,
                                              residual ? next_h.data() : nullptr, pay_h.data(), Codec::stride(), stream};
  for (std::size_t b = 0; b < nb; ++b) sums_h[b] = host(b);
  ex.run_teams(nb, k::encode_blocks<E>{raw(blocks_d), raw(tensors_d), raw(global_d),
                                       residual ? raw(residual_d) : nullptr, residual ? raw(next_d) : nullptr,
                                       raw(pay_d), stream, raw(sums_d), E::group == 4});
  ex.synchronize();
  const auto pay = to_host(pay_d);
  CHECK(same_bytes(pay.data(), pay_h.data(), pay.size()));
  const auto sums = to_host(sums_d);
  CHECK(same_bytes(sums.data(), sums_h.data(), nb * sizeof(k::sums2)));
  if (residual) {
    const auto next = to_host(next_d);
    for (std::size_t t = 0; t < sizes.size(); ++t)
      CHECK(same_bytes(next.data() + padded[t], next_h.data() + packed[t], sizes[t] * sizeof(float)));
  }

  // The payload's checksum sum and the structure check on the device.
  {
    const k::segment_ref seg{raw(pay_d), pay.size(), 0, nb, 0};
    auto seg_d = to_device(std::vector<k::segment_ref>{seg});
    thrust::device_vector<std::uint64_t> out(2, 0);
    ex.checksum_segments(raw(seg_d), 1, pay.size(), raw(out));
    thrust::fill(out.begin() + 1, out.end(), ~std::uint64_t{0});
    ex.for_each(k::check_blocks<Codec>::items(nb),
                k::check_blocks<Codec>{codec, raw(seg_d), 1, raw(blocks_d), raw(out) + 1});
    const auto got = to_host(out);
    CHECK(got[0] == dc::wire::detail::payload_words_sum(pay_h.data(), pay_h.size()));
    CHECK(got[1] == ~std::uint64_t{0});
  }

  // Stages 3+4 over `world` encodings.
  std::vector<std::vector<std::byte>> sources;
  std::vector<thrust::device_vector<std::byte>> sources_d;
  for (int r = 0; r < world; ++r) {
    sources.push_back(pay_h);
    const auto v = random_floats(np, seed + 300 + static_cast<std::uint32_t>(r));
    float dq[Codec::block];
    for (std::size_t b = 0; b < nb; ++b) {
      const auto blk = layout.blocks()[b];
      codec.encode(v.data() + packed[blk.tensor] + blk.start, blk.len, sources.back().data() + b * Codec::stride(), dq,
                   stream, 0);
    }
    sources_d.push_back(to_device(sources.back()));
  }
  std::vector<const std::byte*> received, received_on_device;
  for (std::size_t r = 0; r < sources.size(); ++r) {
    received.push_back(sources[r].data());
    received_on_device.push_back(raw(sources_d[r]));
  }
  auto received_d = to_device(received_on_device);
  std::vector<std::byte> red_h(pay_h.size());
  thrust::device_vector<std::byte> red_d(pay_h.size());
  const std::uint64_t stream2 = k::make_stream(seed, 3, 1, 2);
  const k::reduce_shard<Codec> host_reduce{codec, layout.blocks(), packed.data(), received.data(), world,
                                           red_h.data(), Codec::stride(), stream2};
  std::vector<double> reduce_sums(nb);
  for (std::size_t b = 0; b < nb; ++b) reduce_sums[b] = host_reduce(b);
  ex.run_teams(nb, k::reduce_blocks<E>{raw(blocks_d), raw(tensors_d), raw(received_d), world, raw(red_d), stream2,
                                       raw(sums_d)});
  ex.synchronize();
  const auto red = to_host(red_d);
  CHECK(same_bytes(red.data(), red_h.data(), red.size()));
  const auto sums2_back = to_host(sums_d);
  for (std::size_t b = 0; b < nb; ++b) CHECK(same_bytes(&sums2_back[b].a, &reduce_sums[b], sizeof(double)));

  // Stage 7.
  std::vector<float> state_h = random_floats(np, seed + 400), state_pad(nd, 0.0f);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) state_pad[padded[t] + i] = state_h[packed[t] + i];
  auto state_d = to_device(state_pad);
  const k::decode_apply<Codec, Update> host_apply{codec, update, layout.blocks(), table, red_h.data(),
                                                  Codec::stride(), global_h.data(), state_h.data(), np};
  for (std::size_t b = 0; b < nb; ++b) host_apply(b);
  ex.run_teams(nb, k::decode_apply_blocks<E, Update>{update, raw(blocks_d), raw(tensors_d), raw(red_d), raw(global_d),
                                                     raw(state_d), nd, E::group == 4});
  ex.synchronize();
  const auto global_back = to_host(global_d), state_back = to_host(state_d);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    CAPTURE(t);
    const std::vector<float> g(global_back.begin() + static_cast<std::ptrdiff_t>(padded[t]),
                               global_back.begin() + static_cast<std::ptrdiff_t>(padded[t] + sizes[t]));
    const std::vector<float> gh(global_h.begin() + static_cast<std::ptrdiff_t>(packed[t]),
                                global_h.begin() + static_cast<std::ptrdiff_t>(packed[t] + sizes[t]));
    const std::vector<float> s(state_back.begin() + static_cast<std::ptrdiff_t>(padded[t]),
                               state_back.begin() + static_cast<std::ptrdiff_t>(padded[t] + sizes[t]));
    const std::vector<float> sh(state_h.begin() + static_cast<std::ptrdiff_t>(packed[t]),
                                state_h.begin() + static_cast<std::ptrdiff_t>(packed[t] + sizes[t]));
    const auto l = to_host(local_d[t]);
    if (exact_apply) {
      CHECK(same_bytes(g.data(), gh.data(), g.size() * sizeof(float)));
      CHECK(same_bytes(s.data(), sh.data(), s.size() * sizeof(float)));
    } else {
      check_close(g, gh);
      check_close(s, sh);
    }
    CHECK(same_bytes(l.data(), g.data(), g.size() * sizeof(float)));  // the replica is theta_global
  }
}

template <class Codec>
void gpu_compare_codec(const std::vector<std::size_t>& sizes, int world, std::uint32_t seed) {
  const auto sgd = dc::outer::sgd::make_update({}, 1);  // lr 1, no momentum: no product to fuse
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);
  for (bool residual : {false, true}) {
    gpu_compare_passes<Codec>(sizes, residual, world, seed, sgd, true);
    gpu_compare_passes<Codec>(sizes, residual, world, seed + 1, nesterov, false);
  }
}

}  // namespace

TEST_CASE("gpu: compression passes match the host reference at awkward sizes") {
  constexpr std::size_t B = 128;
  // Empty tensors, single elements, B - 1, B + 1, odd counts for int4,
  // several tensors, more blocks than one sweep of teams.
  const std::vector<std::vector<std::size_t>> cases = {
      {1}, {B - 1}, {B + 1}, {0, 3, B - 1, 0, B + 1, 2 * B + 7, 1}, {B * 2000 + 5, 17}};
  for (const auto& sizes : cases) {
    CAPTURE(sizes.size());
    CAPTURE(sizes[0]);
    gpu_compare_codec<cp::blockwise_codec<dc::int8, B, cp::round_nearest>>(sizes, 3, 1);
    gpu_compare_codec<cp::blockwise_codec<dc::int4, B, cp::round_nearest>>(sizes, 2, 2);
    gpu_compare_codec<cp::blockwise_codec<dc::int4, B, cp::stochastic_rounding>>(sizes, 4, 3);
    gpu_compare_codec<cp::cast_codec<dc::bf16, cp::round_nearest>>(sizes, 3, 4);
    gpu_compare_codec<cp::cast_codec<dc::fp16, cp::stochastic_rounding>>(sizes, 2, 5);
  }
  // Groups of 2 (B = 10: int4 blocks of 9 bytes, unaligned factors) and 4
  // groups per thread (B = 4096, one block-wide team and CUB's block
  // reduction).
  gpu_compare_codec<cp::blockwise_codec<dc::int4, 10, cp::round_nearest>>({1, 9, 10, 11, 23}, 3, 6);
  gpu_compare_codec<cp::blockwise_codec<dc::int8, 4096, cp::round_nearest>>({1, 4095, 4097, 9000}, 2, 7);
}

TEST_CASE("gpu: device payload checksums and the structure check match the host") {
  std::vector<std::byte> bytes(8192);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  auto bytes_d = to_device(bytes);
  dc::exec::cuda ex;
  for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 1000, 4096, 8000}) {
    CAPTURE(n);
    std::vector<k::segment_ref> segs{{raw(bytes_d), n, 0, 0, 0}, {raw(bytes_d) + 64, n / 2, 0, 0, 0}};
    auto segs_d = to_device(segs);
    thrust::device_vector<std::uint64_t> sums(2, 7);
    ex.checksum_segments(raw(segs_d), 2, n, raw(sums));
    const auto got = to_host(sums);
    CHECK(got[0] == dc::wire::detail::payload_words_sum(bytes.data(), n));
    CHECK(got[1] == dc::wire::detail::payload_words_sum(bytes.data() + 64, n / 2));
  }
  // int4, B = 8: blocks of 8, 8, 5; segment 0 bad in block 2, segment 1 in
  // blocks 1 and 2 (the first is reported).
  using C4 = cp::blockwise_codec<dc::int4, 8, cp::round_nearest>;
  const cp::block_layout layout({21}, 8, 1);
  const std::size_t stride = C4::stride();
  std::vector<std::byte> payload(6 * stride, std::byte{0});
  payload[2 * stride + 4] = std::byte{0x08};
  payload[5 * stride + 4 + 2] = std::byte{0x10};
  payload[4 * stride + 4 + 3] = std::byte{0x80};
  auto payload_d = to_device(payload);
  std::vector<cp::block_ref> blocks(layout.blocks(), layout.blocks() + 3);
  auto blocks_d = to_device(blocks);
  auto segs_d = to_device(
      std::vector<k::segment_ref>{{raw(payload_d), 3 * stride, 0, 3, 0}, {raw(payload_d) + 3 * stride, 3 * stride, 0, 3, 3}});
  thrust::device_vector<std::uint64_t> first(2, ~std::uint64_t{0});
  ex.for_each(k::check_blocks<C4>::items(6), k::check_blocks<C4>{C4{}, raw(segs_d), 2, raw(blocks_d), raw(first)});
  const auto got = to_host(first);
  CHECK(got[0] == 2);
  CHECK(got[1] == 1);
}
