// Achieved memory bandwidth of each fused kernel, next to a device-to-device
// copy (cudaMemcpyAsync) measured in the same run, and their ratio: a fused
// pass that streams its bytes as fast as the copy engine reaches ~1.0.
// Bytes per element are the counts written beside each kernel in
// include/diloco/kernels/. Prints `name: value` lines.
//
//   bench_cuda_kernels [--elements N] [--iterations K]
//
// Without a GPU it prints a "no GPU" line and exits 0.
#include <diloco/cuda.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dc = diloco;
namespace k = dc::kernels;

namespace {

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
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--elements") == 0) n = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[i + 1]);
  }
  if (n < 8 || iterations < 1) {
    std::fprintf(stderr, "bench_cuda_kernels: need --elements >= 8 and --iterations >= 1\n");
    return 2;
  }
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
    const char* name;
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

  double vector_gbps = 0.0, scalar_gbps = 0.0;
  for (const auto& r : rows) {
    const std::size_t elements = std::string(r.name).ends_with("_scalar") ? n - 1 : n;
    const double gbps = r.bytes_per_element * static_cast<double>(elements) / r.seconds * 1e-9;
    std::printf("%s_gbps: %.1f\n", r.name, gbps);
    std::printf("%s_vs_memcpy: %.3f\n", r.name, gbps / memcpy_gbps);
    if (std::strcmp(r.name, "outer_nesterov") == 0) vector_gbps = gbps;
    if (std::strcmp(r.name, "outer_nesterov_scalar") == 0) scalar_gbps = gbps;
  }
  std::printf("outer_nesterov_vector_over_scalar: %.3f\n", vector_gbps / scalar_gbps);
  return 0;
}
