#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "diloco/core/memory_space.hpp"

namespace diloco {

// Customization point: specialize tensor_traits for your tensor type to use
// it with the library. A specialization provides
//   using value_type   = float;          // element type
//   using memory_space = host_space;     // or device_space
//   static value_type* data(T&);         // first element, contiguous
//   static std::size_t size(const T&);   // element count
// and may provide `static const value_type* data(const T&)` for read-only
// use. The library keeps the pointer between calls: the storage must stay
// where it is for as long as an algorithm refers to it.
template <class T>
struct tensor_traits;

// A non-owning, contiguous view: pointer + element count, tagged with the
// memory space the pointer refers to. This is what the library stores for
// every user tensor, and an adapter for raw pointers.
template <class T, class Space = host_space>
struct tensor_view {
  static_assert(is_memory_space_v<Space>, "diloco::tensor_view: Space must be host_space or device_space");
  using value_type = T;
  using memory_space = Space;

  T* ptr = nullptr;
  std::size_t count = 0;

  constexpr tensor_view() = default;
  constexpr tensor_view(T* p, std::size_t n) : ptr(p), count(n) {}
  // A view of non-const elements converts to a view of const elements.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr tensor_view(tensor_view<U, Space> v) : ptr(v.ptr), count(v.count) {}

  constexpr T* data() const { return ptr; }
  constexpr std::size_t size() const { return count; }
  constexpr bool empty() const { return count == 0; }
  constexpr T& operator[](std::size_t i) const { return ptr[i]; }
  constexpr tensor_view subview(std::size_t offset, std::size_t n) const { return {ptr + offset, n}; }
};

template <class T>
using host_view = tensor_view<T, host_space>;
template <class T>
using device_view = tensor_view<T, device_space>;

template <class T, class Space>
struct tensor_traits<tensor_view<T, Space>> {
  using value_type = std::remove_const_t<T>;
  using memory_space = Space;
  static T* data(const tensor_view<T, Space>& t) { return t.ptr; }
  static std::size_t size(const tensor_view<T, Space>& t) { return t.count; }
};

template <class T, class Alloc>
struct tensor_traits<std::vector<T, Alloc>> {
  using value_type = T;
  using memory_space = host_space;
  static T* data(std::vector<T, Alloc>& t) { return t.data(); }
  static const T* data(const std::vector<T, Alloc>& t) { return t.data(); }
  static std::size_t size(const std::vector<T, Alloc>& t) { return t.size(); }
};

template <class T, std::size_t Extent>
struct tensor_traits<std::span<T, Extent>> {
  using value_type = std::remove_const_t<T>;
  using memory_space = host_space;
  static T* data(const std::span<T, Extent>& t) { return t.data(); }
  static std::size_t size(const std::span<T, Extent>& t) { return t.size(); }
};

// A pointer to a tensor (e.g. std::vector<float>*) is a tensor too, so a
// model can hand out a list of pointers to its weight vectors.
template <class T>
  requires requires { typename tensor_traits<std::remove_cv_t<T>>::value_type; }
struct tensor_traits<T*> {
  using value_type = typename tensor_traits<std::remove_cv_t<T>>::value_type;
  using memory_space = typename tensor_traits<std::remove_cv_t<T>>::memory_space;
  static auto data(T* t) { return tensor_traits<std::remove_cv_t<T>>::data(*t); }
  static std::size_t size(T* t) { return tensor_traits<std::remove_cv_t<T>>::size(*t); }
};

template <class T>
using tensor_traits_of = tensor_traits<std::remove_cvref_t<T>>;

template <class T>
using tensor_value_t = typename tensor_traits_of<T>::value_type;

template <class T>
using tensor_space_t = typename tensor_traits_of<T>::memory_space;

// Uniform access through the traits.
template <class T>
auto tensor_data(T&& t) {
  return tensor_traits_of<T>::data(t);
}
template <class T>
std::size_t tensor_size(const T& t) {
  return tensor_traits_of<T>::size(t);
}

}  // namespace diloco
