// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "diloco/core/require_cxx20.hpp"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "diloco/comm/detail/agreement.hpp"
#include "diloco/comm/detail/mpi_call.hpp"
#include "diloco/comm/detail/mpi_wait.hpp"
#include "diloco/comm/detail/request.hpp"
#include "diloco/core/comm_types.hpp"
#include "diloco/core/concepts.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/memory_space.hpp"
#include "diloco/core/timeout.hpp"
#include "diloco/core/tensor_traits.hpp"

#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

// Device buffers need the CUDA runtime: the device operations exist where it
// is (DILOCO_WITH_CUDA from diloco::cuda, or nvcc). Everything else, the
// layout of the communicator, its requests and their completions included,
// is the same in every translation unit: a program may mix translation
// units compiled with and without CUDA (one definition of each class).
#if defined(DILOCO_WITH_CUDA) || defined(__CUDACC__)
#define DILOCO_MPI_DEVICE_BUFFERS 1
#include "diloco/comm/detail/pinned_staging.hpp"
#else
#define DILOCO_MPI_DEVICE_BUFFERS 0
#endif

namespace diloco::comm {

/// How device buffers reach MPI.
enum class mpi_device_path : std::uint8_t {
  detect,  ///< direct if the MPI library reports CUDA support, staged otherwise
  direct,  ///< device pointers handed to MPI (the library must be CUDA-aware)
  staged,  ///< copied through pinned host buffers around every collective
};

/// What comm::mpi checks and how long it waits, set with designated initializers.
struct mpi_options {
  /// The number of ranks the program was written for; 0 accepts any. A
  /// mismatch (a job started with the wrong -np) is a config_error.
  int expected_size = 0;
  /// Before each collective the ranks compare the operation, the buffer size
  /// and the root or reduction with one tiny MPI_Allreduce, so a mismatch
  /// throws on every rank instead of hanging or corrupting memory. Turning it
  /// off saves that round trip per call (it matters only for small buffers)
  /// and makes non-blocking calls return without synchronizing the ranks.
  bool check_arguments = true;
  /// The largest count handed to a single MPI call (MPI counts are int);
  /// longer buffers are split into several calls.
  std::size_t max_count_per_call = INT_MAX;
  /// Device buffers only (builds with CUDA).
  mpi_device_path device_path = mpi_device_path::detect;
  /// The default timeout: 30 s, as comm::gloo's. Finite because mpirun
  /// does not always end the job when a rank dies (`--mca
  /// orte_abort_on_non_zero_status 0`, schedulers that keep ranks alive),
  /// and then the survivors would wait in MPI forever.
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::seconds(30);
  /// Bound on every wait for the other ranks: 1 ms to one year
  /// (default_timeout unless set), or diloco::no_timeout (MPI's own blocking
  /// calls, which wait as long as it takes). With a timeout every collective
  /// (the argument check included) is issued non-blocking and polled with
  /// MPI_Testall, backing off to short sleeps, and one not complete in time
  /// throws comm_error naming the operation, the rank and the timeout: a
  /// peer that died while mpirun keeps the job alive does not hang the
  /// others. Set it above the longest time a rank may wait for another at a
  /// round (a rank that evaluates or saves while the others wait), on every
  /// rank alike (with check_arguments a timed rank and an untimed one are a
  /// comm_error). After a timeout the communicator is unusable: MPI cannot
  /// cancel a collective, so its buffers may still be written.
  std::chrono::milliseconds timeout = default_timeout;
  /// With a timeout: call MPI_Abort on the communicator instead of throwing
  /// (after printing the message to stderr), which ends the whole job. Off by
  /// default, since the error then never reaches the program.
  bool abort_on_timeout = false;
};

namespace detail_mpi {

// The same float division the threads communicator applies to its sums.
inline void divide_by_size(float* x, std::size_t n, int size) {
  const auto m = static_cast<float>(size);
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] / m;
}

struct completion;

// The device half of the communicator: pinned staging slots and the device
// work left after MPI finishes. Only a translation unit with the CUDA runtime
// makes one (the first device operation does); the context holds it through
// this interface, so the context, the requests and the completions have one
// layout and the functions shared by every translation unit one body.
class device_support {
 public:
  virtual ~device_support() = default;
  // Gives a staging slot back.
  virtual void release(int slot) = 0;
  // Finishes `done` (its slot already taken from it: `slot`, or -1): the
  // host division, the device division, the copy out of the slot; the slot
  // is given back even on error.
  virtual void finish(const completion& done, int slot, int size, const char* operation, int rank) = 0;
};

// What the communicator and its outstanding requests share: the duplicated
// communicator and the device staging. A request keeps it alive, so a
// request may outlive the communicator object that issued it.
struct context {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  wait_policy policy;
  // Why the communicator is unusable (a timeout left an operation running);
  // empty while it is usable.
  std::string failed;
  // Made by the first device operation; null in a host-only program.
  std::unique_ptr<device_support> device;

  context() = default;
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() {
    // After MPI_Finalize no MPI object may be touched; the library has
    // released the communicator itself then.
    int finalized = 0;
    MPI_Finalized(&finalized);
    // After a timeout an operation is still active on it: leave it be.
    if (comm != MPI_COMM_NULL && !finalized && failed.empty()) MPI_Comm_free(&comm);
  }

  // Throws comm_error if an earlier timeout made the communicator unusable.
  void check_usable(const char* operation) const {
    if (!failed.empty())
      diloco::detail::raise<comm_error>("mpi ", operation, " on rank ", rank,
                                        ": the communicator is unusable after an earlier timeout (", failed, ")");
  }

  // Completes `n` requests within `deadline`: MPI failures throw comm_error,
  // a timeout marks the communicator unusable and throws comm_error (or
  // aborts the job when the user asked for that).
  void complete(int n, MPI_Request* reqs, std::chrono::steady_clock::time_point deadline, const char* mpi_call,
                const char* operation) {
    bool late = false;
    const char* waited_with = "";
    const int rc = wait_all(n, reqs, policy, deadline, late, &waited_with);
    if (late) time_out(mpi_call, operation);
    check(rc, waited_with, operation, rank);
  }

  [[noreturn]] void time_out(const char* mpi_call, const char* operation) {
    failed = timeout_message(operation, rank, mpi_call, policy.timeout);
    raise_timeout(comm, policy, failed);
  }
};

// The MPI requests of one operation: one, or one per piece when the buffer
// was split. The common case stores its request inline.
class request_set {
 public:
  void add(MPI_Request r) {
    if (count_ == 0) {
      one_ = r;
    } else {
      if (count_ == 1) many_.assign(1, one_);
      many_.push_back(r);
    }
    ++count_;
  }
  int size() const { return static_cast<int>(count_); }
  MPI_Request* data() { return count_ <= 1 ? &one_ : many_.data(); }
  void clear() {
    count_ = 0;
    many_.clear();
  }

 private:
  MPI_Request one_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> many_;
  std::size_t count_ = 0;
};

// What remains to do once MPI has finished an operation: the mean's
// division (MPI sums; the division is ours), and for device buffers the
// copy out of the staging slot and the slot's return.
struct completion {
  float* divide = nullptr;  // host floats to divide by the world size
  std::size_t divide_count = 0;
  float* device_divide = nullptr;  // device floats to divide (direct path)
  std::size_t device_divide_count = 0;
  void* copy_to = nullptr;  // device destination of a staged result
  std::size_t copy_offset = 0;
  std::size_t copy_bytes = 0;
  int slot = -1;

  // Runs the remaining work; the staging slot is returned even on error.
  // Device work exists only in completions made by device operations,
  // which made ctx.device first.
  void run(context& ctx, const char* operation) {
    const int taken = std::exchange(slot, -1);
    if (taken < 0 && !device_divide) {
      divide_by_size(divide, divide_count, ctx.size);
      return;
    }
    ctx.device->finish(*this, taken, ctx.size, operation, ctx.rank);
  }

  // Gives the staging slot back without finishing (the operation failed).
  void abandon(context& ctx) {
    if (slot >= 0 && ctx.device) ctx.device->release(slot);
    slot = -1;
  }
};

inline bool library_is_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

#if DILOCO_MPI_DEVICE_BUFFERS
// device_support over pinned host buffers and cudaMemcpy.
class pinned_device_support final : public device_support {
 public:
  void release(int slot) override { staging.release(slot); }

  void finish(const completion& done, int slot, int size, const char* operation, int rank) override {
    struct slot_guard {
      pinned_staging& st;
      int s;
      ~slot_guard() {
        if (s >= 0) st.release(s);
      }
    } guard{staging, slot};
    divide_by_size(done.divide, done.divide_count, size);
    if (done.device_divide) {
      // Rare (the algorithm reduces with sum): a round trip through host
      // memory keeps this header free of device code.
      const std::size_t bytes = done.device_divide_count * sizeof(float);
      slot_guard tmp{staging, staging.acquire(bytes, operation, rank)};
      auto* host = reinterpret_cast<float*>(staging.data(tmp.s));
      check_cuda(cudaMemcpy(host, done.device_divide, bytes, cudaMemcpyDefault), "cudaMemcpy (device to host)",
                 operation, rank);
      divide_by_size(host, done.device_divide_count, size);
      check_cuda(cudaMemcpy(done.device_divide, host, bytes, cudaMemcpyDefault), "cudaMemcpy (host to device)",
                 operation, rank);
    }
    if (done.copy_to && done.copy_bytes)
      check_cuda(cudaMemcpy(done.copy_to, staging.data(slot) + done.copy_offset, done.copy_bytes, cudaMemcpyDefault),
                 "cudaMemcpy (host to device)", operation, rank);
  }

  pinned_staging staging;
};
#endif

}  // namespace detail_mpi

class mpi;

namespace detail_mpi {

// An MPI operation in flight, as its request holds it (comm/detail/request.hpp).
struct pending_op {
  using issuer = comm::mpi;

  std::shared_ptr<context> ctx;
  const char* operation = "";
  const char* mpi_call = "";  // the (first) MPI call it posted, for messages
  request_set pending;
  completion then;
  // Set for the internal request of a blocking call with a timeout: its
  // deadline runs from the start of the call.
  bool blocking = false;
  std::chrono::steady_clock::time_point deadline{};

  bool active() const { return ctx != nullptr; }

  void add(MPI_Request r, const char* call) {
    if (pending.size() == 0) mpi_call = call;
    pending.add(r);
  }

  // With comm::mpi's timeout set, waits at most that long (from this call)
  // and then throws comm_error; the communicator is unusable afterwards.
  void wait() {
    // A blocking call's deadline was set when it started.
    const auto until = blocking ? deadline : diloco::detail::deadline_after(ctx->policy.timeout);
    bool late = false;
    const char* waited_with = "";
    const int rc = wait_all(pending.size(), pending.data(), ctx->policy, until, late, &waited_with);
    if (late) time_out();
    finish(rc, waited_with);
  }

  bool test() {
    int done = 0;
    const int rc = MPI_Testall(pending.size(), pending.data(), &done, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS && !done) return false;
    finish(rc, "MPI_Testall");
    return true;
  }

  // The MPI requests stay active (MPI cannot cancel or free a collective's):
  // they, and the staging slot if any, are left to the failed communicator.
  [[noreturn]] void time_out() {
    auto c = std::move(ctx);
    pending.clear();
    c->time_out(mpi_call, operation);
  }

  // The operation is spent afterwards, whether or not it failed.
  void finish(int rc, const char* call) {
    auto c = std::move(ctx);
    pending.clear();
    if (rc != MPI_SUCCESS) {
      then.abandon(*c);
      check(rc, call, operation, c->rank);
    }
    then.run(*c, operation);
  }
};

}  // namespace detail_mpi

/// The handle of a non-blocking MPI collective (detail::basic_request).
/// wait() completes it (and rethrows its error as comm_error); test() polls.
/// The buffers must stay alive and untouched until then. With comm::mpi's
/// timeout set, wait() waits at most that long (from the call) and then
/// throws comm_error; the communicator is unusable afterwards.
using mpi_request = detail::basic_request<detail_mpi::pending_op>;

/// diloco::comm::mpi: the workers are the ranks of an MPI communicator the
/// user created (diloco never calls MPI_Init or MPI_Finalize). Link the
/// diloco::mpi CMake target to use it. With DILOCO_WITH_CUDA (the diloco::cuda
/// target) or under nvcc it also takes device buffers: handed to MPI directly
/// when the MPI library is CUDA-aware, staged through pinned host memory
/// otherwise.
///
/// Every rank must call the same collectives in the same order, from one
/// thread at a time (MPI_THREAD_FUNNELED is enough). The results are those of
/// MPI's own reductions, which are deterministic for a given library, world
/// size, message size and call (blocking or not).
///
/// Every wait is bounded by options.timeout (30 s by default, as Gloo's):
/// each collective is issued non-blocking and polled against it, so a dead
/// peer (in a job mpirun keeps alive) is a comm_error naming the operation
/// and the timeout instead of a hang. diloco::no_timeout gives MPI's own
/// blocking calls, unbounded.
class mpi {
 public:
  using options = mpi_options;  ///< expected size, argument checks, timeout, device path (mpi_options)
  using request = mpi_request;  ///< what the non-blocking operations return

  /// Duplicates `comm` (collective over it): diloco's traffic never mixes
  /// with the caller's, and errors on the duplicate come back as codes
  /// (MPI_ERRORS_RETURN) that are thrown as comm_error. MPI must be
  /// initialized and stay so until this object and its requests are gone.
  explicit mpi(MPI_Comm comm) : mpi(comm, options{}) {}
  /// Duplicates `comm` with these options; see mpi(MPI_Comm).
  mpi(MPI_Comm comm, options opts) : opts_(opts) {
    validate_environment(comm, opts_);
    int rank = 0, size = 0;
    detail_mpi::check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", "constructor", -1);
    detail_mpi::check(MPI_Comm_size(comm, &size), "MPI_Comm_size", "constructor", rank);
    if (opts_.expected_size != 0 && opts_.expected_size != size)
      diloco::detail::raise<config_error>("comm::mpi: expected ", opts_.expected_size,
                                          " ranks, the MPI communicator has ", size,
                                          " (was the job started with the right -np?)");
    auto ctx = std::make_shared<detail_mpi::context>();
    ctx->rank = rank;
    ctx->size = size;
    ctx->policy = {opts_.timeout, opts_.abort_on_timeout};
    duplicate(comm, *ctx);
    detail_mpi::check(MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
                      "constructor", rank);
    // Ranks on this host share its cores: the engine sizes its host
    // threads by this count.
    MPI_Comm host = MPI_COMM_NULL;
    detail_mpi::check(MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host),
                      "MPI_Comm_split_type", "constructor", rank);
    detail_mpi::check(MPI_Comm_size(host, &workers_on_host_), "MPI_Comm_size", "constructor", rank);
    MPI_Comm_free(&host);
    ctx_ = std::move(ctx);
    direct_device_ = opts_.device_path == mpi_device_path::direct ||
                     (opts_.device_path == mpi_device_path::detect && detail_mpi::library_is_cuda_aware());
  }

  /// `base` with its timeout taken from DILOCO_TIMEOUT_MS when that is set
  /// (milliseconds in [1, one year], or "none"), as comm::gloo::from_env
  /// reads it; a malformed value is a config_error. Unset, base is unchanged
  /// (mpi_options::default_timeout by default). mpirun passes the variable to local ranks; use
  /// `-x DILOCO_TIMEOUT_MS` for remote ones.
  static options options_from_env(options base = {}) {
    if (const char* v = std::getenv("DILOCO_TIMEOUT_MS"))
      base.timeout = diloco::detail::parse_timeout_ms(v, "DILOCO_TIMEOUT_MS");
    return base;
  }

  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ///@{
  /// A moved-from communicator may only be destroyed or assigned to.
  mpi(mpi&&) noexcept = default;
  mpi& operator=(mpi&&) noexcept = default;
  ///@}
  ~mpi() = default;

  ///@{
  /// This rank and the communicator's size.
  int rank() const { return ctx_->rank; }
  int size() const { return ctx_->size; }
  ///@}
  /// How many ranks of this communicator run on this host (sharing its cores).
  int workers_on_host() const { return workers_on_host_; }
  /// The bytes this rank has sent and received, as core/comm_types.hpp models them.
  traffic_counters traffic() const { return traffic_; }
  /// The options it was constructed with.
  const options& settings() const { return opts_; }
  /// The duplicated communicator diloco talks over.
  MPI_Comm native_handle() const { return ctx_->comm; }
  /// True when device buffers go to MPI as they are (no staging copies).
  bool passes_device_pointers() const { return direct_device_; }

  // ------------------------------------------------------------ blocking
  /// In-place all-reduce of fp32 buffers: MPI_Allreduce with MPI_SUM; mean
  /// divides the sum by the world size afterwards.
  void all_reduce(std::span<float> buf, reduce_op op) {
    blocking("all_reduce", [&](pending* out) {
      start_all_reduce(buf.data(), buf.size(), op, out);
    });
  }
  ///@{
  /// Copies root's buffer into every rank's buffer.
  /// Copies root's buffer into every rank's buffer.
  void broadcast(std::span<float> buf, int root) {
    blocking("broadcast", [&](pending* out) {
      start_broadcast(detail::collective::broadcast_fp32, buf.data(), buf.size(), root, out);
    });
  }
  void broadcast(std::span<std::byte> buf, int root) {
    blocking("broadcast", [&](pending* out) {
      start_broadcast(detail::collective::broadcast_bytes, buf.data(), buf.size(), root, out);
    });
  }
  ///@}
  /// send holds M equal blocks, block k for rank k; recv receives block
  /// `rank` of every rank's send, in rank order.
  void all_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    blocking("all_to_all", [&](pending* out) {
      start_exchange(detail::collective::all_to_all, send.data(), send.size(), recv.data(), recv.size(), out);
    });
  }
  /// recv receives every rank's send, in rank order (M blocks).
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    blocking("all_gather", [&](pending* out) {
      start_exchange(detail::collective::all_gather, send.data(), send.size(), recv.data(), recv.size(), out);
    });
  }
  /// Returns once every rank has entered it.
  void barrier() { blocking("barrier", [&](pending* out) { start_barrier(out); }); }

  // -------------------------------------------------------- non-blocking
  ///@{
  /// Each posts the MPI operation and returns; MPI progresses it. Buffers
  /// must stay untouched until wait() returns.
  request iall_reduce(std::span<float> buf, reduce_op op) {
    request r = make_request("all_reduce");
    start_all_reduce(buf.data(), buf.size(), op, &r.op_);
    return r;
  }
  request ibroadcast(std::span<float> buf, int root) {
    request r = make_request("broadcast");
    start_broadcast(detail::collective::broadcast_fp32, buf.data(), buf.size(), root, &r.op_);
    return r;
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    request r = make_request("broadcast");
    start_broadcast(detail::collective::broadcast_bytes, buf.data(), buf.size(), root, &r.op_);
    return r;
  }
  request iall_to_all(std::span<const std::byte> send, std::span<std::byte> recv) {
    request r = make_request("all_to_all");
    start_exchange(detail::collective::all_to_all, send.data(), send.size(), recv.data(), recv.size(), &r.op_);
    return r;
  }
  request iall_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
    request r = make_request("all_gather");
    start_exchange(detail::collective::all_gather, send.data(), send.size(), recv.data(), recv.size(), &r.op_);
    return r;
  }
  request ibarrier() {
    request r = make_request("barrier");
    start_barrier(&r.op_);
    return r;
  }
  ///@}

#if DILOCO_MPI_DEVICE_BUFFERS
  // ---------------------------------------------------- device buffers
  ///@{
  /// The same operations over device memory. The buffers must be ready
  /// (kernels writing them finished) when the call is made; staging copies
  /// use cudaMemcpy, which orders itself after the legacy default stream.
  void all_reduce(device_view<float> buf, reduce_op op) {
    blocking("all_reduce", [&](pending* out) {
      start_device_all_reduce(buf, op, out);
    });
  }
  void broadcast(device_view<float> buf, int root) {
    blocking("broadcast", [&](pending* out) {
      start_device_broadcast(detail::collective::broadcast_fp32, buf.data(), buf.size(), root, out);
    });
  }
  void broadcast(device_view<std::byte> buf, int root) {
    blocking("broadcast", [&](pending* out) {
      start_device_broadcast(detail::collective::broadcast_bytes, buf.data(), buf.size(), root, out);
    });
  }
  void all_to_all(device_view<const std::byte> send, device_view<std::byte> recv) {
    blocking("all_to_all", [&](pending* out) {
      start_device_exchange(detail::collective::all_to_all, send, recv, out);
    });
  }
  void all_gather(device_view<const std::byte> send, device_view<std::byte> recv) {
    blocking("all_gather", [&](pending* out) {
      start_device_exchange(detail::collective::all_gather, send, recv, out);
    });
  }

  request iall_reduce(device_view<float> buf, reduce_op op) {
    request r = make_request("all_reduce");
    start_device_all_reduce(buf, op, &r.op_);
    return r;
  }
  request ibroadcast(device_view<float> buf, int root) {
    request r = make_request("broadcast");
    start_device_broadcast(detail::collective::broadcast_fp32, buf.data(), buf.size(), root, &r.op_);
    return r;
  }
  request ibroadcast(device_view<std::byte> buf, int root) {
    request r = make_request("broadcast");
    start_device_broadcast(detail::collective::broadcast_bytes, buf.data(), buf.size(), root, &r.op_);
    return r;
  }
  request iall_to_all(device_view<const std::byte> send, device_view<std::byte> recv) {
    request r = make_request("all_to_all");
    start_device_exchange(detail::collective::all_to_all, send, recv, &r.op_);
    return r;
  }
  request iall_gather(device_view<const std::byte> send, device_view<std::byte> recv) {
    request r = make_request("all_gather");
    start_device_exchange(detail::collective::all_gather, send, recv, &r.op_);
    return r;
  }
  ///@}
#endif

 private:
  using collective = detail::collective;
  using pending = detail_mpi::pending_op;

  /// MPI_Comm_dup, or with a timeout MPI_Comm_idup polled against it (a rank
  /// that died before the constructor is a timeout, not a hang).
  static void duplicate(MPI_Comm comm, detail_mpi::context& ctx) {
    if (!ctx.policy.timed()) {
      detail_mpi::check(MPI_Comm_dup(comm, &ctx.comm), "MPI_Comm_dup", "constructor", ctx.rank);
      return;
    }
    const auto deadline = diloco::detail::deadline_after(ctx.policy.timeout);
    MPI_Request r = MPI_REQUEST_NULL;
    detail_mpi::check(MPI_Comm_idup(comm, &ctx.comm, &r), "MPI_Comm_idup", "constructor", ctx.rank);
    bool late = false;
    const char* waited_with = "";
    const int rc = detail_mpi::wait_all(1, &r, ctx.policy, deadline, late, &waited_with);
    if (late) {
      // The new handle is not valid until the duplication completes: the
      // context's destructor must not free it.
      ctx.failed = detail_mpi::timeout_message("constructor", ctx.rank, "MPI_Comm_idup", ctx.policy.timeout);
      detail_mpi::raise_timeout(comm, ctx.policy, ctx.failed);
    }
    if (rc != MPI_SUCCESS) ctx.comm = MPI_COMM_NULL;
    detail_mpi::check(rc, waited_with, "constructor", ctx.rank);
  }

  static void validate_environment(MPI_Comm comm, const options& opts) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      diloco::detail::raise<config_error>(
          "comm::mpi: MPI is ", finalized ? "already finalized" : "not initialized",
          "; call MPI_Init (or MPI_Init_thread) before constructing the communicator and MPI_Finalize only after "
          "it is destroyed (diloco never initializes MPI itself)");
    if (comm == MPI_COMM_NULL)
      diloco::detail::raise<config_error>(
          "comm::mpi: the communicator is MPI_COMM_NULL (this process is not a member of it, or it was freed); "
          "expected a valid intracommunicator such as MPI_COMM_WORLD");
    if (opts.expected_size < 0)
      diloco::detail::raise<config_error>("comm::mpi: expected_size must be >= 0 (0 = any), got ",
                                          opts.expected_size);
    if (opts.max_count_per_call < 1 || opts.max_count_per_call > static_cast<std::size_t>(INT_MAX))
      diloco::detail::raise<config_error>("comm::mpi: max_count_per_call must be in [1, ", INT_MAX, "], got ",
                                          opts.max_count_per_call);
    if (opts.device_path != mpi_device_path::detect && opts.device_path != mpi_device_path::direct &&
        opts.device_path != mpi_device_path::staged)
      diloco::detail::raise<config_error>("comm::mpi: device_path must be detect, direct or staged, got ",
                                          static_cast<int>(opts.device_path));
    diloco::detail::check_timeout(opts.timeout, "comm::mpi: timeout");
    int inter = 0;
    detail_mpi::check(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter", "constructor", -1);
    if (inter)
      diloco::detail::raise<config_error>(
          "comm::mpi: the communicator is an intercommunicator, whose collectives combine two groups; expected an "
          "intracommunicator such as MPI_COMM_WORLD or one made by MPI_Comm_split");
  }

  request make_request(const char* operation) const {
    pending op;
    op.ctx = ctx_;
    op.operation = operation;
    return request(std::move(op));
  }

  /// A blocking call: without a timeout MPI's blocking form (out is null);
  /// with one the non-blocking form, waited for against a deadline that runs
  /// from here.
  template <class Start>
  void blocking(const char* operation, Start&& start) {
    if (!ctx_->policy.timed()) {
      start(static_cast<pending*>(nullptr));
      return;
    }
    request r = make_request(operation);
    r.op_.blocking = true;
    r.op_.deadline = diloco::detail::deadline_after(ctx_->policy.timeout);
    start(&r.op_);
    r.wait();
  }

  static bool nonblocking(const pending* out) { return out != nullptr && !out->blocking; }

  /// Agrees on the call across ranks (comm/detail/agreement.hpp, over one
  /// MPI_Iallreduce of the records, whatever the timeout, so that ranks with
  /// and without one still pair up there), or, unchecked, reports a local
  /// problem at once. Nothing has moved when this throws. `out` is the
  /// operation of a non-blocking call, or of a blocking one with a timeout,
  /// null otherwise.
  void begin(collective c, std::uint64_t count, std::int64_t arg, const std::string& problem,
             const pending* out) const {
    const char* what = detail::name(c);
    ctx_->check_usable(what);
    if (!opts_.check_arguments) {
      if (!problem.empty()) diloco::detail::raise<config_error>(problem);
      return;
    }
    // A blocking call's deadline covers the check too; a non-blocking
    // call's check gets a timeout of its own.
    const auto deadline = out && out->blocking ? out->deadline : diloco::detail::deadline_after(ctx_->policy.timeout);
    detail::call_record mine = detail::record_of(c, count, arg);
    if (nonblocking(out)) mine.flags |= detail::call_record::nonblocking;
    if (ctx_->policy.timed()) mine.flags |= detail::call_record::timed;
    std::vector<detail::call_record> all(static_cast<std::size_t>(size()));
    detail::agree(site(), mine, problem, [&](const detail::call_record& record) {
      // Each rank's record in its own slot of zeros, OR-ed together: an
      // all-gather of the records as one MPI_Iallreduce.
      all[static_cast<std::size_t>(rank())] = record;
      constexpr int words = sizeof record / sizeof(std::uint64_t);
      MPI_Request pending_check = MPI_REQUEST_NULL;
      detail_mpi::check(MPI_Iallreduce(MPI_IN_PLACE, all.data(), words * size(), MPI_UINT64_T, MPI_BOR, ctx_->comm,
                                       &pending_check),
                        "MPI_Iallreduce (argument check)", what, rank());
      ctx_->complete(1, &pending_check, deadline, "MPI_Iallreduce (argument check)", what);
      return std::span<const detail::call_record>(all);
    });
  }

  /// A blocking call completes here; a non-blocking one hands what is left
  /// to its request.
  void end(detail_mpi::completion then, pending* out, const char* operation) {
    if (out)
      out->then = then;
    else
      then.run(*ctx_, operation);
  }

  /// The local checks shared by every communicator (comm/detail/arguments.hpp).
  detail::call_site site() const { return {"mpi", "communicator", rank()}; }

  std::string root_problem(collective c, int root) const { return detail::root_problem(site(), c, root, size()); }

  std::string exchange_problem(collective c, const std::byte* send, std::size_t send_bytes, const std::byte* recv,
                               std::size_t recv_bytes) const {
    return detail::exchange_problem(site(), c, send, send_bytes, recv, recv_bytes, size());
  }

  std::string reduce_problem(reduce_op op) const { return detail::reduce_problem(site(), op); }

  // --------------------------------------------------- the MPI calls
  void post_sum(float* data, std::size_t n, pending* out) {
    detail_mpi::for_each_piece(n, opts_.max_count_per_call, [&](std::size_t off, int count) {
      if (out) {
        MPI_Request r = MPI_REQUEST_NULL;
        detail_mpi::check(MPI_Iallreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, MPI_SUM, ctx_->comm, &r),
                          "MPI_Iallreduce", "all_reduce", rank());
        out->add(r, "MPI_Iallreduce");
      } else {
        detail_mpi::check(MPI_Allreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, MPI_SUM, ctx_->comm),
                          "MPI_Allreduce", "all_reduce", rank());
      }
    });
  }

  void post_broadcast(void* data, std::size_t n, MPI_Datatype type, std::size_t element_bytes, int root,
                      pending* out) {
    auto* bytes = static_cast<std::byte*>(data);
    detail_mpi::for_each_piece(n, opts_.max_count_per_call, [&](std::size_t off, int count) {
      void* at = bytes + off * element_bytes;
      if (out) {
        MPI_Request r = MPI_REQUEST_NULL;
        detail_mpi::check(MPI_Ibcast(at, count, type, root, ctx_->comm, &r), "MPI_Ibcast", "broadcast", rank());
        out->add(r, "MPI_Ibcast");
      } else {
        detail_mpi::check(MPI_Bcast(at, count, type, root, ctx_->comm), "MPI_Bcast", "broadcast", rank());
      }
    });
  }

  /// Blocks too large for one call travel in slices: slice [off, off + len)
  /// of every block at once, described by a byte type whose extent is the
  /// block, so it lands at the same offset of every rank's block.
  void post_exchange(collective c, const std::byte* send, std::byte* recv, std::size_t block, pending* out) {
    const bool to_all = c == collective::all_to_all;
    const char* op = detail::name(c);
    const char* call = to_all ? (out ? "MPI_Ialltoall" : "MPI_Alltoall") : (out ? "MPI_Iallgather" : "MPI_Allgather");
    auto post = [&](const std::byte* s, int send_count, MPI_Datatype send_type, std::byte* r, int recv_count,
                    MPI_Datatype recv_type) {
      if (out) {
        MPI_Request q = MPI_REQUEST_NULL;
        detail_mpi::check(to_all ? MPI_Ialltoall(s, send_count, send_type, r, recv_count, recv_type, ctx_->comm, &q)
                                 : MPI_Iallgather(s, send_count, send_type, r, recv_count, recv_type, ctx_->comm, &q),
                          call, op, rank());
        out->add(q, call);
      } else {
        detail_mpi::check(to_all ? MPI_Alltoall(s, send_count, send_type, r, recv_count, recv_type, ctx_->comm)
                                 : MPI_Allgather(s, send_count, send_type, r, recv_count, recv_type, ctx_->comm),
                          call, op, rank());
      }
    };
    if (block <= opts_.max_count_per_call) {
      const int n = static_cast<int>(block);
      post(send, n, MPI_BYTE, recv, n, MPI_BYTE);
      return;
    }
    detail_mpi::for_each_piece(block, opts_.max_count_per_call, [&](std::size_t off, int len) {
      detail_mpi::scoped_datatype slice;
      slice.make_strided_bytes(len, block, op, rank());
      if (to_all)
        post(send + off, 1, slice.get(), recv + off, 1, slice.get());
      else
        post(send + off, len, MPI_BYTE, recv + off, 1, slice.get());
    });
  }

  // ------------------------------------------------ host operations
  void start_all_reduce(float* data, std::size_t n, reduce_op op, pending* out) {
    begin(collective::all_reduce, n, static_cast<std::int64_t>(op), reduce_problem(op), out);
    account_all_reduce(n);
    post_sum(data, n, out);
    detail_mpi::completion then;
    if (op == reduce_op::mean) {
      then.divide = data;
      then.divide_count = n;
    }
    end(then, out, "all_reduce");
  }

  template <class T>
  void start_broadcast(collective c, T* data, std::size_t n, int root, pending* out) {
    begin(c, n, root, root_problem(c, root), out);
    account_broadcast(n * sizeof(T), root);
    post_broadcast(data, n, c == collective::broadcast_fp32 ? MPI_FLOAT : MPI_BYTE, sizeof(T), root, out);
    end({}, out, "broadcast");
  }

  void start_exchange(collective c, const std::byte* send, std::size_t send_bytes, std::byte* recv,
                      std::size_t recv_bytes, pending* out) {
    begin(c, send_bytes, 0, exchange_problem(c, send, send_bytes, recv, recv_bytes), out);
    const std::size_t block = c == collective::all_to_all ? send_bytes / static_cast<std::size_t>(size()) : send_bytes;
    account_exchange(block);
    post_exchange(c, send, recv, block, out);
    end({}, out, detail::name(c));
  }

  void start_barrier(pending* out) {
    begin(collective::barrier, 0, 0, {}, out);
    if (out) {
      MPI_Request r = MPI_REQUEST_NULL;
      detail_mpi::check(MPI_Ibarrier(ctx_->comm, &r), "MPI_Ibarrier", "barrier", rank());
      out->add(r, "MPI_Ibarrier");
    } else {
      detail_mpi::check(MPI_Barrier(ctx_->comm), "MPI_Barrier", "barrier", rank());
    }
  }

#if DILOCO_MPI_DEVICE_BUFFERS
  // ---------------------------------------------- device operations
  /// The pinned staging, made on first use.
  detail_mpi::pinned_staging& staging() {
    if (!ctx_->device) ctx_->device = std::make_unique<detail_mpi::pinned_device_support>();
    return static_cast<detail_mpi::pinned_device_support&>(*ctx_->device).staging;
  }

  /// A staging slot owned until handed to a completion.
  struct staged_slot {
    detail_mpi::pinned_staging& staging;
    int slot;
    ~staged_slot() {
      if (slot >= 0) staging.release(slot);
    }
    std::byte* data() const { return staging.data(slot); }
    int hand_over() { return std::exchange(slot, -1); }
  };

  staged_slot stage(std::size_t bytes, const char* operation) {
    auto& st = staging();
    return {st, st.acquire(bytes, operation, rank())};
  }

  void copy_to_host(void* host, const void* device, std::size_t bytes, const char* operation) const {
    if (bytes)
      detail_mpi::check_cuda(cudaMemcpy(host, device, bytes, cudaMemcpyDefault), "cudaMemcpy (device to host)",
                             operation, rank());
  }

  void start_device_all_reduce(device_view<float> buf, reduce_op op, pending* out) {
    const std::size_t n = buf.size();
    begin(collective::all_reduce, n, static_cast<std::int64_t>(op), reduce_problem(op), out);
    account_all_reduce(n);
    detail_mpi::completion then;
    if (direct_device_) {
      post_sum(buf.data(), n, out);
      if (op == reduce_op::mean) {
        then.device_divide = buf.data();
        then.device_divide_count = n;
      }
    } else {
      auto s = stage(n * sizeof(float), "all_reduce");
      auto* host = reinterpret_cast<float*>(s.data());
      copy_to_host(host, buf.data(), n * sizeof(float), "all_reduce");
      post_sum(host, n, out);
      if (op == reduce_op::mean) {
        then.divide = host;
        then.divide_count = n;
      }
      then.copy_to = buf.data();
      then.copy_bytes = n * sizeof(float);
      then.slot = s.hand_over();
    }
    end(then, out, "all_reduce");
  }

  template <class T>
  void start_device_broadcast(collective c, T* data, std::size_t n, int root, pending* out) {
    begin(c, n, root, root_problem(c, root), out);
    const std::size_t bytes = n * sizeof(T);
    account_broadcast(bytes, root);
    const MPI_Datatype type = c == collective::broadcast_fp32 ? MPI_FLOAT : MPI_BYTE;
    detail_mpi::completion then;
    if (direct_device_) {
      post_broadcast(data, n, type, sizeof(T), root, out);
    } else {
      auto s = stage(bytes, "broadcast");
      if (rank() == root) copy_to_host(s.data(), data, bytes, "broadcast");
      post_broadcast(s.data(), n, type, sizeof(T), root, out);
      if (rank() != root) {
        then.copy_to = data;
        then.copy_bytes = bytes;
      }
      then.slot = s.hand_over();
    }
    end(then, out, "broadcast");
  }

  void start_device_exchange(collective c, device_view<const std::byte> send, device_view<std::byte> recv,
                             pending* out) {
    begin(c, send.size(), 0, exchange_problem(c, send.data(), send.size(), recv.data(), recv.size()), out);
    const std::size_t block =
        c == collective::all_to_all ? send.size() / static_cast<std::size_t>(size()) : send.size();
    account_exchange(block);
    const char* op = detail::name(c);
    detail_mpi::completion then;
    if (direct_device_) {
      post_exchange(c, send.data(), recv.data(), block, out);
    } else {
      // One slot holds both sides: send first, then recv.
      auto s = stage(send.size() + recv.size(), op);
      copy_to_host(s.data(), send.data(), send.size(), op);
      post_exchange(c, s.data(), s.data() + send.size(), block, out);
      then.copy_to = recv.data();
      then.copy_offset = send.size();
      then.copy_bytes = recv.size();
      then.slot = s.hand_over();
    }
    end(then, out, op);
  }
#endif

  // ------------------------------------------------ traffic accounting
  /// The models shared by every communicator (core/comm_types.hpp), whatever
  /// algorithm MPI picks.
  void account_all_reduce(std::size_t n) { traffic_.add_all_reduce(n * sizeof(float), size()); }
  void account_broadcast(std::size_t bytes, int root) { traffic_.add_broadcast(bytes, rank(), root, size()); }
  void account_exchange(std::size_t block) { traffic_.add_exchange(block, size()); }

  options opts_;
  int workers_on_host_ = 1;
  std::shared_ptr<detail_mpi::context> ctx_;
  traffic_counters traffic_{};
  bool direct_device_ = false;
};

static_assert(communicator<mpi>);
#if DILOCO_MPI_DEVICE_BUFFERS
static_assert(device_communicator<mpi>);
#endif

}  // namespace diloco::comm
