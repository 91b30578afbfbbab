// SPDX-License-Identifier: Apache-2.0
// Parameters passed as a temporary that owns its elements: the algorithm and
// the optimizer keep pointers into the parameters, which such a temporary
// frees when the constructor returns (issue 38, item 1: AddressSanitizer saw
// the inner step write freed memory). -DCASE_<name> picks one; each must fail
// to compile with the static_assert naming the rule (compile_fail_owning_<name>
// in test/CMakeLists.txt). The temporaries that share storage (spans, views,
// a list of views) compile: test_tensor.cpp's control.
#include <diloco/diloco.hpp>

#include <array>
#include <deque>
#include <ranges>
#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local>;

void train(dc::comm::local& comm) {
  std::vector<std::vector<float>> model(2, std::vector<float>(4));
#if defined(CASE_vector)
  trainer t(std::vector<float>(4), comm);  // the example
#elif defined(CASE_array)
  trainer t(std::array<float, 4>{}, comm);
#elif defined(CASE_vector_of_vectors)
  trainer t(std::vector<std::vector<float>>{std::vector<float>(4), std::vector<float>(2)}, comm);
#elif defined(CASE_deque_of_vectors)
  // std::move(model) is refused too: an xvalue is a temporary to the algorithm.
  trainer t(std::deque<std::vector<float>>(2, std::vector<float>(4)), comm);
#elif defined(CASE_owning_view)
  trainer t(std::views::all(std::vector<std::vector<float>>(2, std::vector<float>(4))), comm);
#elif defined(CASE_range_of_copies)
  // An lvalue range whose elements are copies (made, read and freed one by one).
  auto copies = model | std::views::transform([](const std::vector<float>& v) { return v; });
  trainer t(copies, comm);
#elif defined(CASE_optimizer)
  dc::optimizer<dc::inner::sgd> opt(std::vector<float>(4));
#else
#error "define one CASE_<name>"
#endif
}
