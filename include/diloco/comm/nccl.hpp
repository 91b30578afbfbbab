// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/core/require_cxx20.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "diloco/comm/detail/agreement.hpp"
#include "diloco/comm/detail/nccl_status.hpp"
#include "diloco/comm/detail/nccl_unique_id.hpp"
#include "diloco/comm/detail/request.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/timeout.hpp"
#include "diloco/core/tensor_traits.hpp"

namespace diloco::comm {

/// The options of comm::nccl, set with designated initializers.
struct nccl_options {
  /// CUDA device of this rank; -1: the device current on the constructing
  /// thread. One device per rank: NCCL does not support two ranks of one
  /// communicator on the same device.
  int device = -1;
  /// Stream every operation is enqueued on. nullptr: the communicator creates
  /// a non-blocking stream of its own (for the legacy default stream, pass
  /// cudaStreamLegacy); a stream passed in must belong to `device` and
  /// outlive the communicator. Work that produces the buffers on another
  /// stream must be ordered before the call (an event, or a synchronize).
  cudaStream_t stream = nullptr;
  /// Longest the creation or one operation may take, counted from its issue;
  /// past it the communicator is aborted and comm_error thrown.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// Bootstrap through a store (from_store): how long ranks wait for rank 0
  /// to publish the unique id, and the key it is published under (one key per
  /// communicator: a store shared by several needs one key each).
  std::chrono::milliseconds store_timeout = std::chrono::minutes(1);
  std::string store_key = "diloco/nccl/unique_id";  ///< the store key rank 0 publishes the unique id under
  /// Before each operation the ranks all-gather (operation, size, root or
  /// reduction) and compare: a mismatch is a comm_error on every rank instead
  /// of a hang or garbage. It costs one small collective and a host round
  /// trip per operation, and issuing then waits for the operations before it.
  /// Must be the same on every rank.
  bool check_agreement = true;
};

class nccl;

namespace detail_nccl {

using clock = std::chrono::steady_clock;

// Spins briefly (short collectives finish in microseconds), then sleeps so a
// long wait does not burn a core.
class backoff {
 public:
  void pause() {
    if (++rounds_ < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(rounds_ < 2048 ? 20 : 500));
  }

 private:
  int rounds_ = 0;
};

// What the communicator and its pending requests share: the NCCL handle,
// stream, scratch and spare events. Freed when the last of them goes, so a
// request outliving its communicator stays valid.
struct shared_state {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int device = 0;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{};
  bool check_agreement = true;
  std::string aborted_because;  // empty while usable

  // Agreement check: this rank's call record then everyone's (pinned host
  // and device), and one float the barrier all-reduces.
  comm::detail::call_record* host_scratch = nullptr;
  void* device_scratch = nullptr;

  std::mutex events_mutex;
  std::vector<cudaEvent_t> spare_events;

  shared_state() = default;
  shared_state(const shared_state&) = delete;
  shared_state& operator=(const shared_state&) = delete;

  ~shared_state() {
    device_guard guard(device, device_guard::no_throw_t{});
    if (comm != nullptr) {
      const bool clean = drain_for_destruction() && finalize_for_destruction();
      if (clean)
        (void)ncclCommDestroy(comm);
      else
        (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    for (cudaEvent_t e : spare_events) (void)cudaEventDestroy(e);
    if (host_scratch != nullptr) (void)cudaFreeHost(host_scratch);
    if (device_scratch != nullptr) (void)cudaFree(device_scratch);
    if (owns_stream && stream != nullptr) (void)cudaStreamDestroy(stream);
    (void)cudaGetLastError();
  }

  bool aborted() const { return !aborted_because.empty(); }

  std::string where(const char* op) const { return diloco::detail::concat("nccl ", op, " on rank ", rank); }

  void require_usable(const char* op) const {
    if (aborted())
      diloco::detail::raise<comm_error>(where(op), ": the communicator was aborted earlier (", aborted_because,
                                        "); create a new one");
  }

  // Frees the NCCL communicator without waiting for peers; kernels still
  // running on it are stopped.
  void abort(const std::string& reason) noexcept {
    try {
      if (aborted_because.empty()) aborted_because = reason;
    } catch (...) {
    }
    if (comm != nullptr) {
      device_guard guard(device, device_guard::no_throw_t{});
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  [[noreturn]] void fail(const std::string& message) {
    abort(message);
    throw comm_error(diloco::detail::concat("diloco: ", message, "; the communicator was aborted"));
  }

  [[noreturn]] void fail_cuda(cudaError_t e, const char* call, const char* op) {
    (void)cudaGetLastError();
    const std::string message = diloco::detail::concat(where(op), ": ", call, " failed: ", cuda_error_text(e));
    abort(message);
    throw error(diloco::detail::concat("diloco: ", message, "; the communicator was aborted"));
  }

  void check_cuda_call(cudaError_t e, const char* call, const char* op) {
    if (e != cudaSuccess) fail_cuda(e, call, op);
  }

  // Completes an NCCL call. A non-blocking communicator may answer
  // ncclInProgress: the call is then still being enqueued, and nothing may
  // touch the communicator or rely on the stream before its state leaves
  // ncclInProgress. Any error aborts the communicator.
  void settle(ncclResult_t r, const char* call, const char* op, clock::time_point issued) {
    backoff wait;
    while (r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) {
        fail(diloco::detail::concat(where(op), ": ncclCommGetAsyncError after ", call,
                                    " failed: ", nccl_error_text(q, comm)));
      }
      r = state;
      if (r != ncclInProgress) break;
      if (diloco::detail::exceeded(clock::now() - issued, timeout))
        fail(diloco::detail::concat(where(op), ": ", call, " did not complete within ", timeout.count(),
                                    " ms (a peer is missing or stuck)"));
      wait.pause();
    }
    if (r != ncclSuccess) fail(diloco::detail::concat(where(op), ": ", call, " failed: ", nccl_error_text(r, comm)));
  }

  // An error NCCL met while the operations run (a peer or link failed).
  void check_async(const char* op) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess)
      fail(diloco::detail::concat(where(op), ": ncclCommGetAsyncError failed: ", nccl_error_text(q, comm)));
    if (state != ncclSuccess && state != ncclInProgress)
      fail(diloco::detail::concat(where(op), ": asynchronous NCCL error: ", nccl_error_text(state, comm)));
  }

  cudaEvent_t acquire_event(const char* op) {
    {
      std::lock_guard lock(events_mutex);
      if (!spare_events.empty()) {
        cudaEvent_t e = spare_events.back();
        spare_events.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check_cuda_call(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", op);
    return e;
  }

  void release_event(cudaEvent_t e) noexcept {
    if (e == nullptr) return;
    try {
      std::lock_guard lock(events_mutex);
      spare_events.push_back(e);
    } catch (...) {
      (void)cudaEventDestroy(e);
    }
  }

  // An event recorded on the stream after everything enqueued so far.
  cudaEvent_t record(const char* op) {
    cudaEvent_t e = acquire_event(op);
    const cudaError_t r = cudaEventRecord(e, stream);
    if (r != cudaSuccess) {
      release_event(e);
      fail_cuda(r, "cudaEventRecord", op);
    }
    return e;
  }

  // One look at an operation: true once its event has completed. Throws if
  // the communicator failed meanwhile or the operation is past its timeout.
  bool poll(cudaEvent_t e, clock::time_point issued, const char* op) {
    require_usable(op);
    const cudaError_t q = cudaEventQuery(e);
    if (q != cudaSuccess && q != cudaErrorNotReady) fail_cuda(q, "cudaEventQuery", op);
    check_async(op);
    if (q == cudaSuccess) return true;
    if (diloco::detail::exceeded(clock::now() - issued, timeout))
      fail(diloco::detail::concat(where(op), ": not complete after ", timeout.count(),
                                  " ms (a peer is missing, stuck, or called a different operation)"));
    return false;
  }

  void wait(cudaEvent_t e, clock::time_point issued, const char* op) {
    backoff pause;
    while (!poll(e, issued, op)) pause.pause();
  }

 private:
  // Lets enqueued work finish before the communicator goes; false if it does
  // not within the timeout or fails.
  bool drain_for_destruction() noexcept {
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return false;
    bool done = false;
    if (cudaEventRecord(e, stream) == cudaSuccess) {
      const auto deadline = diloco::detail::deadline_after<clock>(timeout);
      backoff pause;
      for (;;) {
        const cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess) {
          done = true;
          break;
        }
        ncclResult_t state = ncclSuccess;
        if (q != cudaErrorNotReady || ncclCommGetAsyncError(comm, &state) != ncclSuccess ||
            (state != ncclSuccess && state != ncclInProgress) || clock::now() > deadline)
          break;
        pause.pause();
      }
    }
    (void)cudaEventDestroy(e);
    return done;
  }

  // ncclCommFinalize flushes the communicator's work with its peers; on a
  // non-blocking communicator it answers ncclInProgress until that is done.
  bool finalize_for_destruction() noexcept {
    ncclResult_t r = ncclCommFinalize(comm);
    const auto deadline = diloco::detail::deadline_after<clock>(timeout);
    backoff pause;
    while (r == ncclInProgress) {
      if (clock::now() > deadline) return false;
      pause.pause();
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
      r = state;
    }
    return r == ncclSuccess;
  }
};

// Selected by nccl::from_mpi; comm/nccl_mpi.hpp specializes it for MPI_Comm.
template <class T>
inline constexpr bool mpi_header_included = false;
template <class MpiComm>
struct mpi_bootstrap {
  static_assert(mpi_header_included<MpiComm>,
                "diloco::comm::nccl::from_mpi needs #include <diloco/comm/nccl_mpi.hpp> (and the diloco::mpi target)");
};

// Returns an event to the pool however the wait on it ends.
struct event_lease {
  shared_state& state;
  cudaEvent_t event;
  ~event_lease() { state.release_event(event); }
};

// An operation in flight, as its request holds it (comm/detail/request.hpp):
// a CUDA event recorded on the stream after it.
struct pending_op {
  using issuer = comm::nccl;

  std::shared_ptr<shared_state> state;
  cudaEvent_t event = nullptr;
  clock::time_point issued{};
  const char* op = "";

  pending_op() = default;
  pending_op(std::shared_ptr<shared_state> s, cudaEvent_t e, clock::time_point at, const char* name)
      : state(std::move(s)), event(e), issued(at), op(name) {}
  pending_op(pending_op&& other) noexcept
      : state(std::move(other.state)), event(std::exchange(other.event, nullptr)), issued(other.issued),
        op(other.op) {}
  pending_op& operator=(pending_op&& other) noexcept {
    state = std::move(other.state);
    event = std::exchange(other.event, nullptr);
    issued = other.issued;
    op = other.op;
    return *this;
  }

  bool active() const { return state != nullptr; }

  void wait() {
    const auto s = std::move(state);
    const event_lease lease{*s, std::exchange(event, nullptr)};
    device_guard guard(s->device, s->rank);
    s->wait(lease.event, issued, op);
  }

  bool test() {
    bool done = false;
    try {
      device_guard guard(state->device, state->rank);
      done = state->poll(event, issued, op);
    } catch (...) {
      const auto s = std::move(state);
      const event_lease lease{*s, std::exchange(event, nullptr)};
      throw;
    }
    if (done) {
      state->release_event(std::exchange(event, nullptr));
      state.reset();
    }
    return done;
  }
};

}  // namespace detail_nccl

/// NCCL communicator: one rank per CUDA device, every operation over device
/// memory, enqueued on the communicator's CUDA stream. Models
/// diloco::device_communicator. Use it through the diloco::nccl CMake target.
///
/// Never a hang: the NCCL communicator is created non-blocking, every wait
/// polls its CUDA event together with ncclCommGetAsyncError, and an operation
/// (or the creation) that does not finish within options.timeout aborts the
/// communicator (ncclCommAbort) and throws comm_error. Ranks that disagree on
/// an operation's size, root or reduction get a comm_error before any data
/// moves (options.check_agreement). Like every diloco communicator, one
/// thread at a time uses a communicator and its requests.
class nccl {
  using shared_state = detail_nccl::shared_state;
  using collective = detail::collective;
  using clock = detail_nccl::clock;

 public:
  using options = nccl_options;  ///< device, stream, timeouts, agreement check (nccl_options)

  /// The handle of an operation in flight (detail::basic_request): a CUDA
  /// event recorded on the stream after it. wait() polls the event and
  /// NCCL's asynchronous error state until the operation completes, fails,
  /// or times out (then it throws comm_error and aborts the communicator);
  /// test() looks once. Buffers must stay alive and untouched until then.
  using request = detail::basic_request<detail_nccl::pending_op>;

  /// Throws config_error for a rank outside [0, size), a size below 1, a
  /// device below -1 or a timeout that is not positive.
  static void validate(int rank, int size, const options& opts) {
    using diloco::detail::raise;
    if (size < 1) raise<config_error>("nccl: the world size must be at least 1, got ", size);
    if (rank < 0 || rank >= size) raise<config_error>("nccl: rank ", rank, " is outside [0, ", size, ")");
    if (opts.device < -1)
      raise<config_error>("nccl: options.device must be a CUDA device ordinal or -1 (the current device), got ",
                          opts.device);
    if (opts.timeout.count() <= 0)
      raise<config_error>("nccl: options.timeout must be positive, got ", opts.timeout.count(), " ms");
    if (opts.store_timeout.count() <= 0)
      raise<config_error>("nccl: options.store_timeout must be positive, got ", opts.store_timeout.count(), " ms");
    diloco::detail::check_timeout(opts.timeout, "nccl: options.timeout");
    diloco::detail::check_timeout(opts.store_timeout, "nccl: options.store_timeout");
    if (opts.store_key.empty()) raise<config_error>("nccl: options.store_key must not be empty");
  }

  /// A fresh id for a new communicator; rank 0 makes it and hands it to the
  /// others (from_store and from_mpi do this). Needs no GPU.
  static ncclUniqueId make_unique_id() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      diloco::detail::raise<comm_error>("nccl: ncclGetUniqueId failed: ", detail_nccl::nccl_error_text(r, nullptr));
    return id;
  }

  /// Rank `rank` of `size` joining the communicator named by `id`; every rank
  /// calls this with the same id and size (collective; returns once all have
  /// joined, or throws comm_error after options.timeout).
  nccl(const ncclUniqueId& id, int rank, int size, options opts = {}) : state_(std::make_shared<shared_state>()) {
    using diloco::detail::raise;
    validate(rank, size, opts);
    auto& s = *state_;
    s.rank = rank;
    s.size = size;
    s.timeout = opts.timeout;
    s.check_agreement = opts.check_agreement;

    int devices = 0;
    const cudaError_t found = cudaGetDeviceCount(&devices);
    if (found != cudaSuccess || devices == 0) {
      (void)cudaGetLastError();
      raise<error>("nccl rank ", rank, ": no usable CUDA device (cudaGetDeviceCount: ",
                   found == cudaSuccess ? std::string("0 devices") : detail_nccl::cuda_error_text(found), ")");
    }
    if (opts.device >= devices)
      raise<config_error>("nccl rank ", rank, ": options.device ", opts.device, " does not exist; there are ",
                          devices, " CUDA device(s)");
    if (opts.device >= 0)
      s.device = opts.device;
    else
      detail_nccl::check_cuda(cudaGetDevice(&s.device), "cudaGetDevice", rank);
    detail_nccl::device_guard guard(s.device, rank);

    if (opts.stream != nullptr) {
      s.stream = opts.stream;
    } else {
      detail_nccl::check_cuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                              rank);
      s.owns_stream = true;
    }
    const std::size_t records = static_cast<std::size_t>(size) + 1;
    void* host_scratch = nullptr;
    detail_nccl::check_cuda(cudaMallocHost(&host_scratch, records * sizeof(detail::call_record)), "cudaMallocHost",
                            rank);
    s.host_scratch = static_cast<detail::call_record*>(host_scratch);
    const std::size_t scratch_bytes = records * sizeof(detail::call_record) + sizeof(float);
    detail_nccl::check_cuda(cudaMalloc(&s.device_scratch, scratch_bytes), "cudaMalloc", rank);
    detail_nccl::check_cuda(cudaMemsetAsync(s.device_scratch, 0, scratch_bytes, s.stream), "cudaMemsetAsync", rank);

    // Non-blocking, so a peer that never joins is a timeout, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto issued = clock::now();
    const ncclResult_t r = ncclCommInitRankConfig(&s.comm, size, id, rank, &config);
    s.settle(r, "ncclCommInitRankConfig", "initialization", issued);
  }

  /// Bootstrap through a key-value store the ranks share (Gloo's
  /// rendezvous::Store, see comm/nccl_gloo.hpp, or anything with its
  /// set/wait/get): rank 0 publishes the unique id under options.store_key,
  /// the others wait up to options.store_timeout for it.
  template <unique_id_store Store>
  static nccl from_store(Store& store, int rank, int size, options opts = {}) {
    if (rank == 0) {
      try {
        validate(rank, size, opts);
      } catch (const std::exception& e) {
        // Tell the others now rather than leave them waiting for the id.
        try {
          store.set(opts.store_key, detail_nccl::encode_failure(e.what()));
        } catch (...) {
        }
        throw;
      }
    } else {
      validate(rank, size, opts);
    }
    const ncclUniqueId id =
        detail_nccl::exchange_unique_id(store, rank, opts.store_key, opts.store_timeout, [] { return make_unique_id(); });
    return nccl(id, rank, size, std::move(opts));
  }

  /// Bootstrap over MPI: rank 0 of `comm` makes the id and MPI_Bcasts it.
  /// Needs comm/nccl_mpi.hpp (which defines it for MPI_Comm).
  template <class MpiComm>
  static nccl from_mpi(MpiComm comm, options opts = {}) {
    return detail_nccl::mpi_bootstrap<MpiComm>::create(comm, std::move(opts));
  }

  ///@{
  /// Movable (the state lives behind a pointer, shared with pending requests); not copyable.
  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;
  ///@}
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  /// Waits (up to options.timeout) for enqueued work, then finalizes and
  /// destroys the NCCL communicator; aborts it instead if that fails or it
  /// failed before. Never throws. Pending requests keep the state alive.
  ~nccl() = default;

  ///@{
  /// This rank, the group's size, the CUDA device and stream it runs on, and the NCCL
  /// communicator itself.
  int rank() const { return state().rank; }
  int size() const { return state().size; }
  int device() const { return state().device; }
  cudaStream_t stream() const { return state().stream; }
  ncclComm_t native_handle() const { return state().comm; }
  ///@}
  /// True once a failure, a timeout or abort() has aborted the communicator.
  bool aborted() const { return state().aborted(); }
  /// Frees the NCCL communicator now (ncclCommAbort), without waiting for
  /// its peers or for the work enqueued on it; later operations, and
  /// requests still pending, throw comm_error naming `reason`. A group that
  /// re-forms without a dead peer (comm::regrouped) drops its communicator
  /// this way: finalizing would wait for the dead peer. Never throws.
  void abort(const std::string& reason) noexcept {
    if (state_) state_->abort(reason);
  }
  /// The bytes this rank has sent and received, as core/comm_types.hpp models them.
  traffic_counters traffic() const { return traffic_; }

  // ------------------------------------------------------------ blocking
  /// In-place all-reduce of fp32 device buffers: sum, or mean (ncclAvg).
  void all_reduce(device_view<float> buf, reduce_op op) { iall_reduce(buf, op).wait(); }
  ///@{
  /// Copies root's buffer into every rank's buffer.
  void broadcast(device_view<float> buf, int root) { ibroadcast(buf, root).wait(); }
  void broadcast(device_view<std::byte> buf, int root) { ibroadcast(buf, root).wait(); }
  ///@}
  /// send holds M equal blocks, block k for rank k; recv receives block
  /// `rank` of every rank's send, in rank order.
  void all_to_all(device_view<const std::byte> send, device_view<std::byte> recv) { iall_to_all(send, recv).wait(); }
  /// recv receives every rank's send, in rank order (M blocks).
  void all_gather(device_view<const std::byte> send, device_view<std::byte> recv) { iall_gather(send, recv).wait(); }
  /// Returns once every rank has reached it and this rank's earlier operations are done.
  void barrier() { ibarrier().wait(); }

  /// Host memory does not compile: NCCL reads and writes device memory only.
  /// Copy host data to the device, or use a host communicator.
  void all_reduce(std::span<float>, reduce_op) = delete;
  void broadcast(std::span<float>, int) = delete;
  void broadcast(std::span<std::byte>, int) = delete;
  void all_to_all(std::span<const std::byte>, std::span<std::byte>) = delete;
  void all_gather(std::span<const std::byte>, std::span<std::byte>) = delete;
  request iall_reduce(std::span<float>, reduce_op) = delete;
  request ibroadcast(std::span<float>, int) = delete;
  request ibroadcast(std::span<std::byte>, int) = delete;
  request iall_to_all(std::span<const std::byte>, std::span<std::byte>) = delete;
  request iall_gather(std::span<const std::byte>, std::span<std::byte>) = delete;

  // -------------------------------------------------------- non-blocking
  ///@{
  /// Each enqueues the operation on the stream and returns; operations run
  /// in issue order. With check_agreement on, issuing first waits for the
  /// operations issued before (the check reads its result on the host).
  request iall_reduce(device_view<float> buf, reduce_op op) {
    check_memory(buf.data(), buf.size() * sizeof(float), "all_reduce", "the buffer");
    raise_if(detail::reduce_problem(site(), op));
    auto req = launch(collective::all_reduce, buf.size(), static_cast<std::int64_t>(op),
                      [&](shared_state& s, clock::time_point issued) {
                        if (buf.empty()) return;
                        s.settle(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32,
                                               op == reduce_op::mean ? ncclAvg : ncclSum, s.comm, s.stream),
                                 "ncclAllReduce", "all_reduce", issued);
                      });
    traffic_.add_all_reduce(buf.size() * sizeof(float), size());
    return req;
  }
  request ibroadcast(device_view<float> buf, int root) {
    return broadcast_bytes(buf.data(), buf.size() * sizeof(float), buf.size(), ncclFloat32, root,
                           collective::broadcast_fp32);
  }
  request ibroadcast(device_view<std::byte> buf, int root) {
    return broadcast_bytes(buf.data(), buf.size(), buf.size(), ncclUint8, root, collective::broadcast_bytes);
  }
  request iall_to_all(device_view<const std::byte> send, device_view<std::byte> recv) {
    check_exchange(collective::all_to_all, send, recv);
    const std::size_t block = send.size() / static_cast<std::size_t>(size());
    auto req = launch(collective::all_to_all, send.size(), 0,
                      [&](shared_state& s, clock::time_point issued) {
                        if (block == 0) return;
                        const std::size_t me = static_cast<std::size_t>(s.rank) * block;
                        // Our own block needs no network.
                        s.check_cuda_call(cudaMemcpyAsync(recv.data() + me, send.data() + me, block,
                                                          cudaMemcpyDeviceToDevice, s.stream),
                                          "cudaMemcpyAsync", "all_to_all");
                        if (s.size == 1) return;
                        // One group, so every send and receive progresses together.
                        s.settle(ncclGroupStart(), "ncclGroupStart", "all_to_all", issued);
                        ncclResult_t first = ncclSuccess;
                        const char* first_call = "";
                        auto note = [&](ncclResult_t r, const char* call) {
                          if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) {
                            first = r;
                            first_call = call;
                          }
                        };
                        for (int k = 0; k < s.size; ++k) {
                          if (k == s.rank) continue;
                          const std::size_t at = static_cast<std::size_t>(k) * block;
                          note(ncclSend(send.data() + at, block, ncclUint8, k, s.comm, s.stream), "ncclSend");
                          note(ncclRecv(recv.data() + at, block, ncclUint8, k, s.comm, s.stream), "ncclRecv");
                        }
                        const ncclResult_t end = ncclGroupEnd();  // always closes the group
                        if (first != ncclSuccess) s.settle(first, first_call, "all_to_all", issued);
                        s.settle(end, "ncclGroupEnd", "all_to_all", issued);
                      });
    account_exchange(block);
    return req;
  }
  request iall_gather(device_view<const std::byte> send, device_view<std::byte> recv) {
    check_exchange(collective::all_gather, send, recv);
    auto req = launch(collective::all_gather, send.size(), 0,
                      [&](shared_state& s, clock::time_point issued) {
                        if (send.empty()) return;
                        s.settle(ncclAllGather(send.data(), recv.data(), send.size(), ncclUint8, s.comm, s.stream),
                                 "ncclAllGather", "all_gather", issued);
                      });
    account_exchange(send.size());
    return req;
  }
  ///@}
  /// Completes once every rank has reached it and the operations issued
  /// before it on this rank are done.
  request ibarrier() {
    return launch(collective::barrier, 0, 0, [](shared_state& s, clock::time_point issued) {
      float* token = barrier_token(s);
      s.settle(ncclAllReduce(token, token, 1, ncclFloat32, ncclSum, s.comm, s.stream), "ncclAllReduce", "barrier",
               issued);
    });
  }

 private:
  shared_state& state() const {
    if (!state_) diloco::detail::raise<state_error>("nccl: this communicator was moved from");
    return *state_;
  }

  static float* barrier_token(shared_state& s) {
    const std::size_t records = static_cast<std::size_t>(s.size) + 1;
    return reinterpret_cast<float*>(static_cast<detail::call_record*>(s.device_scratch) + records);
  }

  /// Checks, on this rank alone, that `bytes` at p are device memory of this
  /// communicator's device (or managed memory).
  void check_memory(const void* p, std::size_t bytes, const char* op, const char* what) const {
    using diloco::detail::raise;
    const auto& s = state();
    if (bytes == 0) return;
    if (p == nullptr) raise<config_error>("nccl ", op, ": ", what, " is a null pointer with ", bytes, " bytes");
    cudaPointerAttributes attributes{};
    const cudaError_t e = cudaPointerGetAttributes(&attributes, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      raise<config_error>("nccl ", op, ": ", what, " is not memory CUDA knows (cudaPointerGetAttributes: ",
                          detail_nccl::cuda_error_text(e), "); pass device memory");
    }
    if (attributes.type == cudaMemoryTypeManaged) return;
    if (attributes.type != cudaMemoryTypeDevice)
      raise<config_error>("nccl ", op, ": ", what, " points to ",
                          attributes.type == cudaMemoryTypeHost ? "pinned host memory" : "pageable host memory",
                          "; NCCL reads and writes device memory only: copy the data to the device first");
    if (attributes.device != s.device)
      raise<config_error>("nccl ", op, ": ", what, " is on CUDA device ", attributes.device,
                          ", this communicator on device ", s.device);
  }

  /// The local checks shared by every communicator (comm/detail/arguments.hpp),
  /// raised at once: the ranks' records travel on the device, behind the
  /// operations issued before, so a rank does not enter the check with them.
  detail::call_site site() const { return {"nccl", "world", rank()}; }

  static void raise_if(const std::string& problem) {
    if (!problem.empty()) diloco::detail::raise<config_error>(problem);
  }

  void check_exchange(collective c, device_view<const std::byte> send, device_view<std::byte> recv) const {
    raise_if(detail::exchange_problem(site(), c, send.data(), send.size(), recv.data(), recv.size(), size()));
    check_memory(send.data(), send.size(), detail::name(c), "send");
    check_memory(recv.data(), recv.size(), detail::name(c), "recv");
  }

  request broadcast_bytes(void* data, std::size_t bytes, std::size_t count, ncclDataType_t type, int root,
                          collective c) {
    raise_if(detail::root_problem(site(), c, root, size()));
    check_memory(data, bytes, "broadcast", "the buffer");
    auto req = launch(c, count, root,
                      [&](shared_state& s, clock::time_point issued) {
                        if (count == 0) return;
                        s.settle(ncclBroadcast(data, data, count, type, root, s.comm, s.stream), "ncclBroadcast",
                                 "broadcast", issued);
                      });
    traffic_.add_broadcast(bytes, rank(), root, size());
    return req;
  }

  void account_exchange(std::size_t block) { traffic_.add_exchange(block, size()); }

  /// Agreement check, then the operation's NCCL calls, then the event the
  /// request waits on.
  template <class Issue>
  request launch(collective c, std::uint64_t count, std::int64_t arg, Issue&& issue) {
    const char* op = detail::name(c);
    shared_state& s = state();
    s.require_usable(op);
    detail_nccl::device_guard guard(s.device, s.rank);
    const auto issued = clock::now();
    if (s.check_agreement && s.size > 1)
      detail::agree(site(), detail::record_of(c, count, arg), {},
                    [&](const detail::call_record& mine) { return exchange_records(s, mine, op, issued); });
    issue(s, issued);
    return request(detail_nccl::pending_op(state_, s.record(op), issued, op));
  }

  /// The records' exchange for the shared agreement check
  /// (comm/detail/agreement.hpp): one ncclAllGather on the stream, read
  /// back on the host.
  static std::span<const detail::call_record> exchange_records(shared_state& s, const detail::call_record& record,
                                                               const char* op, clock::time_point issued) {
    constexpr std::size_t bytes = sizeof(detail::call_record);
    detail::call_record* mine = s.host_scratch;
    *mine = record;
    auto* dev = static_cast<detail::call_record*>(s.device_scratch);
    const std::size_t all_bytes = bytes * static_cast<std::size_t>(s.size);
    s.check_cuda_call(cudaMemcpyAsync(dev, mine, bytes, cudaMemcpyHostToDevice, s.stream), "cudaMemcpyAsync", op);
    s.settle(ncclAllGather(dev, dev + 1, bytes, ncclUint8, s.comm, s.stream), "ncclAllGather (agreement check)", op,
             issued);
    s.check_cuda_call(cudaMemcpyAsync(mine + 1, dev + 1, all_bytes, cudaMemcpyDeviceToHost, s.stream),
                      "cudaMemcpyAsync", op);
    const detail_nccl::event_lease lease{s, s.record(op)};
    s.wait(lease.event, issued, op);
    return {mine + 1, static_cast<std::size_t>(s.size)};
  }

  std::shared_ptr<shared_state> state_;
  traffic_counters traffic_{};
};

static_assert(device_communicator<nccl>, "comm::nccl must model diloco::device_communicator");
static_assert(!communicator<nccl>, "comm::nccl must not accept host memory");

}  // namespace diloco::comm
