// A communicator of device memory only (a device_communicator, as NCCL is),
// over comm::threads: for the programs that replay device code on the host,
// where device memory is host memory. Every operation forwards to the
// threads communicator. Tests derive from it to count or record calls,
// redefining every overload of the names they change.
#pragma once

#include <diloco/diloco.hpp>
#include <span>

class threads_device_link {
 public:
  using request = diloco::comm::threads::request;
  explicit threads_device_link(diloco::comm::threads& c) : c_(c) {}
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  diloco::traffic_counters traffic() const { return c_.traffic(); }
  void all_reduce(diloco::device_view<float> b, diloco::reduce_op op) { c_.all_reduce(span(b), op); }
  void broadcast(diloco::device_view<float> b, int root) { c_.broadcast(span(b), root); }
  void broadcast(diloco::device_view<std::byte> b, int root) { c_.broadcast(span(b), root); }
  void all_to_all(diloco::device_view<const std::byte> s, diloco::device_view<std::byte> r) {
    c_.all_to_all(span(s), span(r));
  }
  void all_gather(diloco::device_view<const std::byte> s, diloco::device_view<std::byte> r) {
    c_.all_gather(span(s), span(r));
  }
  void barrier() { c_.barrier(); }
  request iall_reduce(diloco::device_view<float> b, diloco::reduce_op op) { return c_.iall_reduce(span(b), op); }
  request ibroadcast(diloco::device_view<float> b, int root) { return c_.ibroadcast(span(b), root); }
  request ibroadcast(diloco::device_view<std::byte> b, int root) { return c_.ibroadcast(span(b), root); }
  request iall_to_all(diloco::device_view<const std::byte> s, diloco::device_view<std::byte> r) {
    return c_.iall_to_all(span(s), span(r));
  }
  request iall_gather(diloco::device_view<const std::byte> s, diloco::device_view<std::byte> r) {
    return c_.iall_gather(span(s), span(r));
  }
  request ibarrier() { return c_.ibarrier(); }

 protected:
  template <class T>
  static std::span<T> span(diloco::device_view<T> v) {
    return {v.data(), v.size()};
  }
  diloco::comm::threads& threads() { return c_; }

 private:
  diloco::comm::threads& c_;
};

static_assert(diloco::device_communicator<threads_device_link> && !diloco::communicator<threads_device_link>);
