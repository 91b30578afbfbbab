// SPDX-License-Identifier: Apache-2.0
#pragma once

// inner::muon over device tensors: the element passes of inner/muon.hpp on
// exec::cuda's stream, the Newton-Schulz products as cuBLAS SGEMMs on the
// same stream. Opt-in: include this after <diloco/cuda.hpp> in a .cu file
// and link CUDA::cublas (diloco::cuda does not link cuBLAS, so programs that
// do not run Muon on the device need no cuBLAS). Without it, Muon over
// device tensors stops the compiler with a message saying so.
//
// fp32 throughout (CUBLAS_DEFAULT_MATH: no TF32 unless the environment
// forces it with NVIDIA_TF32_OVERRIDE). cuBLAS sums in its own order, so the
// device's results are not the host's bits; they agree to rounding
// (test/cuda/test_cuda_muon.cu compares them).

#if !defined(__CUDACC__)
#error "diloco/inner/muon_cuda.hpp must be compiled with nvcc; include it after <diloco/cuda.hpp> from a .cu file"
#endif

#include <cublas_v2.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "diloco/core/error.hpp"
#include "diloco/exec/cuda.hpp"
#include "diloco/inner/muon.hpp"
#include "diloco/memory/device_buffer.hpp"

namespace diloco::detail {

// Throws cuda_error naming the cuBLAS call and its status.
inline void cublas_check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw cuda_error(concat("diloco: ", call, " failed: ", cublasGetStatusString(status), " (cuBLAS status ",
                          static_cast<int>(status), ")"),
                   call, cudaErrorUnknown);
}

// The three products of inner/muon.hpp as SGEMMs. Our matrices are
// row-major; cuBLAS is column-major, and a row-major M is the column-major
// M^T, so each product is taken on the transposes:
//   gram:       A^T = (X^T)^T X^T   -> gemm(T, N) on X's buffer twice
//   polynomial: B^T = cc A^T A^T + cb A^T   (B starts as a copy of A)
//   combine:    Y^T = X^T B^T + ca X^T      (Y starts as a copy of X)
struct muon_cublas_products {
  cublasHandle_t handle;
  cudaStream_t stream;

  static int dim(std::size_t v) {
    if (v > static_cast<std::size_t>(INT_MAX))
      raise<config_error>("muon: a matrix dimension of ", v, " elements exceeds cuBLAS's int range (", INT_MAX, ")");
    return static_cast<int>(v);
  }
  void copy(float* dst, const float* src, std::size_t n) const {
    cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync",
               " (muon scratch, ", n * sizeof(float), " bytes)");
  }
  void gram(const float* x, std::size_t m, std::size_t n, float* a) {
    const float one = 1.0f, zero = 0.0f;
    cublas_check(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, dim(m), dim(m), dim(n), &one, x, dim(n), x, dim(n),
                             &zero, a, dim(m)),
                 "cublasSgemm");
  }
  void polynomial(const float* a, std::size_t m, double cb, double cc, float* b) {
    copy(b, a, m * m);
    const auto alpha = static_cast<float>(cc), beta = static_cast<float>(cb);
    cublas_check(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, dim(m), dim(m), dim(m), &alpha, a, dim(m), a, dim(m),
                             &beta, b, dim(m)),
                 "cublasSgemm");
  }
  void combine(const float* b, const float* x, std::size_t m, std::size_t n, double ca, float* y) {
    copy(y, x, m * n);
    const float one = 1.0f;
    const auto beta = static_cast<float>(ca);
    cublas_check(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, dim(n), dim(m), dim(m), &one, x, dim(n), b, dim(m),
                             &beta, y, dim(n)),
                 "cublasSgemm");
  }
};

// The device step: a cuBLAS handle made at the first matrix (on the device
// current then), scratch grown to the largest matrix seen.
template <>
class muon_stepper<device_space> {
 public:
  muon_stepper() = default;
  muon_stepper(const muon_stepper&) = delete;
  muon_stepper& operator=(const muon_stepper&) = delete;
  muon_stepper(muon_stepper&& o) noexcept
      : handle_(std::exchange(o.handle_, nullptr)),
        x_(std::move(o.x_)),
        y_(std::move(o.y_)),
        a_(std::move(o.a_)),
        b_(std::move(o.b_)) {}
  muon_stepper& operator=(muon_stepper&& o) noexcept {
    if (this != &o) {
      release();
      handle_ = std::exchange(o.handle_, nullptr);
      x_ = std::move(o.x_);
      y_ = std::move(o.y_);
      a_ = std::move(o.a_);
      b_ = std::move(o.b_);
    }
    return *this;
  }
  ~muon_stepper() { release(); }

  template <class Exec>
  void step(Exec& exec, const inner::muon::options& o, std::uint64_t step, const tensor_step& t) {
    static_assert(std::is_same_v<Exec, exec::cuda>, "diloco::inner::muon over device tensors runs on exec::cuda");
    if (t.size() == 0) return;
    if (inner::muon::orthogonalises(t.shape)) {
      reserve(t.shape);
      if (handle_ == nullptr) {
        cublas_check(cublasCreate(&handle_), "cublasCreate");
        cublas_check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
      }
      cublas_check(cublasSetStream(handle_, exec.stream()), "cublasSetStream");
    }
    muon_cublas_products mm{handle_, exec.stream()};
    muon_tensor_step(exec, mm, o, step, t, {x_.data(), y_.data(), a_.data(), b_.data()});
  }

 private:
  void reserve(const tensor_shape& s) {
    const std::size_t m = std::min(s.rows, s.cols);
    if (x_.size() < s.rows * s.cols) {
      x_ = buffer<float, device_space>(s.rows * s.cols);
      y_ = buffer<float, device_space>(s.rows * s.cols);
    }
    if (a_.size() < m * m) {
      a_ = buffer<float, device_space>(m * m);
      b_ = buffer<float, device_space>(m * m);
    }
  }
  void release() noexcept {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
    handle_ = nullptr;
  }

  cublasHandle_t handle_ = nullptr;
  buffer<float, device_space> x_, y_, a_, b_;
};

}  // namespace diloco::detail
