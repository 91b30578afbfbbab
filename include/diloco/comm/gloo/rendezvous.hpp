#pragma once

// How the processes of a comm::gloo world find each other: each registers
// in the store, waits (within the timeout) until every rank has registered
// with the same world size, then Gloo connects every pair over TCP. Last,
// the ranks learn how each other's ends of their connections are
// addressed, so that a failure Gloo reports by address is reported by rank.

#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>

#include "diloco/comm/gloo/options.hpp"
#include "diloco/comm/gloo/store.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm::detail_gloo {

// A socket address ("[127.0.0.1]:port", as Gloo writes it) by which a
// rank's connection to this one may appear in Gloo's messages.
struct peer_alias {
  int rank = 0;
  std::string address{};
};

struct connection {
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  std::vector<peer_alias> peers;
};

// The rank whose address appears in a Gloo message, if any.
inline std::optional<int> rank_named_in(std::string_view message, const std::vector<peer_alias>& peers) {
  for (const auto& [rank, a] : peers) {
    if (a.empty()) continue;
    for (auto pos = message.find(a); pos != std::string_view::npos; pos = message.find(a, pos + 1)) {
      const auto end = pos + a.size();
      // "[h]:1234" must not match the start of "[h]:12345".
      if (end == message.size() || message[end] < '0' || message[end] > '9') return rank;
    }
  }
  return std::nullopt;
}

inline std::string join_key(int rank) { return "diloco_join_" + std::to_string(rank); }
inline std::string peers_key(int rank) { return "diloco_peers_" + std::to_string(rank); }

inline std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// Whether a network interface of that name has an IP address.
inline bool has_interface(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next)
    found = i->ifa_addr != nullptr && name == i->ifa_name &&
            (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6);
  freeifaddrs(list);
  return found;
}

// Registers this rank and waits until all have, checking that they agree on
// the world size. Throws comm_error naming the ranks that did not come.
inline void join(rendezvous_store& rs, const options& o, const std::string& where) {
  using clock = std::chrono::steady_clock;
  const auto deadline = diloco::detail::deadline_after<clock>(o.timeout);
  auto& kv = rs.store();
  try {
    const std::string mine = join_key(o.rank);
    auto taken = [&] {
      diloco::detail::raise<comm_error>(where, ": the store already holds a registration for rank ", o.rank,
                                        ": another process was started as rank ", o.rank,
                                        ", or an earlier run used the same run id (give each run its own "
                                        "DILOCO_RUN_ID, or clear the store)");
    };
    if (rs.has({mine})) taken();
    const std::string payload =
        diloco::detail::concat(o.size, " ", host_name(), " pid ", static_cast<long long>(getpid()));
    try {
      kv.set(mine, std::vector<char>(payload.begin(), payload.end()));
    } catch (const std::exception&) {
      // Two processes registering as one rank at the same moment: Gloo's
      // stores fail the second write in their own words.
      if (rs.has({mine})) taken();
      throw;
    }

    std::vector<char> seen(static_cast<std::size_t>(o.size), 0);
    seen[static_cast<std::size_t>(o.rank)] = 1;
    for (;;) {
      std::string missing;
      for (int k = 0; k < o.size; ++k) {
        if (seen[static_cast<std::size_t>(k)]) continue;
        const std::string key = join_key(k);
        if (!rs.has({key})) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(k);
          continue;
        }
        const std::vector<char> v = kv.get(key);
        const std::string text(v.begin(), v.end());
        const std::string their_size = text.substr(0, text.find(' '));
        if (their_size != std::to_string(o.size))
          diloco::detail::raise<comm_error>(where, ": rank ", k, " (", text.substr(text.find(' ') + 1),
                                            ") was started with world size ", their_size, ", this rank with ",
                                            o.size, "; every process must be given the same world size");
        seen[static_cast<std::size_t>(k)] = 1;
      }
      if (missing.empty()) return;
      if (clock::now() >= deadline)
        diloco::detail::raise<comm_error>(where, ": timed out after ", o.timeout.count(),
                                          " ms waiting for rank(s) ", missing,
                                          " to join; were all processes started, with the same store and run id?");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const diloco::error&) {
    throw;
  } catch (const std::exception& e) {
    diloco::detail::raise<comm_error>(where, ": the store failed while the ranks were joining: ", e.what());
  }
}

// Gloo names a connection's peer by the address its pair holds: the
// peer's end of the connected socket, or, when the connection was accepted
// before Gloo read the peer's address from the store, the address the peer
// listened on for this pair. Each rank publishes the first; the second is
// in Gloo's own record of the rendezvous (the 2022 Gloo keys it by the rank
// and stores one address per peer; other layouts are skipped).
inline std::vector<peer_alias> learn_peer_addresses(rendezvous_store& rs, const options& o,
                                                    ::gloo::Context& context, const std::string& where) {
  std::string mine;
  for (int k = 0; k < o.size; ++k) {
    if (k != o.rank) mine += context.getPair(k)->address().str();
    mine += '\n';
  }
  std::vector<peer_alias> peers;
  try {
    rs.store().set(peers_key(o.rank), std::vector<char>(mine.begin(), mine.end()));
    for (int k = 0; k < o.size; ++k) {
      if (k == o.rank) continue;
      const std::vector<char> v = rs.store().get(peers_key(k));
      std::vector<std::string> lines(1);
      for (char ch : v) {
        if (ch == '\n')
          lines.emplace_back();
        else
          lines.back() += ch;
      }
      if (lines.size() != static_cast<std::size_t>(o.size) + 1)
        diloco::detail::raise<comm_error>(where, ": rank ", k, " published ", lines.size() - 1,
                                          " connection addresses, expected ", o.size);
      peers.push_back({k, lines[static_cast<std::size_t>(o.rank)]});

      const std::string gloo_key = std::to_string(k);
      if (!rs.has({gloo_key})) continue;
      const std::vector<char> all = rs.store().get(gloo_key);
      const std::size_t one = context.getPair(k)->address().bytes().size();
      if (all.size() != one * static_cast<std::size_t>(o.size - 1)) continue;
      const auto index = static_cast<std::ptrdiff_t>(o.rank > k ? o.rank - 1 : o.rank);
      const auto first = all.begin() + index * static_cast<std::ptrdiff_t>(one);
      const std::vector<char> listened(first, first + static_cast<std::ptrdiff_t>(one));
      peers.push_back({k, ::gloo::transport::tcp::Address(listened).str()});
    }
  } catch (const diloco::error&) {
    throw;
  } catch (const std::exception& e) {
    diloco::detail::raise<comm_error>(where, ": exchanging connection addresses failed: ", e.what());
  }
  return peers;
}

// How many communicators this process has created before this one for the
// same store, run id and rank. The k-th communicator of each rank joins the
// k-th of the others under keys of its own, so a program may create several
// in turn, as long as every rank creates them in the same order (and a
// process may play several ranks, one per thread).
inline int next_generation(const options& o) {
  static std::mutex mutex;
  static std::map<std::string, int> created;
  std::lock_guard lock(mutex);
  return created[diloco::detail::concat(describe(o.rendezvous), "\n", o.run_id, "\n", o.rank)]++;
}

// The whole rendezvous. Call it with SIGPIPE blocked (sigpipe_guard): the
// transport device starts Gloo's event-loop thread, which keeps that mask.
inline connection rendezvous(const options& o) {
  const std::string where = diloco::detail::concat("comm::gloo rendezvous on rank ", o.rank, " of ", o.size,
                                                   " (run id '", o.run_id, "', store ", describe(o.rendezvous), ")");
  connection c;
  if (o.iface.empty()) {
    // The 2022 Gloo takes only -1 from getaddrinfo as failure and then walks
    // an unset result list: a name that does not resolve must stop here.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rv = getaddrinfo(o.hostname.c_str(), nullptr, &hints, &found); rv != 0)
      diloco::detail::raise<config_error>(where, ": cannot listen on hostname '", o.hostname, "': ", gai_strerror(rv));
    freeaddrinfo(found);
  } else if (!has_interface(o.iface)) {
    // Checked here too: Gloo leaks its interface list when it throws.
    diloco::detail::raise<config_error>(where, ": cannot listen on interface '", o.iface,
                                        "': no such interface with an IPv4 or IPv6 address");
  }
  try {
    ::gloo::transport::tcp::attr a;
    if (!o.iface.empty())
      a.iface = o.iface;
    else
      a.hostname = o.hostname;
    c.device = ::gloo::transport::tcp::CreateDevice(a);
  } catch (const std::exception& e) {
    diloco::detail::raise<config_error>(where, ": cannot listen on ",
                                        o.iface.empty() ? "hostname '" + o.hostname : "interface '" + o.iface,
                                        "': ", e.what());
  }

  rendezvous_store rs(o, next_generation(o), where);
  join(rs, o, where);

  try {
    c.context = std::make_shared<::gloo::rendezvous::Context>(o.rank, o.size);
    c.context->setTimeout(gloo_wait(o.timeout));
    c.context->connectFullMesh(rs.store(), c.device);
  } catch (const std::exception& e) {
    diloco::detail::raise<comm_error>(where, ": connecting to the other ranks failed: ", e.what());
  }
  c.peers = learn_peer_addresses(rs, o, *c.context, where);
  return c;
}

}  // namespace diloco::comm::detail_gloo
