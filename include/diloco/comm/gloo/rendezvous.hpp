// SPDX-License-Identifier: Apache-2.0
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

#include <algorithm>
#include <chrono>
#include <condition_variable>
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

#include "diloco/comm/detail/batch_policy.hpp"
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
  // The run's store, kept for the failure notes (see failure_key).
  std::unique_ptr<rendezvous_store> store;
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
// Set by rank `from` once its connection to rank `to` is made.
inline std::string link_key(int from, int to) {
  return "diloco_link_" + std::to_string(from) + "_" + std::to_string(to);
}

// Set once by a rank whose communicator failed, before it closes its
// connections: the rank its failure points at ("-1" when it does not know,
// e.g. it timed out). A rank that sees a connection closed by a live peer
// follows the notes to the rank that failed first.
inline std::string failure_key(int rank) { return "diloco_failed_" + std::to_string(rank); }

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

using startup_clock = std::chrono::steady_clock;

// "rank 2" or "ranks 1, 3".
inline std::string ranks_phrase(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Sleeps a poll interval, never past the deadline.
inline void poll_pause(startup_clock::time_point deadline) {
  const auto step = std::chrono::milliseconds(5);
  const auto now = startup_clock::now();
  if (deadline - now > step)
    std::this_thread::sleep_for(step);
  else if (deadline > now)
    std::this_thread::sleep_until(deadline);
}

// Polls the store (a non-blocking check, never Gloo's wait, which rounds
// its timeout down to whole seconds) until `key(k)` is set for every rank
// k in `ranks` or the deadline passes. Returns the values, by rank, and the
// ranks still missing (empty when all came). `once`: look once, no waiting.
template <class Key>
std::vector<int> poll_keys(rendezvous_store& rs, const std::vector<int>& ranks, Key key,
                           startup_clock::time_point deadline, std::vector<std::vector<char>>& values,
                           bool once = false) {
  std::vector<int> missing = ranks;
  for (;;) {
    // A request to a Redis store gets what is left of the start-up (at
    // least 50 ms, so that the last look can still be answered).
    if (deadline != startup_clock::time_point::max())
      rs.limit_requests(std::max(std::chrono::milliseconds(50),
                                 std::chrono::ceil<std::chrono::milliseconds>(deadline - startup_clock::now())));
    std::vector<int> still;
    for (int k : missing) {
      if (rs.has({key(k)}))
        values[static_cast<std::size_t>(k)] = rs.store().get(key(k));
      else
        still.push_back(k);
    }
    missing = std::move(still);
    if (missing.empty() || once || startup_clock::now() >= deadline) return missing;
    poll_pause(deadline);
  }
}

// Registers this rank and waits until all have, checking that they agree on
// the world size. Throws comm_error naming the ranks that did not come.
// Returns each rank's host name.
inline std::vector<std::string> join(rendezvous_store& rs, const options& o, startup_clock::time_point deadline,
                                     const std::string& where) {
  std::vector<std::string> hosts(static_cast<std::size_t>(o.size));
  try {
    const std::string mine = join_key(o.rank);
    auto taken = [&] {
      diloco::detail::raise<comm_error>(where, ": the store already holds a registration for rank ", o.rank,
                                        ": another process was started as rank ", o.rank,
                                        ", or an earlier run used the same run id (give each run its own "
                                        "DILOCO_RUN_ID, or clear the store)");
    };
    if (rs.has({mine})) taken();
    hosts[static_cast<std::size_t>(o.rank)] = host_name();
    const std::string payload =
        diloco::detail::concat(o.size, " ", hosts[static_cast<std::size_t>(o.rank)], " pid ",
                               static_cast<long long>(getpid()));
    // Created, not set: of two processes registering as one rank at the
    // same moment (both past the check above), exactly one creates the key
    // and the other is told. Gloo's FileStore::set checks and then renames
    // over, so both could succeed and then wait for a rank that never comes.
    if (!rs.create(mine, std::vector<char>(payload.begin(), payload.end()))) taken();

    std::vector<int> others;
    for (int k = 0; k < o.size; ++k)
      if (k != o.rank) others.push_back(k);
    std::vector<std::vector<char>> seen(static_cast<std::size_t>(o.size));
    for (;;) {
      std::vector<int> missing = poll_keys(rs, others, join_key, deadline, seen, true);
      // Check the registrations that came before waiting on for the rest.
      for (int k : others) {
        const auto& v = seen[static_cast<std::size_t>(k)];
        if (v.empty() || !hosts[static_cast<std::size_t>(k)].empty()) continue;
        const std::string text(v.begin(), v.end());
        const std::string their_size = text.substr(0, text.find(' '));
        if (their_size != std::to_string(o.size))
          diloco::detail::raise<comm_error>(where, ": rank ", k, " (", text.substr(text.find(' ') + 1),
                                            ") was started with world size ", their_size, ", this rank with ",
                                            o.size, "; every process must be given the same world size");
        const auto host_begin = text.find(' ') + 1;
        hosts[static_cast<std::size_t>(k)] = text.substr(host_begin, text.find(' ', host_begin) - host_begin);
      }
      if (missing.empty()) return hosts;
      if (startup_clock::now() >= deadline) {
        std::string list;
        for (int k : missing) list += (list.empty() ? "" : ", ") + std::to_string(k);
        diloco::detail::raise<comm_error>(where, ": timed out after ", o.timeout.count(),
                                          " ms waiting for rank(s) ", list,
                                          " to join; were all processes started, with the same store and run id?");
      }
      others = std::move(missing);
      poll_pause(deadline);
    }
  } catch (const diloco::error&) {
    throw;
  } catch (const std::exception& e) {
    diloco::detail::raise<comm_error>(where, ": the store failed while the ranks were joining: ", e.what());
  }
}

// The key under which a rank publishes the addresses its pairs listen on:
// Gloo's own layout (the key is the rank; the value is the address of its
// pair for every other rank, in rank order, each Address::bytes() long).
inline std::string address_key(int rank) { return std::to_string(rank); }

// Rank `to`'s address in the list published by rank `from`.
inline std::vector<char> address_for(const std::vector<char>& list, int from, int to, std::size_t one) {
  const auto index = static_cast<std::ptrdiff_t>(to > from ? to - 1 : to);
  const auto first = list.begin() + index * static_cast<std::ptrdiff_t>(one);
  return {first, first + static_cast<std::ptrdiff_t>(one)};
}

// Gloo's rendezvous context, connected by connect_mesh rather than by
// Gloo's connectFullMesh.
class mesh_context final : public ::gloo::rendezvous::Context {
 public:
  using ::gloo::rendezvous::Context::Context;
  void adopt(std::shared_ptr<::gloo::transport::Device> device,
             std::shared_ptr<::gloo::transport::Context> pairs) {
    device_ = std::move(device);
    transportContext_ = std::move(pairs);
  }
};

// Connects every pair of ranks over TCP, as Gloo's connectFullMesh does,
// but within the start-up deadline and naming the rank that did not
// connect. Gloo's Pair::connect waits five times the pair's timeout for the
// first connection and names only an address, and connectFullMesh connects
// the pairs one after another, so a rank waiting on a live peer that is
// itself waiting on a dead one would blame the live one. Here each pair
// connects on a thread of its own; at the deadline the pairs still
// connecting are closed (which ends Gloo's wait) and their ranks named.
// Returns every rank's published address list (for learn_peer_addresses).
inline std::vector<std::vector<char>> connect_mesh(mesh_context& context, rendezvous_store& rs, const options& o,
                                                   const std::shared_ptr<::gloo::transport::Device>& device,
                                                   const std::vector<std::string>& hosts,
                                                   startup_clock::time_point deadline, const std::string& where) {
  const auto n = static_cast<std::size_t>(o.size);
  const std::string within = diloco::detail::concat(" within ", diloco::detail::describe_timeout(o.timeout));
  std::shared_ptr<::gloo::transport::Context> pairs;
  std::vector<std::vector<char>> lists(n);
  std::vector<int> others;
  std::size_t one = 0;
  try {
    pairs = device->createContext(o.rank, o.size);
    pairs->setTimeout(gloo_wait(o.timeout));
    // As Gloo: the local rank counts the lower ranks on this host.
    int local_rank = 0;
    for (int k = 0; k < o.rank; ++k)
      if (hosts[static_cast<std::size_t>(k)] == hosts[static_cast<std::size_t>(o.rank)]) ++local_rank;
    std::vector<char> mine;
    for (int k = 0; k < o.size; ++k) {
      if (k == o.rank) continue;
      others.push_back(k);
      auto& pair = pairs->createPair(k);
      pair->setLocalRank(local_rank);
      const std::vector<char> bytes = pair->address().bytes();
      one = bytes.size();
      mine.insert(mine.end(), bytes.begin(), bytes.end());
    }
    rs.store().set(address_key(o.rank), mine);
    lists[static_cast<std::size_t>(o.rank)] = std::move(mine);
    const std::vector<int> missing = poll_keys(rs, others, address_key, deadline, lists);
    if (!missing.empty())
      diloco::detail::raise<comm_error>(where, ": ", ranks_phrase(missing), " did not connect", within,
                                        " (registered, but never published the addresses to connect to)");
    for (int k : others)
      if (lists[static_cast<std::size_t>(k)].size() != one * (n - 1))
        diloco::detail::raise<comm_error>(where, ": rank ", k, " published ",
                                          lists[static_cast<std::size_t>(k)].size(),
                                          " bytes of connection addresses, expected ", one * (n - 1));
  } catch (const diloco::error&) {
    throw;
  } catch (const std::exception& e) {
    diloco::detail::raise<comm_error>(where, ": preparing the connections to the other ranks failed: ", e.what());
  }

  enum class outcome { pending, connected, failed, expired };
  struct result {
    outcome state = outcome::pending;
    std::string why{};
  };
  std::mutex m;
  std::condition_variable cv;
  std::vector<result> results(n);
  std::size_t running = 0;
  std::vector<std::thread> threads;
  threads.reserve(others.size());
  std::string cannot_start;
  for (int k : others) {
    auto connect_one = [&, k] {
      const std::vector<char> peer = address_for(lists[static_cast<std::size_t>(k)], k, o.rank, one);
      std::string why;
      try {
        pairs->getPair(k)->connect(peer);
      } catch (const std::exception& e) {
        why = e.what();
        if (why.empty()) why = "Gloo raised an error";
      } catch (...) {
        why = "Gloo raised an unknown exception";
      }
      std::lock_guard lock(m);
      auto& r = results[static_cast<std::size_t>(k)];
      if (r.state == outcome::pending) {
        r.state = why.empty() ? outcome::connected : outcome::failed;
        r.why = std::move(why);
      }
      --running;
      cv.notify_all();
    };
    try {
      std::lock_guard lock(m);
      threads.emplace_back(connect_one);
      ++running;
    } catch (const std::exception& e) {
      cannot_start = e.what();
      break;
    }
  }

  // Wait for every pair or the deadline, then end the waits still going.
  // Each pair that connects is announced in the store (from this thread
  // only: a Redis connection is not for several threads), so that a rank
  // left waiting for this one can tell whom this one was waiting for.
  std::vector<int> expired;
  std::vector<char> announced(n, 0);
  std::string store_failure;
  {
    std::unique_lock lock(m);
    for (;;) {
      std::vector<int> fresh;
      for (int k : others)
        if (results[static_cast<std::size_t>(k)].state == outcome::connected && !announced[static_cast<std::size_t>(k)]) {
          announced[static_cast<std::size_t>(k)] = 1;
          fresh.push_back(k);
        }
      if (!fresh.empty() && store_failure.empty()) {
        lock.unlock();
        try {
          if (deadline != startup_clock::time_point::max())
            rs.limit_requests(std::max(std::chrono::milliseconds(50), std::chrono::ceil<std::chrono::milliseconds>(
                                                                          deadline - startup_clock::now())));
          for (int k : fresh) rs.store().set(link_key(o.rank, k), std::vector<char>{'1'});
        } catch (const std::exception& e) {
          store_failure = e.what();
        }
        lock.lock();
        continue;
      }
      if (running == 0 || !cannot_start.empty()) break;
      if (deadline == startup_clock::time_point::max())
        cv.wait(lock);
      else if (cv.wait_until(lock, deadline) == std::cv_status::timeout && startup_clock::now() >= deadline)
        break;
    }
    for (int k : others)
      if (results[static_cast<std::size_t>(k)].state == outcome::pending) {
        results[static_cast<std::size_t>(k)].state = outcome::expired;
        expired.push_back(k);
      }
  }
  for (int k : expired) {
    try {
      pairs->getPair(k)->close();
    } catch (...) {
      // The thread ends either way: closing wakes Gloo's wait.
    }
  }
  for (auto& t : threads) t.join();

  if (!cannot_start.empty())
    diloco::detail::raise<comm_error>(where, ": cannot start a thread to connect to the other ranks: ", cannot_start);
  std::string problems;
  if (!expired.empty())
    problems = diloco::detail::concat(ranks_phrase(expired), " did not connect", within);
  for (int k : others) {
    const auto& r = results[static_cast<std::size_t>(k)];
    if (r.state != outcome::failed) continue;
    problems += diloco::detail::concat(problems.empty() ? "" : "; ", "the connection to rank ", k,
                                       " failed (has it died?): ", r.why);
  }
  if (!problems.empty()) diloco::detail::raise<comm_error>(where, ": ", problems);
  if (!store_failure.empty())
    diloco::detail::raise<comm_error>(where, ": the store failed while the ranks were connecting: ", store_failure);
  context.adopt(device, std::move(pairs));
  return lists;
}

// Gloo names a connection's peer by the address its pair holds: the
// peer's end of the connected socket, or, when the connection was accepted
// before Gloo read the peer's address from the store, the address the peer
// listened on for this pair. Each rank publishes the first; the second is
// in the address lists of the rendezvous (`lists`, from connect_mesh).
inline std::vector<peer_alias> learn_peer_addresses(rendezvous_store& rs, const options& o,
                                                    ::gloo::Context& context,
                                                    const std::vector<std::vector<char>>& lists,
                                                    startup_clock::time_point deadline, const std::string& where) {
  std::string mine;
  for (int k = 0; k < o.size; ++k) {
    if (k != o.rank) mine += context.getPair(k)->address().str();
    mine += '\n';
  }
  std::vector<peer_alias> peers;
  try {
    rs.store().set(peers_key(o.rank), std::vector<char>(mine.begin(), mine.end()));
    std::vector<int> others;
    for (int k = 0; k < o.size; ++k)
      if (k != o.rank) others.push_back(k);
    std::vector<std::vector<char>> published(static_cast<std::size_t>(o.size));
    const std::vector<int> missing = poll_keys(rs, others, peers_key, deadline, published);
    if (!missing.empty()) {
      // A rank that has not confirmed may itself be waiting for another
      // that has not: blame those that did not connect to a rank that
      // finished (this one, at least), not those waiting on the others.
      std::vector<int> stalled;
      for (int k : missing) {
        bool lacks = false;
        for (int j = 0; j < o.size && !lacks; ++j)
          lacks = j != k && std::find(missing.begin(), missing.end(), j) == missing.end() && !rs.has({link_key(k, j)});
        if (lacks) stalled.push_back(k);
      }
      const std::string within = " within " + diloco::detail::describe_timeout(o.timeout);
      if (stalled.empty())
        diloco::detail::raise<comm_error>(where, ": ", ranks_phrase(missing), " did not finish connecting", within,
                                          "; which of them stalled is not known (each was waiting for another)");
      std::vector<int> waiting;
      for (int k : missing)
        if (std::find(stalled.begin(), stalled.end(), k) == stalled.end()) waiting.push_back(k);
      diloco::detail::raise<comm_error>(where, ": ", ranks_phrase(stalled), " did not connect", within,
                                        waiting.empty() ? std::string()
                                                        : " (" + ranks_phrase(waiting) + " waited for it in turn)");
    }
    for (int k : others) {
      const std::vector<char>& v = published[static_cast<std::size_t>(k)];
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

      const std::vector<char>& all = lists[static_cast<std::size_t>(k)];
      const std::size_t one = context.getPair(k)->address().bytes().size();
      if (all.size() != one * static_cast<std::size_t>(o.size - 1)) continue;
      peers.push_back({k, ::gloo::transport::tcp::Address(address_for(all, k, o.rank, one)).str()});
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
// `scope`: the store's key scope for this world (an elastic group's
// generation); by default, this process's count of communicators.
inline connection rendezvous(const options& o, const std::string& scope = {}) {
  // One deadline for the whole start-up: joining, connecting and the
  // exchange of addresses together take at most the timeout.
  const auto deadline = diloco::detail::deadline_after<startup_clock>(o.timeout);
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
    // The device starts Gloo's event loop, which inherits this thread's
    // scheduling policy (comm/detail/batch_policy.hpp).
    const diloco::comm::detail::scoped_batch_policy batch(o.batch_scheduling);
    c.device = ::gloo::transport::tcp::CreateDevice(a);
  } catch (const std::exception& e) {
    diloco::detail::raise<config_error>(where, ": cannot listen on ",
                                        o.iface.empty() ? "hostname '" + o.hostname : "interface '" + o.iface,
                                        "': ", e.what());
  }

  c.store = scope.empty() ? std::make_unique<rendezvous_store>(o, next_generation(o), where)
                          : std::make_unique<rendezvous_store>(o, scope, where);
  rendezvous_store& rs = *c.store;
  const std::vector<std::string> hosts = join(rs, o, deadline, where);
  auto context = std::make_shared<mesh_context>(o.rank, o.size);
  context->setTimeout(gloo_wait(o.timeout));
  const auto lists = connect_mesh(*context, rs, o, c.device, hosts, deadline, where);
  c.context = context;
  c.peers = learn_peer_addresses(rs, o, *c.context, lists, deadline, where);
  // From now on a request to a Redis store waits at most the timeout.
  rs.limit_requests(o.timeout);
  return c;
}

// ------------------------------------------------------ failure notes
// Publishes this rank's failure note (see failure_key); never throws.
inline void publish_failure(rendezvous_store& rs, int rank, std::optional<int> blamed) noexcept {
  try {
    const std::string text = std::to_string(blamed ? *blamed : -1);
    rs.limit_requests(std::chrono::milliseconds(500));
    if (!rs.has({failure_key(rank)})) rs.store().set(failure_key(rank), std::vector<char>(text.begin(), text.end()));
  } catch (...) {
    // A courtesy to the other ranks; the failure is reported regardless.
  }
}

// Rank k's failure note: nothing if it has none, else the rank it blamed
// (-1: not known). Throws if the store fails.
inline std::optional<int> failure_note(rendezvous_store& rs, int k) {
  if (!rs.has({failure_key(k)})) return std::nullopt;
  const std::vector<char> v = rs.store().get(failure_key(k));
  return std::stoi(std::string(v.begin(), v.end()));
}

// Whom to name for a failure of this rank whose Gloo message named rank
// `direct` (if any). The named peer may be alive: a rank that fails closes
// its connections (Gloo itself closes them all when a wait times out,
// before the note can be left). So the notes are followed from `direct`:
// a rank whose note blames another leads on to it; a rank without a note
// is the one that failed when another rank's note blames it too, or when
// it leaves none within the grace: " (connection to rank k)" if it is
// `direct`, else " (rank k failed; heard through rank j)". When the trail
// ends in a note that blames nobody (a timeout: a stalled rank makes its
// neighbours time out, and the others then fail within milliseconds), the
// ranks that have left no note by the end of the grace are named.
inline std::string name_culprit(rendezvous_store& rs, int self, int size, std::optional<int> direct,
                                std::chrono::milliseconds grace) try {
  const auto until = startup_clock::now() + grace;
  auto culprit = [&](int k) {
    if (k == *direct) return diloco::detail::concat(" (connection to rank ", k, ")");
    return diloco::detail::concat(" (rank ", k, " failed; heard through rank ", *direct, ")");
  };
  // Whether a rank other than this one and k blames k.
  auto witnessed = [&](int k) {
    for (int w = 0; w < size; ++w)
      if (w != self && w != k && failure_note(rs, w) == k) return true;
    return false;
  };
  if (direct) {
    std::vector<char> seen(static_cast<std::size_t>(size), 0);
    int at = *direct;
    for (;;) {
      seen[static_cast<std::size_t>(at)] = 1;
      std::optional<int> note = failure_note(rs, at);
      while (!note) {
        if (size == 2 || witnessed(at) || startup_clock::now() >= until) return culprit(at);
        poll_pause(until);
        note = failure_note(rs, at);
      }
      if (*note < 0 || *note >= size || *note == self || seen[static_cast<std::size_t>(*note)]) break;
      at = *note;
    }
  }
  std::vector<int> silent;
  for (;;) {
    silent.clear();
    for (int k = 0; k < size; ++k)
      if (k != self && !failure_note(rs, k)) silent.push_back(k);
    if (silent.empty() || startup_clock::now() >= until) break;
    poll_pause(until);
  }
  if (silent.empty())
    return direct ? diloco::detail::concat(" (connection to rank ", *direct, "; which rank failed first is not known)")
                  : std::string(" (which rank failed or stalled is not known)");
  return diloco::detail::concat(" (no word from ", ranks_phrase(silent), ": stalled or dead?)");
} catch (...) {
  // The store failed too: say what Gloo said.
  return direct ? diloco::detail::concat(" (connection to rank ", *direct, ")") : std::string();
}

}  // namespace diloco::comm::detail_gloo
