#pragma once

// How the engine hands its flat fp32 buffers (the wire, the initial
// parameters) to a communicator, chosen at compile time from the buffers'
// memory space and what the communicator accepts:
//   host buffers                         -> communicator, as std::span
//   device buffers, device_communicator  -> communicator, as device_view
//   device buffers, host communicator    -> staged through pinned host
//                                           memory: to_host, collective on
//                                           the host copy, from_host
// The last route lets comm::threads, MPI or Gloo carry device tensors.

#include <cstddef>
#include <span>
#include <type_traits>

#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/tensor/tensor_traits.hpp"

namespace diloco::detail {

template <class Comm, class Space, class Exec>
class wire_transport;

template <class Comm, class Exec>
class wire_transport<Comm, host_space, Exec> {
  static_assert(communicator<Comm>,
                "diloco::algorithm: this communicator only takes device memory (it models device_communicator, not "
                "communicator) but the parameters are host tensors; use device tensors or a host communicator");

 public:
  static constexpr bool staged = false;

  explicit wire_transport(std::size_t /*capacity*/) {}

  void all_reduce(Comm& comm, Exec& /*exec*/, float* data, std::size_t n, reduce_op op) {
    comm.all_reduce(std::span<float>(data, n), op);
  }
  void broadcast(Comm& comm, Exec& /*exec*/, float* data, std::size_t n, int root) {
    comm.broadcast(std::span<float>(data, n), root);
  }
};

template <class Comm, class Exec>
class wire_transport<Comm, device_space, Exec> {
 public:
  // A communicator that takes device memory gets it directly, even if it
  // takes host memory too.
  static constexpr bool staged = !device_communicator<Comm>;

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

  float* staging(std::size_t n, const char* op) {
    if (n > staging_.size())
      raise<state_error>("device ", op, " of ", n, " floats exceeds the ", staging_.size(),
                         "-float host staging buffer sized at construction");
    return staging_.data();
  }

  staging_type staging_{};
};

}  // namespace diloco::detail
