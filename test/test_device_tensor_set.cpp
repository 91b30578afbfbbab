// SPDX-License-Identifier: Apache-2.0
// test/device_tensor_set.hpp over Thrust's CPP backend (built with g++ and
// THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP, so a "device" vector is
// host memory): the records the GPU tests hand to the team programs must
// point into their tensors' storage, however many tensors. Growing a
// std::vector of thrust::device_vector copies them (their move constructor
// is not noexcept), so a pointer saved before the growth ends dangles; under
// ASan reading through one is a heap-use-after-free.
#include <doctest/doctest.h>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "device_tensor_set.hpp"

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP, "this test runs Thrust's device vectors on the host");

TEST_CASE("a device_vector's move may throw, so a growing std::vector of them copies") {
  // Why the set's construction order matters: std::vector moves its
  // elements on reallocation only when that cannot throw.
  CHECK_FALSE(std::is_nothrow_move_constructible_v<thrust::device_vector<float>>);
}

TEST_CASE("every record of a device tensor set points at its own tensor's values") {
  for (std::size_t count : {1, 2, 3, 7, 64, 300}) {
    CAPTURE(count);
    std::vector<std::vector<float>> values(count);
    std::vector<std::size_t> offsets, index0;
    std::size_t packed = 0;
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t n = 1 + (t * 7) % 23;  // several sizes, none empty
      for (std::size_t i = 0; i < n; ++i) values[t].push_back(static_cast<float>(1000 * t + i));
      offsets.push_back(16 * t);
      index0.push_back(packed);
      packed += n;
    }
    const test_support::device_tensor_set set(values, offsets, index0);
    REQUIRE(set.storage.size() == count);
    REQUIRE(set.tensors.size() == count);
    std::size_t stale = 0, wrong_values = 0;
    for (std::size_t t = 0; t < count; ++t) {
      const auto& r = set.tensors[t];
      CHECK(r.offset == offsets[t]);
      CHECK(r.index0 == index0[t]);
      if (r.local != thrust::raw_pointer_cast(set.storage[t].data())) ++stale;
      // Read through the saved pointer, as a kernel would: tensor t's values
      // are 1000 t + i by construction (ASan flags a freed block here).
      for (std::size_t i = 0; i < values[t].size(); ++i)
        if (r.local[i] != static_cast<float>(1000 * t + i)) ++wrong_values;
    }
    CHECK(stale == 0);
    CHECK(wrong_values == 0);
  }
}
