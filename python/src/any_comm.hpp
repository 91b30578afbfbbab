// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::python::any_comm: one communicator type for every compiled trainer
// of the extension, so that the grid of (outer, compressor, schedule) is
// compiled once instead of once per communicator. It forwards each
// operation through a virtual call to the communicator it holds
// (comm::threads, comm::gloo, comm::local). Every one of them returns
// comm::async_request from its non-blocking operations and runs submitted tasks
// on its progress thread, so any_comm is a task_communicator: the
// overlapping schedules keep their chained exchanges. It does not model
// elastic_communicator (the Python API has fixed groups).

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "diloco/comm/detail/async.hpp"
#include "diloco/comm/local.hpp"
#include "diloco/comm/threads.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/error.hpp"

namespace diloco::python {

/// The operations the library calls, as virtual functions.
class comm_base {
 public:
  virtual ~comm_base() = default;
  virtual const char* kind() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int workers_on_host() const = 0;
  virtual traffic_counters traffic() const = 0;
  virtual void all_reduce(std::span<float> buf, reduce_op op) = 0;
  virtual void broadcast(std::span<float> buf, int root) = 0;
  virtual void broadcast(std::span<std::byte> buf, int root) = 0;
  virtual void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  virtual void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  virtual comm::async_request iall_reduce(std::span<float> buf, reduce_op op) = 0;
  virtual comm::async_request iall_to_all(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  virtual comm::async_request iall_gather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  virtual comm::async_request submit(std::function<void()> task) = 0;
};

/// A communicator C that returns comm::async_request and has submit() (comm::threads,
/// comm::gloo), owned (`owned`) or borrowed. A borrowed one (a comm::threads
/// worker's, which lives while the worker's function runs) is released by
/// release(); operations afterwards raise state_error.
template <class C>
class comm_model final : public comm_base {
 public:
  comm_model(C* c, std::unique_ptr<C> owned, const char* kind) : c_(c), owned_(std::move(owned)), kind_(kind) {}
  const char* kind() const override { return kind_; }
  int rank() const override { return get().rank(); }
  int size() const override { return get().size(); }
  int workers_on_host() const override { return get().workers_on_host(); }
  traffic_counters traffic() const override { return get().traffic(); }
  void all_reduce(std::span<float> b, reduce_op op) override { get().all_reduce(b, op); }
  void broadcast(std::span<float> b, int root) override { get().broadcast(b, root); }
  void broadcast(std::span<std::byte> b, int root) override { get().broadcast(b, root); }
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) override { get().all_to_all(s, r); }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) override { get().all_gather(s, r); }
  comm::async_request iall_reduce(std::span<float> b, reduce_op op) override { return get().iall_reduce(b, op); }
  comm::async_request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) override {
    return get().iall_to_all(s, r);
  }
  comm::async_request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) override {
    return get().iall_gather(s, r);
  }
  comm::async_request submit(std::function<void()> task) override { return get().submit(std::move(task)); }

  /// The borrowed communicator is gone (its worker returned).
  void release() { c_ = nullptr; }
  /// Closes an owned communicator now (its destructor's work), instead of when the last
  /// reference goes.
  void close() {
    c_ = nullptr;
    owned_.reset();
  }

 private:
  C& get() const {
    if (c_ == nullptr)
      diloco::detail::raise<state_error>("the ", kind_,
                                         " communicator is closed (a diloco.threads worker's communicator lives "
                                         "while its function runs; a closed gloo communicator cannot be used)");
    return *c_;
  }
  C* c_;
  std::unique_ptr<C> owned_;
  const char* kind_;
};

/// comm::local (a world of one) with comm::async_request: its operations complete when issued, so
/// they return a complete (default) request, and a submitted task runs at once.
class local_model final : public comm_base {
 public:
  const char* kind() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int workers_on_host() const override { return 1; }
  traffic_counters traffic() const override { return c_.traffic(); }
  void all_reduce(std::span<float> b, reduce_op op) override { c_.all_reduce(b, op); }
  void broadcast(std::span<float> b, int root) override { c_.broadcast(b, root); }
  void broadcast(std::span<std::byte> b, int root) override { c_.broadcast(b, root); }
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) override { c_.all_to_all(s, r); }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) override { c_.all_gather(s, r); }
  comm::async_request iall_reduce(std::span<float> b, reduce_op op) override { return all_reduce(b, op), comm::async_request{}; }
  comm::async_request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) override {
    return all_to_all(s, r), comm::async_request{};
  }
  comm::async_request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) override {
    return all_gather(s, r), comm::async_request{};
  }
  comm::async_request submit(std::function<void()> task) override { return task(), comm::async_request{}; }

 private:
  comm::local c_;
};

/// The communicator every compiled trainer is instantiated over: a shared
/// handle to a comm_base.
class any_comm {
 public:
  using request = comm::async_request;  ///< what the non-blocking operations return

  explicit any_comm(std::shared_ptr<comm_base> impl) : impl_(std::move(impl)) {}

  const char* kind() const { return impl_->kind(); }
  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }
  int workers_on_host() const { return impl_->workers_on_host(); }
  traffic_counters traffic() const { return impl_->traffic(); }
  void all_reduce(std::span<float> b, reduce_op op) { impl_->all_reduce(b, op); }
  void broadcast(std::span<float> b, int root) { impl_->broadcast(b, root); }
  void broadcast(std::span<std::byte> b, int root) { impl_->broadcast(b, root); }
  void all_to_all(std::span<const std::byte> s, std::span<std::byte> r) { impl_->all_to_all(s, r); }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) { impl_->all_gather(s, r); }
  request iall_reduce(std::span<float> b, reduce_op op) { return impl_->iall_reduce(b, op); }
  request iall_to_all(std::span<const std::byte> s, std::span<std::byte> r) { return impl_->iall_to_all(s, r); }
  request iall_gather(std::span<const std::byte> s, std::span<std::byte> r) { return impl_->iall_gather(s, r); }
  request submit(std::function<void()> task) { return impl_->submit(std::move(task)); }

  const std::shared_ptr<comm_base>& impl() const { return impl_; }

 private:
  std::shared_ptr<comm_base> impl_;
};

static_assert(task_communicator<any_comm>, "any_comm must keep the overlapping schedules' chained exchanges");

}  // namespace diloco::python
