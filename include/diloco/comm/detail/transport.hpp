// SPDX-License-Identifier: Apache-2.0
#pragma once

// How the engine hands its flat fp32 buffers (the wire, the initial
// parameters) and the compressed mean its byte buffers (all-to-all and
// all-gather of segments) to a communicator, chosen at compile time from the
// buffers' memory space and what the communicator accepts:
//   host buffers                         -> communicator, as std::span
//   device buffers, device_communicator  -> communicator, as device_view
//   device buffers, host communicator    -> staged through pinned host
//                                           memory: to_host, collective on
//                                           the host copy, from_host
// The last route lets comm::threads, MPI or Gloo carry device tensors.
//
// The byte and fp32 collectives also run non-blocking (iall_reduce,
// iall_to_all, iall_gather) when the communicator has non-blocking
// operations for that route (`async`): the returned request completes the
// collective and, when staging, copies what arrived back into device memory.
// Staging buffers are shared: at most one non-blocking collective is in
// flight per transport (the engine keeps at most one reduction in flight,
// and a reduction runs its collectives one after another).

#include <cstddef>
#include <optional>
#include <span>
#include <utility>
#include <type_traits>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco::detail {

// A communicator's request type, or a complete-at-once stand-in for a
// communicator with blocking operations only.
struct no_request {
  void wait() {}
  bool test() { return true; }
};
template <class Comm>
struct request_of {
  using type = no_request;
};
template <class Comm>
  requires requires { typename Comm::request; }
struct request_of<Comm> {
  using type = typename Comm::request;
};

// A collective started through a transport. wait() completes it (rethrowing
// the communicator's error), test() polls; once the collective has
// completed, a staged one copies its host result into device memory with
// the executor. A default request is complete. Dropping one unwaited waits
// for the collective (the communicator's request does) and copies nothing.
template <class Request, class Exec>
class transport_request {
 public:
  transport_request() = default;
  explicit transport_request(Request r) : req_(std::move(r)) {}
  // Staged: `bytes` bytes at `host` go to `device` once the collective
  // completed.
  transport_request(Request r, Exec& exec, std::byte* device, const std::byte* host, std::size_t bytes)
      : req_(std::move(r)), exec_(&exec), device_(device), host_(host), bytes_(bytes) {}

  bool test() {
    if (!req_) return true;
    if (!req_->test()) return false;
    wait();
    return true;
  }
  void wait() {
    if (!req_) return;
    auto r = std::move(*req_);
    req_.reset();
    const std::size_t bytes = std::exchange(bytes_, 0);
    r.wait();
    if (bytes) exec_->from_host(device_, host_, bytes);
  }

 private:
  std::optional<Request> req_;
  Exec* exec_ = nullptr;
  std::byte* device_ = nullptr;
  const std::byte* host_ = nullptr;
  std::size_t bytes_ = 0;
};

template <class Comm, class Space, class Exec>
class wire_transport;

template <class Comm, class Exec>
class wire_transport<Comm, host_space, Exec> {
  static_assert(communicator<Comm>,
                "diloco::algorithm: this communicator only takes device memory (it models device_communicator, not "
                "communicator) but the parameters are host tensors; use device tensors or a host communicator");

 public:
  static constexpr bool staged = false;
  static constexpr bool async = async_host_communicator<Comm>;
  using request = transport_request<typename request_of<Comm>::type, Exec>;

  explicit wire_transport(std::size_t /*capacity*/) {}

  request iall_reduce(Comm& comm, Exec& /*exec*/, float* data, std::size_t n, reduce_op op)
    requires async
  {
    return request(comm.iall_reduce(std::span<float>(data, n), op));
  }
  request iall_to_all(Comm& comm, Exec& /*exec*/, const std::byte* send, std::byte* recv, std::size_t bytes)
    requires async
  {
    return request(comm.iall_to_all(std::span<const std::byte>(send, bytes), std::span<std::byte>(recv, bytes)));
  }
  request iall_gather(Comm& comm, Exec& /*exec*/, const std::byte* send, std::size_t bytes, std::byte* recv)
    requires async
  {
    return request(comm.iall_gather(std::span<const std::byte>(send, bytes),
                                    std::span<std::byte>(recv, bytes * static_cast<std::size_t>(comm.size()))));
  }

  void all_reduce(Comm& comm, Exec& /*exec*/, float* data, std::size_t n, reduce_op op) {
    comm.all_reduce(std::span<float>(data, n), op);
  }
  void broadcast(Comm& comm, Exec& /*exec*/, float* data, std::size_t n, int root) {
    comm.broadcast(std::span<float>(data, n), root);
  }

  void reserve_bytes(std::size_t /*capacity*/) {}
  // `bytes`: the whole send (= receive) buffer of M equal blocks.
  void all_to_all(Comm& comm, Exec& /*exec*/, const std::byte* send, std::byte* recv, std::size_t bytes) {
    comm.all_to_all(std::span<const std::byte>(send, bytes), std::span<std::byte>(recv, bytes));
  }
  // `bytes`: this rank's block; recv holds M of them.
  void all_gather(Comm& comm, Exec& /*exec*/, const std::byte* send, std::size_t bytes, std::byte* recv) {
    comm.all_gather(std::span<const std::byte>(send, bytes),
                    std::span<std::byte>(recv, bytes * static_cast<std::size_t>(comm.size())));
  }
};

template <class Comm, class Exec>
class wire_transport<Comm, device_space, Exec> {
 public:
  // A communicator that takes device memory gets it directly, even if it
  // takes host memory too.
  static constexpr bool staged = !device_communicator<Comm>;
  // Non-blocking: a staged route needs the communicator's host operations
  // non-blocking, a direct one its device operations.
  static constexpr bool async = staged ? async_host_communicator<Comm> : async_device_communicator<Comm>;
  using request = transport_request<typename request_of<Comm>::type, Exec>;

  // `capacity`: the largest buffer that will travel (pinned host memory of
  // that size is allocated once when staging).
  explicit wire_transport(std::size_t capacity) {
    if constexpr (staged) staging_ = staging_type(capacity);
  }

  void all_reduce(Comm& comm, Exec& exec, float* data, std::size_t n, reduce_op op) {
    if constexpr (staged) {
      float* host = staging(n, "all_reduce");
      exec.to_host(host, data, n);
      comm.all_reduce(std::span<float>(host, n), op);
      exec.from_host(data, host, n);
    } else {
      // The passes that wrote `data` run on the executor's stream; the
      // communicator may use another one. Its blocking collectives must
      // return with the result in `data` (the next passes read it on the
      // executor's stream).
      exec.synchronize();
      comm.all_reduce(tensor_view<float, device_space>(data, n), op);
    }
  }

  void broadcast(Comm& comm, Exec& exec, float* data, std::size_t n, int root) {
    if constexpr (staged) {
      float* host = staging(n, "broadcast");
      if (comm.rank() == root) exec.to_host(host, data, n);
      comm.broadcast(std::span<float>(host, n), root);
      if (comm.rank() != root) exec.from_host(data, host, n);
    } else {
      exec.synchronize();
      comm.broadcast(tensor_view<float, device_space>(data, n), root);
    }
  }

  // Byte collectives receive at most `capacity` bytes; staging allocates
  // pinned host memory for both directions once.
  void reserve_bytes(std::size_t capacity) {
    if constexpr (staged) {
      send_bytes_ = byte_staging_type(capacity);
      recv_bytes_ = byte_staging_type(capacity);
    }
  }

  void all_to_all(Comm& comm, Exec& exec, const std::byte* send, std::byte* recv, std::size_t bytes) {
    if constexpr (staged) {
      auto [hs, hr] = byte_staging(bytes, bytes, "all_to_all");
      exec.to_host(hs, send, bytes);
      comm.all_to_all(std::span<const std::byte>(hs, bytes), std::span<std::byte>(hr, bytes));
      exec.from_host(recv, hr, bytes);
    } else {
      exec.synchronize();
      comm.all_to_all(tensor_view<const std::byte, device_space>(send, bytes),
                      tensor_view<std::byte, device_space>(recv, bytes));
    }
  }

  void all_gather(Comm& comm, Exec& exec, const std::byte* send, std::size_t bytes, std::byte* recv) {
    const std::size_t total = bytes * static_cast<std::size_t>(comm.size());
    if constexpr (staged) {
      auto [hs, hr] = byte_staging(bytes, total, "all_gather");
      exec.to_host(hs, send, bytes);
      comm.all_gather(std::span<const std::byte>(hs, bytes), std::span<std::byte>(hr, total));
      exec.from_host(recv, hr, total);
    } else {
      exec.synchronize();
      comm.all_gather(tensor_view<const std::byte, device_space>(send, bytes),
                      tensor_view<std::byte, device_space>(recv, total));
    }
  }

  // Non-blocking forms. Staged: the send side is copied to host memory now
  // (waiting for the passes that wrote it), the host collective runs in
  // the background, and the request copies the result back once it
  // completed. Direct: the executor's stream is drained (the communicator
  // may run on another stream) and the device collective is issued.
  request iall_reduce(Comm& comm, Exec& exec, float* data, std::size_t n, reduce_op op)
    requires async
  {
    if constexpr (staged) {
      float* host = staging(n, "all_reduce");
      exec.to_host(host, data, n);
      return request(comm.iall_reduce(std::span<float>(host, n), op), exec, reinterpret_cast<std::byte*>(data),
                     reinterpret_cast<const std::byte*>(host), n * sizeof(float));
    } else {
      exec.synchronize();
      return request(comm.iall_reduce(tensor_view<float, device_space>(data, n), op));
    }
  }

  request iall_to_all(Comm& comm, Exec& exec, const std::byte* send, std::byte* recv, std::size_t bytes)
    requires async
  {
    if constexpr (staged) {
      auto [hs, hr] = byte_staging(bytes, bytes, "all_to_all");
      exec.to_host(hs, send, bytes);
      return request(comm.iall_to_all(std::span<const std::byte>(hs, bytes), std::span<std::byte>(hr, bytes)), exec,
                     recv, hr, bytes);
    } else {
      exec.synchronize();
      return request(comm.iall_to_all(tensor_view<const std::byte, device_space>(send, bytes),
                                      tensor_view<std::byte, device_space>(recv, bytes)));
    }
  }

  request iall_gather(Comm& comm, Exec& exec, const std::byte* send, std::size_t bytes, std::byte* recv)
    requires async
  {
    const std::size_t total = bytes * static_cast<std::size_t>(comm.size());
    if constexpr (staged) {
      auto [hs, hr] = byte_staging(bytes, total, "all_gather");
      exec.to_host(hs, send, bytes);
      return request(comm.iall_gather(std::span<const std::byte>(hs, bytes), std::span<std::byte>(hr, total)), exec,
                     recv, hr, total);
    } else {
      exec.synchronize();
      return request(comm.iall_gather(tensor_view<const std::byte, device_space>(send, bytes),
                                      tensor_view<std::byte, device_space>(recv, total)));
    }
  }

 private:
  struct no_staging {};
  template <bool Staged, class = void>
  struct staging_of {
    using type = no_staging;
  };
  template <class Unused>
  struct staging_of<true, Unused> {
    using type = typename Exec::template staging_buffer<float>;
  };
  using staging_type = typename staging_of<staged>::type;
  template <bool Staged, class = void>
  struct byte_staging_of {
    using type = no_staging;
  };
  template <class Unused>
  struct byte_staging_of<true, Unused> {
    using type = typename Exec::template staging_buffer<std::byte>;
  };
  using byte_staging_type = typename byte_staging_of<staged>::type;

  float* staging(std::size_t n, const char* op) {
    if (n > staging_.size())
      raise<state_error>("device ", op, " of ", n, " floats exceeds the ", staging_.size(),
                         "-float host staging buffer sized at construction");
    return staging_.data();
  }

  std::pair<std::byte*, std::byte*> byte_staging(std::size_t send, std::size_t recv, const char* op) {
    if (send > send_bytes_.size() || recv > recv_bytes_.size())
      raise<state_error>("device ", op, " of ", send, " bytes sent and ", recv, " received exceeds the ",
                         recv_bytes_.size(), "-byte host staging buffers sized at construction");
    return {send_bytes_.data(), recv_bytes_.data()};
  }

  staging_type staging_{};
  byte_staging_type send_bytes_{}, recv_bytes_{};
};

}  // namespace diloco::detail
