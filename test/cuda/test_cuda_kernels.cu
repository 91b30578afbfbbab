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
#include <vector>

namespace dc = diloco;
namespace k = dc::kernels;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

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
