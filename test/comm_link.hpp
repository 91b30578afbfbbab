// SPDX-License-Identifier: Apache-2.0
// A communicator that forwards every operation to another one (comm::threads,
// comm::gloo), taking host spans (Device = false: a communicator) or device
// views only (Device = true: a device_communicator, as NCCL is) for the
// programs that replay device code on the host, where device memory is host
// memory. Tests derive from it to count, record or damage what passes.
#pragma once

#include <diloco/diloco.hpp>
#include <span>
#include <type_traits>

template <bool Device, class Comm>
class comm_link {
 public:
  template <class T>
  using view = std::conditional_t<Device, diloco::device_view<T>, std::span<T>>;
  using request = typename Comm::request;

  explicit comm_link(Comm& c) : c_(&c) {}
  int rank() const { return c_->rank(); }
  int size() const { return c_->size(); }
  diloco::traffic_counters traffic() const { return c_->traffic(); }
  void all_reduce(view<float> b, diloco::reduce_op op) { c_->all_reduce(span(b), op); }
  void broadcast(view<float> b, int root) { c_->broadcast(span(b), root); }
  void broadcast(view<std::byte> b, int root) { c_->broadcast(span(b), root); }
  void all_to_all(view<const std::byte> s, view<std::byte> r) { c_->all_to_all(span(s), span(r)); }
  void all_gather(view<const std::byte> s, view<std::byte> r) { c_->all_gather(span(s), span(r)); }
  void barrier() { c_->barrier(); }
  request iall_reduce(view<float> b, diloco::reduce_op op) { return c_->iall_reduce(span(b), op); }
  request ibroadcast(view<float> b, int root) { return c_->ibroadcast(span(b), root); }
  request ibroadcast(view<std::byte> b, int root) { return c_->ibroadcast(span(b), root); }
  request iall_to_all(view<const std::byte> s, view<std::byte> r) { return c_->iall_to_all(span(s), span(r)); }
  request iall_gather(view<const std::byte> s, view<std::byte> r) { return c_->iall_gather(span(s), span(r)); }
  request ibarrier() { return c_->ibarrier(); }

 protected:
  template <class View>
  static auto span(View v) {
    return std::span(v.data(), v.size());
  }
  Comm& inner() { return *c_; }

 private:
  Comm* c_;
};
