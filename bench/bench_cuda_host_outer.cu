// SPDX-License-Identifier: Apache-2.0
// What keeping the outer state in host memory (outer_state_on_host) costs
// and saves, against the outer state on the device, in one run: the device
// memory the algorithm holds (cudaMemGetInfo before and after constructing
// it, per parameter) and the time of a round (wrapper mode, H = 1, outer
// Nesterov, no compression, a world of one: step() after the user's
// optimizer step, timed alone: the round's own passes and copies), with the device-to-host plus host-to-device copy of the
// replica through pinned memory (the floor of the host mode's round)
// measured in the same run. Prints `name: value` lines.
//
//   bench_cuda_host_outer [--elements N] [--rounds R]
//
// Without a GPU it prints a "no GPU" line and exits 0.
#include <CLI/CLI.hpp>
#include <diloco/cuda.hpp>
#include <thrust/device_vector.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <vector>

namespace dc = diloco;

namespace {

// The user's optimizer step: every parameter moved by a small amount that
// differs per element and per step.
struct user_step {
  float* w;
  int step;
  __device__ void operator()(std::size_t i) const {
    w[i] += 1e-4f * static_cast<float>(static_cast<int>((i * 2654435761u + static_cast<unsigned>(step)) % 201u) - 100);
  }
};

std::size_t device_free() {
  std::size_t free = 0, total = 0;
  dc::detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  dc::detail::cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct figures {
  double held_bytes = 0;   // device memory the algorithm holds
  double round_s = 0;      // median round: the algorithm's step after the user's (H = 1)
};

template <class Make>
figures measure(thrust::device_vector<float>& w, int rounds, Make&& make) {
  figures f;
  const std::size_t before = device_free();
  auto t = make();
  const std::size_t after = device_free();
  f.held_bytes = static_cast<double>(before) - static_cast<double>(after);
  std::vector<double> times;
  float* p = thrust::raw_pointer_cast(w.data());
  for (int r = 0; r < rounds + 2; ++r) {  // two warm-up rounds
    thrust::for_each(thrust::counting_iterator<std::size_t>(0), thrust::counting_iterator<std::size_t>(w.size()),
                     user_step{p, r});
    dc::detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    t->step();
    dc::detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (r >= 2) times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  f.round_s = times[times.size() / 2];
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{1} << 27;  // 512 MiB of fp32 parameters
  int rounds = 5;
  CLI::App app("Outer state in host memory against on the device: device memory held and round time");
  app.add_option("--elements", n, "fp32 parameters")->capture_default_str()->check(
      CLI::Range(std::size_t{1024}, std::size_t{1} << 32));
  app.add_option("--rounds", rounds, "timed rounds (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  if (dc::cuda_device_count() == 0) {
    std::printf("no GPU: skipping the host outer state benchmark\n");
    return 0;
  }
  cudaDeviceProp prop{};
  dc::detail::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s\n", prop.name);
  std::printf("elements: %zu\n", n);

  using algo = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  const dc::algorithm_options<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::sync::blocking> o{
      .inner_steps = 1};
  dc::comm::local comm;
  thrust::device_vector<float> w(n, 0.5f);

  const figures resident = measure(w, rounds, [&] { return std::make_unique<algo>(w, comm, o); });
  const figures host = measure(w, rounds, [&] { return std::make_unique<algo>(dc::outer_state_on_host(w), comm, o); });

  // The floor of the host mode's round: the replica copied to pinned host
  // memory and back, once each.
  float* pinned = nullptr;
  dc::detail::cuda_check(cudaMallocHost(&pinned, n * sizeof(float)), "cudaMallocHost");
  std::vector<double> copy;
  for (int r = 0; r < rounds + 2; ++r) {
    dc::detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    dc::detail::cuda_check(cudaMemcpy(pinned, thrust::raw_pointer_cast(w.data()), n * sizeof(float),
                                      cudaMemcpyDeviceToHost),
                           "cudaMemcpy");
    dc::detail::cuda_check(cudaMemcpy(thrust::raw_pointer_cast(w.data()), pinned, n * sizeof(float),
                                      cudaMemcpyHostToDevice),
                           "cudaMemcpy");
    if (r >= 2) copy.push_back(seconds_since(t0));
  }
  dc::detail::cuda_check(cudaFreeHost(pinned), "cudaFreeHost");
  std::sort(copy.begin(), copy.end());
  const double copy_s = copy[copy.size() / 2];

  const double params = static_cast<double>(n);
  std::printf("device_bytes_per_param_resident: %.3f\n", resident.held_bytes / params);
  std::printf("device_bytes_per_param_on_host: %.3f\n", host.held_bytes / params);
  std::printf("round_ms_resident: %.3f\n", 1e3 * resident.round_s);
  std::printf("round_ms_on_host: %.3f\n", 1e3 * host.round_s);
  std::printf("round_on_host_over_resident: %.2f\n", host.round_s / resident.round_s);
  std::printf("replica_round_trip_ms: %.3f\n", 1e3 * copy_s);
  std::printf("replica_round_trip_gbps: %.1f\n", 2.0 * params * sizeof(float) / copy_s / 1e9);
  std::printf("round_on_host_over_round_trip: %.2f\n", host.round_s / copy_s);
  return 0;
}
