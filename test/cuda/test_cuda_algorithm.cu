// SPDX-License-Identifier: Apache-2.0
// diloco::algorithm and diloco::optimizer over device tensors on a real GPU,
// against the same programs over host tensors: only the tensor type differs
// between the two. Without a GPU only the failure path runs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <diloco/cuda.hpp>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <vector>

#if defined(DILOCO_TEST_NCCL)
#include <diloco/comm/nccl.hpp>
#endif

namespace dc = diloco;

namespace {

constexpr int workers = 3;
const std::vector<std::size_t> sizes = {3, 17, 1, 64, 1025, 5};

float target(int m, std::size_t j) { return std::sin(static_cast<float>(7 * m) + 0.37f * static_cast<float>(j)); }

// The user's gradient of 0.5 * ||w - t||^2, as a functor the host executor
// and the CUDA launcher both run.
struct quadratic_gradient {
  const float* w;
  const float* t;
  float* g;
  DILOCO_HD void operator()(std::size_t i) const { g[i] = w[i] - t[i]; }
};

// A worker's model with tensors of type Vec (std::vector<float> or
// thrust::device_vector<float>) and the executor that computes its
// gradients.
template <class Vec, class Exec>
struct model {
  std::vector<Vec> params, grads, targets;
  Exec exec;

  explicit model(int rank) {
    std::size_t j = 0;
    for (std::size_t n : sizes) {
      std::vector<float> p(n), t(n);
      for (std::size_t i = 0; i < n; ++i, ++j) {
        p[i] = 0.1f * static_cast<float>(rank + 1) * static_cast<float>(i % 5);
        t[i] = target(rank, j);
      }
      params.emplace_back(p.begin(), p.end());
      targets.emplace_back(t.begin(), t.end());
      grads.emplace_back(n, 0.0f);
    }
  }
  // The parameters as row-major matrices of cols[k] columns (1: a vector),
  // for compressors that use shapes (low_rank).
  std::vector<dc::matrix_view<float, dc::tensor_space_t<Vec>>> matrices(const std::vector<std::size_t>& cols) {
    std::vector<dc::matrix_view<float, dc::tensor_space_t<Vec>>> out;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      out.emplace_back(dc::tensor_data(params[k]), sizes[k] / cols[k], cols[k]);
    return out;
  }
  void backward() {
    for (std::size_t k = 0; k < sizes.size(); ++k)
      exec.for_each(sizes[k], quadratic_gradient{dc::tensor_data(params[k]), dc::tensor_data(targets[k]),
                                                 dc::tensor_data(grads[k])});
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& p : params) {
      std::vector<float> h(p.size());
      thrust::copy(p.begin(), p.end(), h.begin());
      out.insert(out.end(), h.begin(), h.end());
    }
    return out;
  }
};

using host_model = model<std::vector<float>, dc::exec::host>;
using device_model = model<thrust::device_vector<float>, dc::exec::cuda>;

using options = dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov, dc::compress::none>;
const options opts{.inner_steps = 4,
                   .inner = {.lr = 0.05f, .weight_decay = 0.01f, .max_grad_norm = 2.0f},
                   .outer = {.lr = 0.7f, .momentum = 0.9f}};

template <class Model>
std::vector<std::vector<float>> train_threads(int rounds) {
  std::vector<std::vector<float>> out(workers);
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    Model m(comm.rank());
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(m.params, comm,
                                                                                                  opts);
    for (int s = 0; s < rounds * 4; ++s) {
      m.backward();
      t.step(m.grads);
    }
    CHECK(t.stats().rounds == static_cast<std::uint64_t>(rounds));
    out[static_cast<std::size_t>(comm.rank())] = m.flat();
  });
  return out;
}

void check_close(const std::vector<float>& device, const std::vector<float>& host, float rel) {
  REQUIRE(device.size() == host.size());
  for (std::size_t i = 0; i < host.size(); ++i)
    if (!(std::fabs(device[i] - host[i]) <= rel * std::max(1.0f, std::fabs(host[i])))) {
      CAPTURE(i);
      CHECK(device[i] == doctest::Approx(host[i]));
      return;
    }
}

}  // namespace

TEST_CASE("no gpu: an algorithm over device tensors fails with cuda_error at construction") {
  float fake[8] = {};
  dc::device_view<float> w(fake, 8);
  dc::comm::local comm;
  using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  CHECK_THROWS_WITH_AS(trainer(w, comm), doctest::Contains("cudaMalloc failed"), dc::cuda_error);
}

TEST_CASE("no gpu: algorithm_options::device_stream becomes the executor's stream") {
  int tag = 0;
  void* stream = &tag;  // never used as a stream here: no CUDA call is made
  CHECK(dc::exec::cuda::on_stream(stream).stream() == static_cast<cudaStream_t>(stream));
  CHECK(dc::detail::make_executor<dc::exec::cuda>(nullptr).stream() == nullptr);
}

// The algorithm on the caller's stream: the gradients are written on that
// stream and the library's passes are ordered after them with no
// synchronization in between; the results are those of the default stream.
TEST_CASE("gpu: an algorithm on the caller's non-blocking stream gives the default stream's bits") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  auto run = [&](cudaStream_t s) {
    dc::comm::local comm;
    model<thrust::device_vector<float>, dc::exec::cuda> m(0);
    m.exec = dc::exec::cuda(s);
    auto o = opts;
    o.device_stream = s;
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(m.params, comm, o);
    for (int step = 0; step < 12; ++step) {
      m.backward();  // queued on s
      t.step(m.grads);
    }
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    return m.flat();
  };
  const auto on_stream = run(stream);
  const auto on_default = run(nullptr);
  CHECK(std::memcmp(on_stream.data(), on_default.data(), on_default.size() * sizeof(float)) == 0);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("gpu: DiLoCo over thrust::device_vector with comm::threads (staged) matches host tensors") {
  const auto host = train_threads<host_model>(4);
  const auto device = train_threads<device_model>(4);
  for (std::size_t m = 0; m < workers; ++m) {
    CAPTURE(m);
    // Replicas agree exactly across workers; host and device to FMA
    // rounding accumulated over 16 steps.
    CHECK(std::memcmp(device[m].data(), device[0].data(), device[0].size() * sizeof(float)) == 0);
    check_close(device[m], host[m], 1e-4f);
  }
}

#if defined(DILOCO_TEST_NCCL)
// The device communicator path of the engine (no staging): a world of one
// NCCL rank on this GPU against comm::local over host tensors.
TEST_CASE("gpu: DiLoCo over comm::nccl with device tensors matches host tensors") {
  using nccl_trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::nccl>;
  static_assert(dc::device_communicator<dc::comm::nccl>);
  dc::comm::nccl comm(dc::comm::nccl::make_unique_id(), 0, 1);
  device_model d(1);
  nccl_trainer t(d.params, comm, opts);
  for (int s = 0; s < 12; ++s) {
    d.backward();
    t.step(d.grads);
  }
  host_model h(1);
  dc::comm::local local;
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> th(h.params, local, opts);
  for (int s = 0; s < 12; ++s) {
    h.backward();
    th.step(h.grads);
  }
  CHECK(t.stats().rounds == 3);
  check_close(d.flat(), h.flat(), 1e-4f);
}
#endif

TEST_CASE("gpu: a world of one over device tensors matches host tensors") {
  auto run = [](auto& m) {
    dc::comm::local comm;
    dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(m.params, comm, opts);
    for (int s = 0; s < 12; ++s) {
      m.backward();
      t.step(m.grads);
    }
    return m.flat();
  };
  host_model h(1);
  device_model d(1);
  check_close(run(d), run(h), 1e-4f);
}

TEST_CASE("gpu: optimizer<adamw, exec::cuda> matches optimizer<adamw> on the host") {
  host_model h(2);
  device_model d(2);
  dc::optimizer<dc::inner::adamw> ho(h.params, {.lr = 0.01f, .max_grad_norm = 1.0f});
  dc::optimizer<dc::inner::adamw, dc::exec::cuda> dopt(d.params, {.lr = 0.01f, .max_grad_norm = 1.0f});
  for (int s = 0; s < 10; ++s) {
    h.backward();
    ho.step(h.grads);
    d.backward();
    dopt.step(d.grads);
  }
  check_close(d.flat(), h.flat(), 1e-5f);
}

TEST_CASE("gpu: host gradients passed to a device algorithm are a config error") {
  device_model d(0);
  dc::comm::local comm;
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(d.params, comm, opts);
  std::vector<std::vector<float>> host_grads(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) host_grads[k].resize(sizes[k]);
  CHECK_THROWS_WITH_AS(t.step(host_grads), doctest::Contains("tensors in host memory passed to an algorithm"),
                       dc::config_error);
}

// ------------------------------------------------------------ compression
namespace {

namespace cp = dc::compress;

// Inner SGD with lr 1/2 and outer SGD with lr 1 multiply only by powers of
// two, so the device's fused multiply-adds round exactly as the host's
// separate operations: host and device tensors must give the same bits,
// round after round, through the compressed mean.
template <class C, class Sync = dc::sync::blocking>
using sgd_trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, C, dc::comm::threads, Sync>;
template <class C, class Sync = dc::sync::blocking>
const typename sgd_trainer<C, Sync>::options sgd_opts{.inner_steps = 3, .inner = {.lr = 0.5f}, .outer = {.lr = 1.0f}};

// `rounds` phases of H = 3 steps, then finish() (a delayed schedule applies
// its last round there). `cols`: the tensors' shapes for low_rank (empty:
// the tensors as they are).
template <class C, class Model, class Sync = dc::sync::blocking>
std::vector<std::vector<float>> train_compressed(int rounds, int m, typename C::options co = {},
                                                 const std::vector<std::size_t>& cols = {},
                                                 typename Sync::options so = {}) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(m));
  dc::comm::threads::world world(m);
  world.run([&](dc::comm::threads& comm) {
    Model model(comm.rank());
    auto opts = sgd_opts<C, Sync>;
    opts.compress = co;
    opts.sync = so;
    auto train = [&](auto& params) {
      sgd_trainer<C, Sync> t(params, comm, opts);
      for (int s = 0; s < rounds * 3; ++s) {
        model.backward();
        t.step(model.grads);
      }
      t.finish();
      CHECK(t.stats().rounds == static_cast<std::uint64_t>(rounds));
      CHECK(t.stats().rejected_rounds == 0);
    };
    if (cols.empty()) {
      train(model.params);
    } else {
      auto shaped = model.matrices(cols);
      train(shaped);
    }
    out[static_cast<std::size_t>(comm.rank())] = model.flat();
  });
  return out;
}

template <class C>
void check_same_bits(int m, typename C::options co = {}, const std::vector<std::size_t>& cols = {}) {
  CAPTURE(C::name);
  CAPTURE(C::has_error_feedback);
  CAPTURE(m);
  const auto host = train_compressed<C, host_model>(4, m, co, cols);
  const auto device = train_compressed<C, device_model>(4, m, co, cols);
  for (std::size_t r = 0; r < host.size(); ++r) {
    CAPTURE(r);
    REQUIRE(device[r].size() == host[r].size());
    CHECK(std::memcmp(device[r].data(), host[r].data(), host[r].size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("no gpu: a compressed algorithm over device tensors fails with cuda_error at construction") {
  float fake[8] = {};
  dc::device_view<float> w(fake, 8);
  dc::comm::local comm;
  using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, cp::error_feedback<cp::blockwise<dc::int4>>,
                                dc::comm::local>;
  CHECK_THROWS_WITH_AS(trainer(w, comm), doctest::Contains("cudaMalloc failed"), dc::cuda_error);
}

TEST_CASE("gpu: compressed DiLoCo over thrust::device_vector gives the host tensors' bits") {
  for (int m : {1, 2, 3}) {
    check_same_bits<cp::blockwise<dc::int8>>(m);
    check_same_bits<cp::error_feedback<cp::blockwise<dc::int8>>>(m);
    check_same_bits<cp::error_feedback<cp::blockwise<dc::int4, 64, cp::stochastic_rounding>>>(m);
    check_same_bits<cp::cast<dc::bf16>>(m);
    check_same_bits<cp::error_feedback<cp::cast<dc::fp16>>>(m);
    // adaptive: int4 in the first round, int8 after it (a budget every rung fits).
    using ladder = cp::adaptive<cp::error_feedback<cp::blockwise<dc::int8>>, cp::error_feedback<cp::blockwise<dc::int4>>>;
    check_same_bits<ladder>(m, {.rule = {.budget_seconds = 1e9, .start = 1}});
    // Sparse (gathered): the selection's radix select in shared memory.
    check_same_bits<cp::error_feedback<cp::chunk_topk<64, 8, dc::int2>>>(m, {.decay = 0.95f});
    check_same_bits<cp::chunk_topk<4096, 64, dc::int4>>(m);
    using sparse_ladder = cp::adaptive<cp::error_feedback<cp::blockwise<dc::int8>>,
                                       cp::error_feedback<cp::chunk_topk<256, 16, dc::int8>>>;
    check_same_bits<sparse_ladder>(m, {.rule = {.budget_seconds = 1e9, .start = 1}});
    // low_rank (PowerSGD): 64 as 8 x 8 and 1025 as 41 x 25 at rank 2, the
    // rest vectors; its products, orthonormalisation and norms as grid
    // launches with one fixed summation order per output.
    const std::vector<std::size_t> shapes = {1, 1, 1, 8, 25, 1};
    check_same_bits<cp::low_rank>(m, {.rank = 2, .seed = 3}, shapes);
  }
}

// The overlapping schedules keep the exchange in flight while inner steps
// run: device buffers are staged through pinned host memory when each
// collective starts and copied back when it completes.
TEST_CASE("gpu: overlapped (non-blocking, staged) exchanges over device tensors give the host tensors' bits") {
  using int8_ef = cp::error_feedback<cp::blockwise<dc::int8>>;
  for (int m : {2, 3}) {
    CAPTURE(m);
    const auto same = [](const auto& device, const auto& host) {
      for (std::size_t r = 0; r < host.size(); ++r)
        CHECK(std::memcmp(device[r].data(), host[r].data(), host[r].size() * sizeof(float)) == 0);
    };
    same(train_compressed<int8_ef, device_model, dc::sync::one_step_delay>(4, m),
         train_compressed<int8_ef, host_model, dc::sync::one_step_delay>(4, m));
    same(train_compressed<cp::none, device_model, dc::sync::one_step_delay>(4, m),
         train_compressed<cp::none, host_model, dc::sync::one_step_delay>(4, m));
  }
}

TEST_CASE("gpu: compressed DiLoCo with AdamW and Nesterov over device tensors stays with the host run") {
  using C = cp::error_feedback<cp::cast<dc::bf16>>;
  using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, C, dc::comm::threads>;
  const trainer::options o{.inner_steps = 4,
                           .inner = {.lr = 0.05f, .weight_decay = 0.01f, .max_grad_norm = 2.0f},
                           .outer = {.lr = 0.7f, .momentum = 0.9f}};
  auto run = [&]<class Model>(Model*) {
    std::vector<std::vector<float>> out(workers);
    std::vector<dc::stats> stats(workers);
    dc::comm::threads::world world(workers);
    world.run([&](dc::comm::threads& comm) {
      Model model(comm.rank());
      trainer t(model.params, comm, o);
      for (int s = 0; s < 12; ++s) {
        model.backward();
        t.step(model.grads);
      }
      out[static_cast<std::size_t>(comm.rank())] = model.flat();
      stats[static_cast<std::size_t>(comm.rank())] = t.stats();
    });
    return std::make_pair(out, stats);
  };
  const auto [host, host_stats] = run(static_cast<host_model*>(nullptr));
  const auto [device, device_stats] = run(static_cast<device_model*>(nullptr));
  for (std::size_t r = 0; r < workers; ++r) {
    CAPTURE(r);
    // Replicas agree exactly across workers; host and device to the FMA
    // rounding of the inner and outer steps, which can move a bf16 code by
    // one unit (2^-8 relative).
    CHECK(std::memcmp(device[r].data(), device[0].data(), device[0].size() * sizeof(float)) == 0);
    check_close(device[r], host[r], 1e-2f);
    CHECK(device_stats[r].rounds == 3);
    CHECK(device_stats[r].encoded_bytes_per_parameter == host_stats[r].encoded_bytes_per_parameter);
    CHECK(device_stats[r].pseudo_gradient_norm == doctest::Approx(host_stats[r].pseudo_gradient_norm).epsilon(1e-3));
  }
}

// The bf16 tests' replica and the user's optimizer: a step written on the
// host, and the same step on n bf16 values in device memory (copied into
// `scratch`, stepped, copied back).
namespace {
std::vector<dc::bfloat16> bf16_start(std::size_t n) {
  std::vector<dc::bfloat16> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = dc::bfloat16::round(0.01f * static_cast<float>(i % 97) - 0.3f);
  return w;
}
void bf16_user_step(std::vector<dc::bfloat16>& w, int s) {
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = dc::bfloat16::round(static_cast<float>(w[i]) * 0.99f + 0.001f * static_cast<float>((i + static_cast<std::size_t>(s)) % 7));
}
void bf16_user_step_on_device(dc::bfloat16* dev, std::vector<dc::bfloat16>& scratch, int s) {
  const std::size_t bytes = scratch.size() * sizeof(dc::bfloat16);
  REQUIRE(cudaMemcpy(scratch.data(), dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  bf16_user_step(scratch, s);
  REQUIRE(cudaMemcpy(dev, scratch.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
}
}  // namespace

// A bf16 replica on the device (tensor/low_precision.hpp): the user's
// optimizer (here a step written on the host and copied over) moves the
// bf16 tensors, inner::external; the device mirror's passes give the host
// mirror's bits, since the element rules are the same DILOCO_HD code and the
// world-of-one round has no FMA-sensitive step beyond outer Nesterov (both
// sides run the same functor; compared to 1 bf16 code).
TEST_CASE("gpu: a bf16 replica in device memory follows the same run over host memory") {
  constexpr std::size_t n = 1000;
  constexpr int steps = 12;
  using T = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  const dc::algorithm_options<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::sync::blocking> o{
      .inner_steps = 4};
  std::vector<dc::bfloat16> host = bf16_start(n);
  std::vector<dc::bfloat16> mirror_of_device = host;
  dc::bfloat16* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(dc::bfloat16)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), n * sizeof(dc::bfloat16), cudaMemcpyHostToDevice) == cudaSuccess);
  dc::device_view<dc::bfloat16> view(dev, n);
  dc::comm::local comm;
  {
    T on_host(host, comm, o);
    T on_device(view, comm, o);
    for (int s = 0; s < steps; ++s) {
      bf16_user_step(host, s);
      on_host.step();
      bf16_user_step_on_device(dev, mirror_of_device, s);
      on_device.step();
    }
  }
  REQUIRE(cudaMemcpy(mirror_of_device.data(), dev, n * sizeof(dc::bfloat16), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(dev);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int d = static_cast<int>(host[i].bits) - static_cast<int>(mirror_of_device[i].bits);
    CHECK(std::abs(d) <= 1);
    differ += d != 0;
  }
  CHECK(differ < n / 20);
}

// Outer state in host memory (tensor/host_outer_state.hpp): the same
// wrapper-mode run with theta_global and the outer state in pinned host
// memory gives the device-resident run's bits (the same functors on both
// sides), for an fp32 replica.
TEST_CASE("gpu: outer_state_on_host gives the device-resident outer state's bits") {
  constexpr std::size_t n = 4099;
  constexpr int steps = 12;
  using T = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  const dc::algorithm_options<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::sync::blocking> o{
      .inner_steps = 4};
  std::vector<float> start(n);
  for (std::size_t i = 0; i < n; ++i) start[i] = std::sin(0.01f * static_cast<float>(i));
  thrust::device_vector<float> a(start.begin(), start.end()), b(start.begin(), start.end());
  std::vector<float> host(n);
  auto user_step = [&](thrust::device_vector<float>& w, int s) {  // the user's optimizer, on the host here
    thrust::copy(w.begin(), w.end(), host.begin());
    for (std::size_t i = 0; i < n; ++i) host[i] = host[i] * 0.99f + 0.001f * static_cast<float>((i + static_cast<std::size_t>(s)) % 5);
    thrust::copy(host.begin(), host.end(), w.begin());
  };
  dc::comm::local comm;
  {
    T resident(a, comm, o);
    T on_host(dc::outer_state_on_host(b), comm, o);
    for (int s = 0; s < steps; ++s) {
      user_step(a, s);
      resident.step();
      user_step(b, s);
      on_host.step();
    }
    // copy_global_to writes tensors in the parameters' memory space (the
    // device here); the host engine's theta_global is a host view.
    thrust::device_vector<float> ga_device(n);
    resident.copy_global_to(ga_device);
    std::vector<float> ga(n);
    thrust::copy(ga_device.begin(), ga_device.end(), ga.begin());
    CHECK_THROWS_AS(resident.copy_global_to(ga), dc::config_error);  // host targets, device parameters
    const auto gb = on_host.global_parameters();
    CHECK(std::memcmp(ga.data(), gb.data(), n * sizeof(float)) == 0);
  }
  std::vector<float> ra(n), rb(n);
  thrust::copy(a.begin(), a.end(), ra.begin());
  thrust::copy(b.begin(), b.end(), rb.begin());
  CHECK(std::memcmp(ra.data(), rb.data(), n * sizeof(float)) == 0);
}

// Outer state in host memory with a bf16 replica on the device: the host
// outer mirror stages the codes and runs tensor/low_precision.hpp's host
// loops on them, so the run gives, bit for bit, the run whose bf16 replica
// lives in host memory (the same host engine, loops and rule).
TEST_CASE("gpu: outer_state_on_host with a bf16 device replica gives the host-memory bf16 run's bits") {
  constexpr std::size_t n = 40000;  // more than two of the staging's pieces
  constexpr int steps = 12;
  using T = dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
  const dc::algorithm_options<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::sync::blocking> o{
      .inner_steps = 4};
  std::vector<dc::bfloat16> host = bf16_start(n);
  std::vector<dc::bfloat16> of_device = host;
  dc::bfloat16* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(dc::bfloat16)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), n * sizeof(dc::bfloat16), cudaMemcpyHostToDevice) == cudaSuccess);
  dc::device_view<dc::bfloat16> view(dev, n);
  dc::comm::local comm;
  std::vector<float> global_host(n), global_device(n);
  {
    T in_host_memory(host, comm, o);
    T outer_on_host(dc::outer_state_on_host(view), comm, o);
    for (int s = 0; s < steps; ++s) {
      bf16_user_step(host, s);
      in_host_memory.step();
      bf16_user_step_on_device(dev, of_device, s);
      outer_on_host.step();
    }
    in_host_memory.copy_global_to(global_host);
    outer_on_host.copy_global_to(global_device);
  }
  REQUIRE(cudaMemcpy(of_device.data(), dev, n * sizeof(dc::bfloat16), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(dev);
  CHECK(std::memcmp(global_host.data(), global_device.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(host.data(), of_device.data(), n * sizeof(dc::bfloat16)) == 0);
}
