// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <array>
#include <diloco/diloco.hpp>
#include <span>
#include <vector>

namespace {

// A user's own tensor type, plugged in through the customization point.
struct my_tensor {
  std::array<float, 6> storage{};
  std::size_t used = 6;
};

}  // namespace

template <>
struct diloco::tensor_traits<my_tensor> {
  using value_type = float;
  using memory_space = diloco::host_space;
  static float* data(my_tensor& t) { return t.storage.data(); }
  static const float* data(const my_tensor& t) { return t.storage.data(); }
  static std::size_t size(const my_tensor& t) { return t.used; }
};

using namespace diloco;

static_assert(tensor<std::vector<float>>);
static_assert(tensor<std::span<float>>);
static_assert(tensor<std::span<const float>>);
static_assert(tensor<host_view<float>>);
static_assert(tensor<std::vector<float>*>);
static_assert(tensor<my_tensor>);
static_assert(float_tensor<std::vector<float>>);
static_assert(!float_tensor<std::vector<double>>);
static_assert(!tensor<int>);
static_assert(!tensor<float*>);  // a bare pointer has no size
static_assert(mutable_float_tensor<std::span<float>>);
static_assert(!mutable_float_tensor<std::span<const float>>);
static_assert(tensor_range<std::vector<std::vector<float>>>);
static_assert(tensor_range<std::vector<std::span<float>>>);
static_assert(!tensor_range<std::vector<float>>);
static_assert(std::is_same_v<tensor_space_t<std::vector<float>>, host_space>);
static_assert(std::is_same_v<tensor_space_t<tensor_view<float, device_space>>, device_space>);

TEST_CASE("tensor_traits give data and size of every adapter") {
  std::vector<float> v{1, 2, 3};
  CHECK(tensor_data(v) == v.data());
  CHECK(tensor_size(v) == 3);

  std::span<float> s(v.data() + 1, 2);
  CHECK(tensor_data(s) == v.data() + 1);
  CHECK(tensor_size(s) == 2);

  host_view<float> hv(v.data(), 3);
  CHECK(tensor_data(hv) == v.data());
  CHECK(tensor_size(hv) == 3);

  std::vector<float>* pv = &v;
  CHECK(tensor_data(pv) == v.data());
  CHECK(tensor_size(pv) == 3);

  my_tensor mine;
  mine.used = 4;
  CHECK(tensor_data(mine) == mine.storage.data());
  CHECK(tensor_size(mine) == 4);
}

TEST_CASE("parameter_set lays tensors of different sizes end to end") {
  std::vector<std::vector<float>> tensors{std::vector<float>(3), std::vector<float>(0), std::vector<float>(5)};
  parameter_set<float, host_space> set(tensors);
  REQUIRE(set.count() == 3);
  CHECK(set.total() == 8);
  CHECK(set.offset(0) == 0);
  CHECK(set.offset(1) == 3);
  CHECK(set.offset(2) == 3);
  CHECK(set[2].data() == tensors[2].data());
  CHECK(set[2].size() == 5);

  // A list of const gradients of the same shape passes, another does not.
  std::vector<std::vector<float>> grads{std::vector<float>(3), std::vector<float>(0), std::vector<float>(5)};
  parameter_set<const float, host_space> g(grads);
  CHECK_NOTHROW(set.require_same_shape(g, "gradients"));
  grads[2].resize(4);
  g.assign(grads);
  CHECK_THROWS_WITH_AS(set.require_same_shape(g, "gradients"),
                       doctest::Contains("tensor 2 has 4 elements, parameter tensor 2 has 5"), config_error);
  grads.pop_back();
  g.assign(grads);
  CHECK_THROWS_WITH_AS(set.require_same_shape(g, "gradients"), doctest::Contains("got 2 tensors, expected 3"),
                       config_error);
}

TEST_CASE("host buffers are zeroed and 64-byte aligned") {
  host_buffer<float> b(1000);
  REQUIRE(b.size() == 1000);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
  for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == 0.0f);
  host_buffer<float> empty(0);
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);
}

namespace {
// A user's 2-D tensor whose traits give its shape.
struct user_matrix {
  std::vector<float> v;
  std::size_t r, c;
};
}  // namespace
template <>
struct diloco::tensor_traits<user_matrix> {
  using value_type = float;
  using memory_space = diloco::host_space;
  static float* data(user_matrix& m) { return m.v.data(); }
  static std::size_t size(const user_matrix& m) { return m.v.size(); }
  static std::size_t rows(const user_matrix& m) { return m.r; }
  static std::size_t cols(const user_matrix& m) { return m.c; }
};

TEST_CASE("tensor shapes: traits may give rows and columns, parameter sets carry them, vectors are n x 1") {
  user_matrix a{std::vector<float>(12), 3, 4};
  std::vector<float> b(5);
  std::vector<float> c(6);
  CHECK(diloco::tensor_shape_of(a) == diloco::tensor_shape{3, 4});
  CHECK(diloco::tensor_shape_of(b) == diloco::tensor_shape{5, 1});
  CHECK(diloco::tensor_shape_of(&a) == diloco::tensor_shape{3, 4});  // through a pointer
  CHECK(diloco::tensor_shape_of(diloco::matrix_view<float>(c.data(), 2, 3)) == diloco::tensor_shape{2, 3});
  CHECK(diloco::tensor_shape_of(a).is_matrix());
  CHECK(!diloco::tensor_shape_of(b).is_matrix());

  std::vector<user_matrix*> list{&a};
  const diloco::parameter_set<float, diloco::host_space> ps(list);
  CHECK(ps.shape(0) == diloco::tensor_shape{3, 4});
  const std::vector<diloco::matrix_view<float>> views{{c.data(), 3, 2}, {b.data(), 5, 1}};
  const diloco::parameter_set<float, diloco::host_space> pv(views);
  CHECK(pv.shape(0) == diloco::tensor_shape{3, 2});
  CHECK(pv.shape(1) == diloco::tensor_shape{5, 1});

  user_matrix bad{std::vector<float>(12), 5, 2};
  std::vector<user_matrix*> wrong{&bad};
  CHECK_THROWS_WITH_AS((diloco::parameter_set<float, diloco::host_space>(wrong)),
                       doctest::Contains("tensor 0 says it is 5 x 2 but has 12 elements"), diloco::config_error);
}
