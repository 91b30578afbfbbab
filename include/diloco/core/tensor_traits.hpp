// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

#include "diloco/core/memory_space.hpp"

namespace diloco {

/// Customization point: specialize tensor_traits for your tensor type to use
/// it with the library. A specialization provides
/// ```
/// using value_type   = float;          // element type
/// using memory_space = host_space;     // or device_space
/// static value_type* data(T&);         // first element, contiguous
/// static std::size_t size(const T&);   // element count
/// ```
/// and may provide `static const value_type* data(const T&)` for read-only
/// use, and a 2-D shape,
/// ```
/// static std::size_t rows(const T&);   // rows * cols == size, row-major
/// static std::size_t cols(const T&);
/// ```
/// which shape-aware compressors (low-rank) use; without them a tensor is a
/// vector. The library keeps the pointer between calls: the storage must stay
/// where it is for as long as an algorithm refers to it. So a parameter
/// argument must not be a temporary that frees its elements when it dies:
/// a specialization may say whether T owns its elements,
/// ```
/// static constexpr bool owns_storage = true;  // a container (std::vector)
/// ```
/// (see tensor_owns_storage_v for the default), and an owning tensor passed
/// as an rvalue parameter does not compile.
template <class T>
struct tensor_traits;

/// A non-owning, contiguous view: pointer + element count, tagged with the
/// memory space the pointer refers to. This is what the library stores for
/// every user tensor, and an adapter for raw pointers.
template <class T, class Space = host_space>
struct tensor_view {
  static_assert(is_memory_space_v<Space>, "diloco::tensor_view: Space must be host_space or device_space");
  using value_type = T;        ///< the element type (tensor_traits' name)
  using memory_space = Space;  ///< where the elements live (tensor_traits' name)

  T* ptr = nullptr;       ///< the first element
  std::size_t count = 0;  ///< the number of elements

  constexpr tensor_view() = default;
  /// `n` elements from `p`.
  constexpr tensor_view(T* p, std::size_t n) : ptr(p), count(n) {}
  /// A view of non-const elements converts to a view of const elements.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr tensor_view(tensor_view<U, Space> v) : ptr(v.ptr), count(v.count) {}

  /// The first element.
  constexpr T* data() const { return ptr; }
  /// The number of elements.
  constexpr std::size_t size() const { return count; }
  /// True when the view has no elements.
  constexpr bool empty() const { return count == 0; }
  /// Element i (unchecked).
  constexpr T& operator[](std::size_t i) const { return ptr[i]; }
  /// `n` elements from element `offset` (unchecked).
  constexpr tensor_view subview(std::size_t offset, std::size_t n) const { return {ptr + offset, n}; }
  // The elements as a range (host memory only: a device pointer must not be
  // dereferenced on the host, so a device view is no range). A host view is
  // a borrowed, contiguous, sized range: std::ranges algorithms and
  // range-for take it, and std::span<T> converts from it.
  /// The first element, as a range's begin (host views only).
  constexpr T* begin() const
    requires std::same_as<Space, host_space>
  {
    return ptr;
  }
  /// One past the last element, as a range's end (host views only).
  constexpr T* end() const
    requires std::same_as<Space, host_space>
  {
    return ptr + count;
  }
};

/// A view of host memory.
template <class T>
using host_view = tensor_view<T, host_space>;
/// A view of device memory.
template <class T>
using device_view = tensor_view<T, device_space>;

/// A view is a tensor of its space.
template <class T, class Space>
struct tensor_traits<tensor_view<T, Space>> {
  ///@{
  /// The customization point's members (see tensor_traits).
  using value_type = std::remove_const_t<T>;
  using memory_space = Space;
  static constexpr bool owns_storage = false;
  static T* data(const tensor_view<T, Space>& t) { return t.ptr; }
  static std::size_t size(const tensor_view<T, Space>& t) { return t.count; }
  ///@}
};

/// std::vector<T> as a host tensor.
template <class T, class Alloc>
struct tensor_traits<std::vector<T, Alloc>> {
  ///@{
  /// The customization point's members (see tensor_traits).
  using value_type = T;
  using memory_space = host_space;
  static constexpr bool owns_storage = true;
  static T* data(std::vector<T, Alloc>& t) { return t.data(); }
  static const T* data(const std::vector<T, Alloc>& t) { return t.data(); }
  static std::size_t size(const std::vector<T, Alloc>& t) { return t.size(); }
  ///@}
};

/// std::array<T, N> as a host tensor.
template <class T, std::size_t N>
struct tensor_traits<std::array<T, N>> {
  ///@{
  /// The customization point's members (see tensor_traits).
  using value_type = T;
  using memory_space = host_space;
  static constexpr bool owns_storage = true;
  static T* data(std::array<T, N>& t) { return t.data(); }
  static const T* data(const std::array<T, N>& t) { return t.data(); }
  static std::size_t size(const std::array<T, N>&) { return N; }
  ///@}
};

/// std::span<T> as a host tensor.
template <class T, std::size_t Extent>
struct tensor_traits<std::span<T, Extent>> {
  ///@{
  /// The customization point's members (see tensor_traits).
  using value_type = std::remove_const_t<T>;
  using memory_space = host_space;
  static constexpr bool owns_storage = false;
  static T* data(const std::span<T, Extent>& t) { return t.data(); }
  static std::size_t size(const std::span<T, Extent>& t) { return t.size(); }
  ///@}
};

/// A row-major matrix view: a tensor_view that also says its shape, for
/// raw pointers to 2-D weights (diloco::matrix_view<float>(p, rows, cols)).
template <class T, class Space = host_space>
struct matrix_view : tensor_view<T, Space> {
  ///@{
  /// The shape: row_count x col_count elements, row-major.
  std::size_t row_count = 0, col_count = 0;
  ///@}
  constexpr matrix_view() = default;
  /// `r` x `c` elements from `p`, row-major.
  constexpr matrix_view(T* p, std::size_t r, std::size_t c) : tensor_view<T, Space>(p, r * c), row_count(r), col_count(c) {}
};

/// A matrix view is a tensor with a shape (rows and cols).
template <class T, class Space>
struct tensor_traits<matrix_view<T, Space>> {
  ///@{
  /// The customization point's members (see tensor_traits), the shape included.
  using value_type = std::remove_const_t<T>;
  using memory_space = Space;
  static constexpr bool owns_storage = false;
  static T* data(const matrix_view<T, Space>& t) { return t.ptr; }
  static std::size_t size(const matrix_view<T, Space>& t) { return t.count; }
  static std::size_t rows(const matrix_view<T, Space>& t) { return t.row_count; }
  static std::size_t cols(const matrix_view<T, Space>& t) { return t.col_count; }
  ///@}
};

/// A pointer to a tensor (e.g. std::vector<float>*) is a tensor too, so a
/// model can hand out a list of pointers to its weight vectors.
template <class T>
  requires requires { typename tensor_traits<std::remove_cv_t<T>>::value_type; }
struct tensor_traits<T*> {
  using inner = tensor_traits<std::remove_cv_t<T>>;  ///< the traits of the tensor pointed to
  ///@{
  /// The pointed-to tensor's members (see tensor_traits), its shape if it has one.
  using value_type = typename inner::value_type;
  using memory_space = typename inner::memory_space;
  static auto data(T* t) { return inner::data(*t); }
  static std::size_t size(T* t) { return inner::size(*t); }
  static std::size_t rows(T* t)
    requires requires(const std::remove_cv_t<T>& x) { inner::rows(x); }
  {
    return inner::rows(*t);
  }
  static std::size_t cols(T* t)
    requires requires(const std::remove_cv_t<T>& x) { inner::cols(x); }
  {
    return inner::cols(*t);
  }
  ///@}
};

/// tensor_traits of T without references and cv-qualifiers.
template <class T>
using tensor_traits_of = tensor_traits<std::remove_cvref_t<T>>;

/// A tensor's element type.
template <class T>
using tensor_value_t = typename tensor_traits_of<T>::value_type;

/// A tensor's memory space (host_space or device_space).
template <class T>
using tensor_space_t = typename tensor_traits_of<T>::memory_space;

/// Whether a tensor owns its elements, so that they end with the object (a
/// container such as std::vector), rather than refer to storage kept by
/// someone else (a view, a span, a pointer, a torch::Tensor handle): its
/// tensor_traits' `owns_storage` where it says, otherwise whether T is a range
/// that is not borrowed (a container: its iterators die with it). The
/// parameters of an algorithm or optimizer must not be an owning temporary.
template <class T>
inline constexpr bool tensor_owns_storage_v = [] {
  using U = std::remove_cvref_t<T>;
  if constexpr (requires { { tensor_traits<U>::owns_storage } -> std::convertible_to<bool>; })
    return static_cast<bool>(tensor_traits<U>::owns_storage);
  else
    return std::ranges::range<U> && !std::ranges::borrowed_range<U>;
}();

/// Uniform access through the traits.
template <class T>
auto tensor_data(T&& t) {
  return tensor_traits_of<T>::data(t);
}
/// The number of elements of a tensor.
template <class T>
std::size_t tensor_size(const T& t) {
  return tensor_traits_of<T>::size(t);
}

/// A tensor's 2-D shape: rows x cols, row-major. A vector is size x 1.
struct tensor_shape {
  ///@{
  /// rows x cols elements.
  std::size_t rows = 0, cols = 1;
  ///@}
  /// Both dimensions above 1 (what the low-rank compressor factors).
  bool is_matrix() const { return rows > 1 && cols > 1; }
  /// Same rows and cols.
  friend bool operator==(const tensor_shape&, const tensor_shape&) = default;
};

/// The shape tensor_traits gives (rows/cols), or a vector's.
template <class T>
tensor_shape tensor_shape_of(const T& t) {
  using traits = tensor_traits_of<T>;
  if constexpr (requires { traits::rows(t); traits::cols(t); })
    return {traits::rows(t), traits::cols(t)};
  else
    return {tensor_size(t), 1};
}

}  // namespace diloco

// Views do not own their elements: a view's iterators stay valid after the
// view object is gone (so std::span<T> converts from an rvalue view too).
/// @cond
namespace std::ranges {
template <class T, class Space>
inline constexpr bool enable_borrowed_range<diloco::tensor_view<T, Space>> = true;
template <class T, class Space>
inline constexpr bool enable_borrowed_range<diloco::matrix_view<T, Space>> = true;
}  // namespace std::ranges
/// @endcond
