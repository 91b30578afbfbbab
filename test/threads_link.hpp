// Communicators over comm::threads that forward every operation, for tests
// that count, record or damage what passes through: derive, and redefine
// every overload of the names you change. threads_host_link takes host
// spans (a communicator); threads_device_link takes device views only (a
// device_communicator, as NCCL is) for the programs that replay device code
// on the host, where device memory is host memory.
#pragma once

#include <diloco/diloco.hpp>
#include <span>
#include <type_traits>

template <bool Device>
class threads_link {
 public:
  template <class T>
  using view = std::conditional_t<Device, diloco::device_view<T>, std::span<T>>;
  using request = diloco::comm::threads::request;

  explicit threads_link(diloco::comm::threads& c) : c_(c) {}
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  diloco::traffic_counters traffic() const { return c_.traffic(); }
  void all_reduce(view<float> b, diloco::reduce_op op) { c_.all_reduce(span(b), op); }
  void broadcast(view<float> b, int root) { c_.broadcast(span(b), root); }
  void broadcast(view<std::byte> b, int root) { c_.broadcast(span(b), root); }
  void all_to_all(view<const std::byte> s, view<std::byte> r) { c_.all_to_all(span(s), span(r)); }
  void all_gather(view<const std::byte> s, view<std::byte> r) { c_.all_gather(span(s), span(r)); }
  void barrier() { c_.barrier(); }
  request iall_reduce(view<float> b, diloco::reduce_op op) { return c_.iall_reduce(span(b), op); }
  request ibroadcast(view<float> b, int root) { return c_.ibroadcast(span(b), root); }
  request ibroadcast(view<std::byte> b, int root) { return c_.ibroadcast(span(b), root); }
  request iall_to_all(view<const std::byte> s, view<std::byte> r) { return c_.iall_to_all(span(s), span(r)); }
  request iall_gather(view<const std::byte> s, view<std::byte> r) { return c_.iall_gather(span(s), span(r)); }
  request ibarrier() { return c_.ibarrier(); }

 protected:
  template <class View>
  static auto span(View v) {
    return std::span(v.data(), v.size());
  }
  diloco::comm::threads& threads() { return c_; }

 private:
  diloco::comm::threads& c_;
};

using threads_host_link = threads_link<false>;
using threads_device_link = threads_link<true>;

static_assert(diloco::communicator<threads_host_link>);
static_assert(diloco::device_communicator<threads_device_link> && !diloco::communicator<threads_device_link>);
