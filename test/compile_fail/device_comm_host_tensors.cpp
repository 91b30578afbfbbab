// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a communicator of device memory only, given host
// tensors.
#include <diloco/diloco.hpp>

#include <vector>

struct device_only {
  struct request {
    void wait() {}
    bool test() { return true; }
  };
  using fv = diloco::device_view<float>;
  using bv = diloco::device_view<std::byte>;
  using cbv = diloco::device_view<const std::byte>;
  int rank() const { return 0; }
  int size() const { return 1; }
  diloco::traffic_counters traffic() const { return {}; }
  void all_reduce(fv, diloco::reduce_op) {}
  void broadcast(fv, int) {}
  void broadcast(bv, int) {}
  void all_to_all(cbv, bv) {}
  void all_gather(cbv, bv) {}
  void barrier() {}
  request iall_reduce(fv, diloco::reduce_op) { return {}; }
  request ibroadcast(fv, int) { return {}; }
  request ibroadcast(bv, int) { return {}; }
  request iall_to_all(cbv, bv) { return {}; }
  request iall_gather(cbv, bv) { return {}; }
  request ibarrier() { return {}; }
};
static_assert(diloco::device_communicator<device_only>);

void f(std::vector<float>& w, device_only& comm) {
  diloco::algorithm<diloco::inner::adamw, diloco::outer::nesterov, diloco::compress::none, device_only> t(w, comm);
}
