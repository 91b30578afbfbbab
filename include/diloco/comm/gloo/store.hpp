// SPDX-License-Identifier: Apache-2.0
#pragma once

// The rendezvous stores of comm::gloo, all of them Gloo's own:
// FileStore (a directory) or RedisStore (a Redis server), behind a
// PrefixStore keyed by the run id, behind a store that bounds every wait by
// the communicator's timeout.

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

#include <gloo/config.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>

// RedisStore is compiled into libgloo when Gloo was built with
// GLOO_USE_REDIS (Debian's is); its header needs hiredis's, which Debian
// installs as <hiredis/hiredis.h>.
#if GLOO_USE_REDIS && __has_include(<hiredis.h>)
#include <gloo/rendezvous/redis_store.h>
#define DILOCO_GLOO_HAVE_REDIS 1
#elif GLOO_USE_REDIS && __has_include(<hiredis/hiredis.h>)
#ifndef HIREDIS_NESTED_INCLUDE
#define HIREDIS_NESTED_INCLUDE 1
#endif
#include <gloo/rendezvous/redis_store.h>
#define DILOCO_GLOO_HAVE_REDIS 1
#else
#define DILOCO_GLOO_HAVE_REDIS 0
#endif

#include "diloco/comm/gloo/options.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm::detail_gloo {

// "" if a TCP connection to host:port opens within `timeout`, else why not.
// Checked before Gloo's RedisStore connects: when that fails, its
// constructor throws without freeing its hiredis context.
inline std::string tcp_unreachable(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rv = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rv != 0)
    return gai_strerror(rv);
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int ready = poll(&p, 1, static_cast<int>(std::min<long long>(timeout.count(), 1 << 30)));
        socklen_t len = sizeof err;
        if (ready == 1)
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        else
          err = ETIMEDOUT;
      }
    }
    close(fd);
    if (err == 0) {
      freeaddrinfo(found);
      return {};
    }
    why = std::strerror(err);
  }
  freeaddrinfo(found);
  return why;
}

// Exposes FileStore's key check, which Gloo keeps protected.
class file_backend final : public ::gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::vector<std::string>& keys) { return check(keys); }
  // Sets `key` unless it is set: false if it was. Atomic, unlike
  // FileStore::set (which checks, then renames over): the value is written
  // to a private file, then hard-linked to the key's name, which fails if
  // that name exists.
  bool create(const std::string& key, const std::vector<char>& data) {
    static std::atomic<unsigned> counter{0};
    const std::string tmp = diloco::detail::concat(tmpPath(key), ".", static_cast<long long>(getpid()), ".", counter++);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    const int rv = ::link(tmp.c_str(), objectPath(key).c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (rv == 0) return true;
    if (err == EEXIST) return false;
    throw std::runtime_error(diloco::detail::concat("cannot link ", objectPath(key), ": ", std::strerror(err)));
  }
};

#if DILOCO_GLOO_HAVE_REDIS
class redis_backend final : public ::gloo::rendezvous::RedisStore {
 public:
  // hiredis waits for a reply without limit: a server that stops answering
  // would hang every rank. A socket timeout turns that into an error.
  redis_backend(const std::string& host, int port, std::chrono::milliseconds timeout) : RedisStore(host, port) {
    if (!diloco::detail::unbounded(timeout)) limit(timeout);
  }
  bool has(const std::vector<std::string>& keys) { return check(keys); }
  // Sets `key` unless it is set: false if it was. Gloo's RedisStore::set
  // is a SETNX that throws when the key exists.
  bool create(const std::string& key, const std::vector<char>& data) {
    try {
      set(key, data);
      return true;
    } catch (const std::exception&) {
      if (check({key})) return false;
      throw;
    }
  }
  // Bounds each later send and reply by `timeout` (at least 1 ms).
  void limit(std::chrono::milliseconds timeout) {
    const long long ms = std::max<long long>(timeout.count(), 1);
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms % 1000) * 1000);
    setsockopt(redis_->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(redis_->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
};
#endif

// Exposes how PrefixStore spells a key, so that keys can be checked for
// on the backend without waiting.
class run_store final : public ::gloo::rendezvous::PrefixStore {
 public:
  using PrefixStore::PrefixStore;
  std::string full_key(const std::string& key) { return joinKey(key); }
};

// Forwards to another store with every wait bounded by `timeout`. Gloo's
// Store::get waits up to its own 30 s default before reading, and
// connectFullMesh calls it.
class bounded_store final : public ::gloo::rendezvous::Store {
 public:
  // no_timeout becomes Gloo's own "no timeout" for the store's waits.
  bounded_store(::gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
      : inner_(inner), timeout_(diloco::detail::unbounded(timeout) ? std::chrono::milliseconds::zero() : timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    // Gloo's zero means "no timeout"; ours is never lifted.
    inner_.wait(keys, timeout.count() == 0 || timeout_.count() == 0 ? std::max(timeout, timeout_)
                                                                     : std::min(timeout, timeout_));
  }

 private:
  ::gloo::rendezvous::Store& inner_;
  std::chrono::milliseconds timeout_;
};

// One run's view of the store: Gloo's store for this run (prefixed by the
// run id, waits bounded) and a non-blocking check for keys.
class rendezvous_store {
 public:
  // `generation` counts this process's earlier communicators of the run.
  rendezvous_store(const options& o, int generation, const std::string& where)
      : rendezvous_store(o, std::to_string(generation), where) {}
  // Keys under "diloco/<run id>/<scope>/".
  rendezvous_store(const options& o, const std::string& scope, const std::string& where) {
    if (const auto* f = std::get_if<file_store>(&o.rendezvous)) {
      std::error_code ec;
      std::filesystem::create_directories(f->directory, ec);
      if (ec || !std::filesystem::is_directory(f->directory))
        diloco::detail::raise<config_error>(where, ": cannot use '", f->directory,
                                            "' as the file store's directory: ",
                                            ec ? ec.message() : std::string("not a directory"));
      try {
        auto b = std::make_unique<file_backend>(f->directory);
        has_ = [p = b.get()](const std::vector<std::string>& keys) { return p->has(keys); };
        create_ = [p = b.get()](const std::string& k, const std::vector<char>& v) { return p->create(k, v); };
        backend_ = std::move(b);
      } catch (const std::exception& e) {
        diloco::detail::raise<config_error>(where, ": cannot open the file store: ", e.what());
      }
    } else {
#if DILOCO_GLOO_HAVE_REDIS
      const auto& r = std::get<redis_store>(o.rendezvous);
      if (const std::string why = tcp_unreachable(r.host, r.port, o.timeout); !why.empty())
        diloco::detail::raise<comm_error>(where, ": cannot reach the Redis store at ", r.host, ":", r.port, ": ", why);
      try {
        auto b = std::make_unique<redis_backend>(r.host, r.port, o.timeout);
        has_ = [p = b.get()](const std::vector<std::string>& keys) { return p->has(keys); };
        create_ = [p = b.get()](const std::string& k, const std::vector<char>& v) { return p->create(k, v); };
        if (!diloco::detail::unbounded(o.timeout))
          limit_ = [p = b.get(), t = o.timeout](std::chrono::milliseconds left) { p->limit(std::min(left, t)); };
        backend_ = std::move(b);
      } catch (const std::exception& e) {
        diloco::detail::raise<comm_error>(where, ": cannot reach the Redis store at ", r.host, ":", r.port, ": ",
                                          e.what());
      }
#else
      diloco::detail::raise<config_error>(where, ": this Gloo was built without Redis support (GLOO_USE_REDIS) or "
                                                 "hiredis headers are missing; use a file store");
#endif
    }
    run_ = std::make_unique<run_store>("diloco/" + o.run_id + "/" + scope, *backend_);
    bounded_ = std::make_unique<bounded_store>(*run_, o.timeout);
  }

  // The run's store, as Gloo's rendezvous takes it.
  ::gloo::rendezvous::Store& store() { return *bounded_; }
  // Bounds each request to the store that follows by `left` (or the
  // timeout, if less): a Redis server that stops answering near the end of
  // the start-up must not hold a rank a whole timeout past it. A file
  // store's requests do not wait.
  void limit_requests(std::chrono::milliseconds left) {
    if (limit_) limit_(left);
  }
  // Whether every key is set, without waiting.
  bool has(const std::vector<std::string>& keys) {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(run_->full_key(k));
    return has_(full);
  }
  // Sets `key` unless it is set, atomically: false if it was.
  bool create(const std::string& key, const std::vector<char>& value) { return create_(run_->full_key(key), value); }

 private:
  std::unique_ptr<::gloo::rendezvous::Store> backend_;
  std::function<bool(const std::vector<std::string>&)> has_;
  std::function<bool(const std::string&, const std::vector<char>&)> create_;
  std::function<void(std::chrono::milliseconds)> limit_;
  std::unique_ptr<run_store> run_;
  std::unique_ptr<bounded_store> bounded_;
};

}  // namespace diloco::comm::detail_gloo
