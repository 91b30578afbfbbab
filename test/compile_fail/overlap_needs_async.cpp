// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: `blocking_only` has every blocking collective the
// library calls but no non-blocking ones, so it runs sync::blocking (checked
// below) and not an overlapping schedule, which keeps reductions in flight.
#include <diloco/diloco.hpp>
#include <span>

struct blocking_only {
  int rank() const { return 0; }
  int size() const { return 1; }
  diloco::traffic_counters traffic() const { return {}; }
  void all_reduce(std::span<float>, diloco::reduce_op) {}
  void broadcast(std::span<float>, int) {}
  void all_to_all(std::span<const std::byte>, std::span<std::byte>) {}
  void all_gather(std::span<const std::byte>, std::span<std::byte>) {}
};
static_assert(diloco::communicator<blocking_only> && !diloco::async_communicator<blocking_only>);

using fine = diloco::algorithm<diloco::inner::sgd, diloco::outer::sgd, diloco::compress::none, blocking_only>;
template class diloco::algorithm<diloco::inner::sgd, diloco::outer::sgd, diloco::compress::none, blocking_only>;

using broken = diloco::algorithm<diloco::inner::sgd, diloco::outer::sgd, diloco::compress::none, blocking_only,
                                 diloco::sync::one_step_delay>;
broken* instance = nullptr;
std::size_t size = sizeof(broken);
