// SPDX-License-Identifier: Apache-2.0
#pragma once

// libtorch tensors as diloco tensors (CMake component `torch`, target
// diloco::torch; needs find_package(Torch)).
//
//   torch::Tensor          a CPU tensor: host_space. fp32, strided and
//                          contiguous, checked at run time (config_error).
//   torch_device_tensor    a CUDA tensor wrapped to say "device memory",
//   torch_device_views()   or CUDA tensors as plain device views (for the
//                          CUDA engine; see below for what builds it).
//   torch_parameters       a module's trainable parameters and, after each
//                          backward pass, their gradients.
//
// Memory space is a compile-time property of a diloco tensor type, while a
// torch tensor's device is a run-time one. A bare torch::Tensor therefore
// always means host memory, and a CUDA tensor must be wrapped in
// torch_device_tensor: the choice is written in the user's code, and each
// side checks at run time that the tensor really is where its type says.
//
//   diloco::torch_parameters params(*model);
//   diloco::algorithm<...> t(params.tensors(), comm, {...});
//   loss.backward();
//   t.step(params.gradients());
//
// The library keeps pointers into the parameters' storage: do not move the
// module to another device or dtype, or replace its parameters, while an
// optimizer or algorithm refers to them. Updates are written through those
// pointers, outside autograd (as torch.optim's are, under no_grad).
//
// Only ATen's tensor header is included (not torch/torch.h): the less of
// libtorch a translation unit sees, the fewer compilers it has to satisfy.

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/tensor/low_precision.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco {

namespace detail {

// A tensor's device for messages ("cpu", "cuda:0").
inline std::string torch_device_name(const at::Tensor& t) { return t.device().str(); }

// Where a checked tensor must be: on the CPU (a bare torch::Tensor), on a
// CUDA device (torch_device_tensor), or either (torch_parameters, whose
// lists are passed on bare or wrapped).
enum class torch_place { cpu, cuda, any };

// Raises config_error unless `t` is a defined, fp32, strided, contiguous
// tensor where `place` says. `type` names the checker, `what` the tensor.
inline void check_torch_tensor(const at::Tensor& t, torch_place place, const char* type, const std::string& what) {
  if (!t.defined())
    raise<config_error>(type, ": ", what, " is an undefined tensor (a gradient before backward() ran?)");
  if (t.scalar_type() != at::kFloat)
    raise<config_error>(type, ": ", what, " has dtype ", c10::toString(t.scalar_type()),
                        ", expected Float (fp32): diloco keeps fp32 parameters and gradients");
  if (t.layout() != at::kStrided)
    raise<config_error>(type, ": ", what, " has a non-strided layout (sparse or mkldnn), expected a dense tensor");
  if (place == torch_place::cuda && !t.is_cuda())
    raise<config_error>(type, ": ", what, " is on ", torch_device_name(t),
                        ", expected a CUDA tensor (pass CPU tensors to diloco unwrapped)");
  if (place == torch_place::cpu && !t.device().is_cpu())
    raise<config_error>(type, ": ", what, " is on ", torch_device_name(t),
                        ", expected a CPU tensor (CUDA tensors go through diloco::torch_device_tensor or "
                        "torch_device_views, for the CUDA engine)");
  if (!t.is_contiguous())
    raise<config_error>(type, ": ", what, " is not contiguous (a transposed or strided view?), expected a "
                        "contiguous tensor: call .contiguous() on a copy, or keep the parameter itself");
}

// PyTorch's matrix view of an N-d tensor (PowerSGD's: shape[0] rows, the
// rest flattened into columns); 0-d and 1-d tensors are vectors.
inline std::size_t torch_rows(const at::Tensor& t) {
  return t.dim() >= 2 && t.size(0) > 0 ? static_cast<std::size_t>(t.size(0)) : static_cast<std::size_t>(t.numel());
}
inline std::size_t torch_cols(const at::Tensor& t) {
  return static_cast<std::size_t>(t.numel()) / std::max<std::size_t>(torch_rows(t), 1);
}

}  // namespace detail

/// A CPU tensor. data() checks the tensor each time the library takes its
/// pointer (at construction for parameters, every step for gradients).
template <>
struct tensor_traits<at::Tensor> {
  static constexpr const char* name = "diloco::tensor_traits<torch::Tensor>";  ///< names the checker in messages
  ///@{
  /// The customization point's members (see tensor_traits); data() and size() check the tensor,
  /// rows() and cols() give PyTorch's matrix view of it (shape[0] rows, the rest flattened into
  /// columns).
  using value_type = float;
  using memory_space = host_space;
  /// A handle to shared, reference-counted storage: a temporary copy of a
  /// parameter tensor refers to the parameter's elements.
  static constexpr bool owns_storage = false;
  static float* data(const at::Tensor& t) {
    detail::check_torch_tensor(t, detail::torch_place::cpu, name, "the tensor");
    return t.data_ptr<float>();
  }
  static std::size_t size(const at::Tensor& t) {
    detail::check_torch_tensor(t, detail::torch_place::cpu, name, "the tensor");
    return static_cast<std::size_t>(t.numel());
  }
  static std::size_t rows(const at::Tensor& t) { return detail::torch_rows(t); }
  static std::size_t cols(const at::Tensor& t) { return detail::torch_cols(t); }
  ///@}
};

/// A CUDA tensor as device memory. Training over device tensors runs the
/// CUDA engine, which is instantiated only in nvcc-compiled code that
/// includes diloco/cuda.hpp (diloco::cuda). Two ways there:
///   - torch_device_tensor in the nvcc translation unit itself: needs a
///     libtorch whose headers nvcc accepts at C++20 (libtorch 2.x; Debian's
///     1.13 headers do not compile under nvcc 13 at C++20);
///   - torch_device_views() in host code (g++), handing plain
///     device_view<float>s to an nvcc translation unit that never includes
///     libtorch: works with any CUDA build of libtorch.
/// Either way the tensors must be on a CUDA device at run time; Debian's
/// libtorch is CPU only, so here both are exercised only by their refusals.
struct torch_device_tensor {
  at::Tensor tensor;  ///< the CUDA tensor
};

/// A wrapped CUDA tensor is a device tensor.
template <>
struct tensor_traits<torch_device_tensor> {
  static constexpr const char* name = "diloco::torch_device_tensor";  ///< names the checker in messages
  ///@{
  /// The customization point's members (see tensor_traits); data() and size() check the tensor,
  /// rows() and cols() give PyTorch's matrix view of it (shape[0] rows, the rest flattened into
  /// columns).
  using value_type = float;
  using memory_space = device_space;
  static constexpr bool owns_storage = false;  ///< a handle to shared storage, as torch::Tensor
  static float* data(const torch_device_tensor& t) {
    detail::check_torch_tensor(t.tensor, detail::torch_place::cuda, name, "the tensor");
    return t.tensor.data_ptr<float>();
  }
  static std::size_t size(const torch_device_tensor& t) {
    detail::check_torch_tensor(t.tensor, detail::torch_place::cuda, name, "the tensor");
    return static_cast<std::size_t>(t.tensor.numel());
  }
  static std::size_t rows(const torch_device_tensor& t) { return detail::torch_rows(t.tensor); }
  static std::size_t cols(const torch_device_tensor& t) { return detail::torch_cols(t.tensor); }
  ///@}
};

/// Wraps each tensor of a list (parameters or gradients) as device memory.
inline std::vector<torch_device_tensor> torch_device_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<torch_device_tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back({t});
  return out;
}

/// The tensors as plain device views (pointer and size), each checked to be
/// a CUDA fp32 contiguous tensor: for an nvcc translation unit that does not
/// include libtorch. The views alias the tensors' storage.
inline std::vector<device_view<float>> torch_device_views(const std::vector<at::Tensor>& tensors) {
  std::vector<device_view<float>> out;
  out.reserve(tensors.size());
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    detail::check_torch_tensor(tensors[k], detail::torch_place::cuda, "diloco::torch_device_views",
                               "tensor " + std::to_string(k));
    out.emplace_back(tensors[k].data_ptr<float>(), static_cast<std::size_t>(tensors[k].numel()));
  }
  return out;
}

/// bf16 (`T` = diloco::bfloat16, dtype torch.bfloat16) or fp16 (`T` =
/// diloco::float16, torch.float16) CPU tensors as views of that element
/// type: a low-precision replica under inner::external (docs/algorithms.md
/// section 6a). Each is checked (dtype, dense, contiguous, CPU), named in
/// the message; the views alias the tensors' storage.
template <class T>
  requires(is_low_precision_v<T>)
std::vector<tensor_view<T>> torch_low_precision_views(const std::vector<at::Tensor>& tensors) {
  constexpr bool bf16 = std::is_same_v<T, bfloat16>;
  const at::ScalarType want = bf16 ? at::kBFloat16 : at::kHalf;
  std::vector<tensor_view<T>> out;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const at::Tensor& t = tensors[k];
    const std::string what = detail::concat("tensor ", k);
    if (!t.defined()) detail::raise<config_error>("torch_low_precision_views: ", what, " is an undefined tensor");
    if (t.scalar_type() != want)
      detail::raise<config_error>("torch_low_precision_views: ", what, " has dtype ", c10::toString(t.scalar_type()),
                                  ", expected ", bf16 ? "BFloat16" : "Half", " (pass fp32 tensors directly)");
    if (t.layout() != at::kStrided || !t.is_contiguous() || !t.device().is_cpu())
      detail::raise<config_error>("torch_low_precision_views: ", what, " must be a dense, contiguous CPU tensor (it is ",
                                  t.is_contiguous() ? "" : "not contiguous, ", "on ", detail::torch_device_name(t), ")");
    out.emplace_back(reinterpret_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel()));
  }
  return out;
}

/// A module's trainable parameters (those with requires_grad, in
/// named_parameters() order) and their gradients. Every parameter is checked
/// at construction (fp32, dense, contiguous), named in the message; where it
/// lives is checked where the list is used: bare, a CPU list; through
/// torch_device_tensors(), a CUDA list. gradients() collects the .grad()
/// of each after a backward pass: every trainable parameter must have one
/// (diloco steps all of them; torch.optim would skip a parameter without
/// one), else config_error names the parameter.
class torch_parameters {
 public:
  /// `module`: a torch::nn::Module or a module holder (torch::nn::Linear,
  /// a TORCH_MODULE type).
  template <class Module>
    requires requires(const Module& m) { m.named_parameters(); } ||
             requires(const Module& m) { m->named_parameters(); }
  explicit torch_parameters(const Module& module) {
    if constexpr (requires { module.named_parameters(); })
      take(module.named_parameters());
    else
      take(module->named_parameters());
  }

  /// A list of tensors (names default to "parameter <k>").
  explicit torch_parameters(std::vector<at::Tensor> tensors) {
    for (auto& t : tensors) add("parameter " + std::to_string(names_.size()), std::move(t));
  }

  /// For diloco::algorithm / diloco::optimizer: the parameters themselves.
  std::vector<at::Tensor>& tensors() { return tensors_; }
  ///@{
  /// The parameters, read-only; their names (named_parameters' keys); their number.
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  const std::vector<std::string>& names() const { return names_; }
  std::size_t size() const { return tensors_.size(); }
  ///@}
  /// The number of parameters (elements).
  std::size_t elements() const {
    std::size_t n = 0;
    for (const auto& t : tensors_) n += static_cast<std::size_t>(t.numel());
    return n;
  }

  /// The gradients now (call after backward(), before the step). The list
  /// is rebuilt each call, reusing its storage: a gradient zeroed with
  /// set_to_none or re-created by autograd is picked up.
  const std::vector<at::Tensor>& gradients() {
    grads_.clear();
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      const at::Tensor& g = tensors_[k].grad();
      if (!g.defined())
        detail::raise<config_error>("diloco::torch_parameters: parameter '", names_[k],
                                    "' has no gradient: call backward() before step() (every trainable parameter "
                                    "needs one; set requires_grad(false) on parameters you do not train)");
      detail::check_torch_tensor(g, detail::torch_place::any, type, "the gradient of '" + names_[k] + "'");
      if (g.numel() != tensors_[k].numel())
        detail::raise<config_error>("diloco::torch_parameters: the gradient of '", names_[k], "' has ", g.numel(),
                                    " elements, the parameter ", tensors_[k].numel());
      grads_.push_back(g);
    }
    return grads_;
  }

 private:
  template <class Dict>
  void take(const Dict& named) {
    for (const auto& item : named)
      if (item.value().requires_grad()) add(item.key(), item.value());
  }
  void add(std::string name, at::Tensor t) {
    detail::check_torch_tensor(t, detail::torch_place::any, type, "parameter '" + name + "'");
    names_.push_back(std::move(name));
    tensors_.push_back(std::move(t));
  }

  static constexpr const char* type = "diloco::torch_parameters";
  std::vector<at::Tensor> tensors_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> grads_;
};

}  // namespace diloco
