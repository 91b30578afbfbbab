// SPDX-License-Identifier: Apache-2.0
#pragma once

// Options of comm::gloo and the launch story's environment variables. Kept
// apart from the communicator so that parsing and validation need no Gloo.

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "diloco/core/error.hpp"
#include "diloco/core/timeout.hpp"

namespace diloco::comm::detail_gloo {

// Rendezvous through a directory every rank can reach (a local or shared
// file system): Gloo's FileStore. Created if missing.
struct file_store {
  std::string directory{};
};

// Rendezvous through a Redis server reachable by every rank: Gloo's
// RedisStore (needs a Gloo built with GLOO_USE_REDIS and hiredis headers).
struct redis_store {
  std::string host = "127.0.0.1";
  int port = 6379;
};

using store = std::variant<file_store, redis_store>;

struct options {
  int rank = -1;  // this process, in [0, size)
  int size = 0;   // processes in the world
  store rendezvous = file_store{};
  // Keys of this run in the store are prefixed by it, so a store can serve
  // successive runs; two runs with the same id in one store collide.
  std::string run_id = "diloco";
  // Address this process listens on and advertises to its peers. The
  // loopback default suits N processes on one machine.
  std::string hostname = "127.0.0.1";
  // Network interface to use instead of `hostname` (e.g. "eth0"), when set.
  std::string iface{};
  // Bound on every wait: rendezvous, each store access, each collective.
  // 1 ms to one year, or diloco::no_timeout (milliseconds::max()) for none.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Before each collective the ranks exchange its name, sizes and root (a
  // 32-byte all-gather), so that disagreeing calls fail on every rank with
  // comm_error instead of corrupting buffers or waiting for the timeout.
  bool check_arguments = true;
  // How many of the world's processes run on this host and share its cores
  // (like torchrun's LOCAL_WORLD_SIZE); the engine divides the host's
  // threads among them. 0: unknown, taken as 1.
  int local_world_size = 0;
  // Linux: the communicator's own threads (Gloo's event loop, which reads
  // and writes the sockets, and the progress thread that runs non-blocking
  // operations) run under SCHED_BATCH: a fair share of the core, but their
  // wake-ups do not preempt the thread that trains. On a core shared with
  // training they then work in batches at the scheduler's ticks instead of
  // interrupting the inner step for every packet (docs/performance.md, "Slow
  // links"); on a core of their own nothing changes. Best effort: where the
  // policy cannot be set they run as normal threads. False: normal threads.
  bool batch_scheduling = true;
  // Elastic membership: the group survives a dead or frozen peer (the
  // survivors abort the round in flight and form the next generation of the
  // group through the store), workers may leave between rounds, and a
  // process started again with the rank of one that died (or any process
  // started later) joins at a round end, taking the state from a live
  // member. `rank` and `size` are then those of the first generation; a
  // process whose rank already started once in this run joins instead.
  bool elastic = false;
  // Elastic: a group that would have fewer workers raises comm_error.
  int min_workers = 1;
  // Elastic: whether the members admit joiners at round ends.
  bool admit_joiners = true;
  // Elastic: how long a joiner waits for a round end to admit it.
  std::chrono::milliseconds join_timeout = std::chrono::minutes(10);
};

// The timeout handed to Gloo. Gloo has no "forever" for a collective (its
// zero means "none left" there) and adds the value to now(), so no_timeout
// becomes ten years, which neither overflows nor ends.
inline std::chrono::milliseconds gloo_wait(std::chrono::milliseconds t) {
  return diloco::detail::unbounded(t) ? std::chrono::milliseconds(std::chrono::hours(24 * 365 * 10)) : t;
}

// Redis ports are TCP ports.
inline constexpr int max_port = 65535;

inline std::string describe(const store& s) {
  if (const auto* f = std::get_if<file_store>(&s)) return "file://" + f->directory;
  const auto& r = std::get<redis_store>(s);
  return diloco::detail::concat("redis://", r.host, ":", r.port);
}

inline void validate(const options& o) {
  if (o.size < 1) diloco::detail::raise<config_error>("comm::gloo: size must be at least 1, got ", o.size);
  if (o.rank < 0 || o.rank >= o.size)
    diloco::detail::raise<config_error>("comm::gloo: rank ", o.rank, " is outside [0, ", o.size, ") for a world of ", o.size);
  if (o.timeout.count() <= 0)
    diloco::detail::raise<config_error>("comm::gloo: timeout must be positive, got ", o.timeout.count(), " ms");
  diloco::detail::check_timeout(o.timeout, "comm::gloo: timeout");
  if (o.run_id.empty()) diloco::detail::raise<config_error>("comm::gloo: run_id must not be empty");
  if (o.hostname.empty() && o.iface.empty())
    diloco::detail::raise<config_error>("comm::gloo: set a hostname (an address to listen on) or an interface name");
  if (const auto* f = std::get_if<file_store>(&o.rendezvous)) {
    if (f->directory.empty())
      diloco::detail::raise<config_error>("comm::gloo: the file store needs a directory every rank can reach");
  } else {
    const auto& r = std::get<redis_store>(o.rendezvous);
    if (r.host.empty()) diloco::detail::raise<config_error>("comm::gloo: the Redis store needs a host");
    if (r.port < 1 || r.port > max_port)
      diloco::detail::raise<config_error>("comm::gloo: Redis port ", r.port, " is outside [1, ", max_port, "]");
  }
  if (o.min_workers < 1 || (!o.elastic && o.min_workers != 1) || o.min_workers > o.size)
    diloco::detail::raise<config_error>("comm::gloo: min_workers is ", o.min_workers, "; expected 1 to the world size (",
                                        o.size, ") for an elastic group, 1 otherwise");
  diloco::detail::check_timeout(o.join_timeout, "comm::gloo: join_timeout");
}

// A decimal integer in [lo, hi] and nothing else; `what` names it in errors.
template <class Int>
Int parse_integer(std::string_view text, const char* what, Int lo, Int hi) {
  static_assert(std::is_integral_v<Int>);
  long long value = 0;
  bool ok = !text.empty();
  std::size_t i = 0;
  const bool negative = ok && text[0] == '-';
  if (negative || (ok && text[0] == '+')) i = 1;
  if (i == text.size()) ok = false;
  for (; ok && i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i])) || value > (std::numeric_limits<long long>::max() - 9) / 10) {
      ok = false;
      break;
    }
    value = value * 10 + (text[i] - '0');
  }
  if (negative) value = -value;
  if (!ok || value < static_cast<long long>(lo) || value > static_cast<long long>(hi))
    diloco::detail::raise<config_error>(what, " is '", text, "'; expected an integer in [", lo, ", ", hi, "]");
  return static_cast<Int>(value);
}

// "file:///absolute/dir" or "redis://host[:port]".
inline store parse_store(std::string_view url, const char* what = "the store URL") {
  constexpr std::string_view file_scheme = "file://", redis_scheme = "redis://";
  if (url.substr(0, file_scheme.size()) == file_scheme) {
    const std::string_view dir = url.substr(file_scheme.size());
    if (dir.empty() || dir[0] != '/')
      diloco::detail::raise<config_error>(what, " is '", url, "'; a file store is file:///absolute/directory");
    return file_store{std::string(dir)};
  }
  if (url.substr(0, redis_scheme.size()) == redis_scheme) {
    std::string_view rest = url.substr(redis_scheme.size());
    if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    redis_store r;
    const auto colon = rest.rfind(':');
    if (colon != std::string_view::npos) {
      r.port = parse_integer<int>(rest.substr(colon + 1), diloco::detail::concat(what, " port").c_str(), 1, max_port);
      rest = rest.substr(0, colon);
    }
    if (rest.empty()) diloco::detail::raise<config_error>(what, " is '", url, "'; a Redis store is redis://host[:port]");
    r.host = std::string(rest);
    return r;
  }
  diloco::detail::raise<config_error>(what, " is '", url,
                              "'; expected file:///absolute/directory or redis://host[:port]");
}

// The variables scripts/launch_gloo.sh sets, like torchrun's RANK,
// WORLD_SIZE and MASTER_ADDR.
inline constexpr const char* env_rank = "DILOCO_RANK";
inline constexpr const char* env_world_size = "DILOCO_WORLD_SIZE";
inline constexpr const char* env_store = "DILOCO_STORE";
inline constexpr const char* env_run_id = "DILOCO_RUN_ID";
inline constexpr const char* env_hostname = "DILOCO_HOSTNAME";
inline constexpr const char* env_iface = "DILOCO_IFACE";
inline constexpr const char* env_timeout_ms = "DILOCO_TIMEOUT_MS";
inline constexpr const char* env_local_world_size = "DILOCO_LOCAL_WORLD_SIZE";
inline constexpr const char* env_elastic = "DILOCO_ELASTIC";
inline constexpr const char* env_min_workers = "DILOCO_MIN_WORKERS";
inline constexpr const char* env_batch_scheduling = "DILOCO_BATCH_SCHEDULING";

// Options from the environment. Rank, world size and store are required;
// the others keep the defaults above when unset.
inline options options_from_env() {
  auto get = [](const char* name) -> const char* { return std::getenv(name); };
  auto required = [&](const char* name, const char* meaning) -> std::string_view {
    const char* v = get(name);
    if (v == nullptr || *v == '\0')
      diloco::detail::raise<config_error>("comm::gloo::from_env: ", name, " is not set; it must hold ", meaning,
                                  " (scripts/launch_gloo.sh sets it)");
    return v;
  };
  options o;
  o.size = parse_integer<int>(required(env_world_size, "the number of processes"), env_world_size, 1,
                              std::numeric_limits<int>::max());
  o.rank = parse_integer<int>(required(env_rank, "this process's rank"), env_rank, 0, o.size - 1);
  o.rendezvous = parse_store(required(env_store, "file:///shared/dir or redis://host:port"), env_store);
  if (const char* v = get(env_run_id)) {
    if (*v == '\0') diloco::detail::raise<config_error>(env_run_id, " is set but empty; unset it or give a run id");
    o.run_id = v;
  }
  if (const char* v = get(env_hostname); v && *v) o.hostname = v;
  if (const char* v = get(env_iface); v && *v) o.iface = v;
  if (const char* v = get(env_timeout_ms))
    o.timeout = diloco::detail::parse_timeout_ms(v, env_timeout_ms);
  if (const char* v = get(env_local_world_size); v && *v)
    o.local_world_size = parse_integer<int>(v, env_local_world_size, 1, o.size);
  if (const char* v = get(env_elastic); v && *v) o.elastic = parse_integer<int>(v, env_elastic, 0, 1) == 1;
  if (const char* v = get(env_min_workers); v && *v)
    o.min_workers = parse_integer<int>(v, env_min_workers, 1, o.size);
  if (const char* v = get(env_batch_scheduling); v && *v)
    o.batch_scheduling = parse_integer<int>(v, env_batch_scheduling, 0, 1) == 1;
  validate(o);
  return o;
}

}  // namespace diloco::comm::detail_gloo
