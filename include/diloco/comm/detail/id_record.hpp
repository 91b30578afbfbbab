// SPDX-License-Identifier: Apache-2.0
#pragma once

// A communicator id on its way from rank 0 to the others through a store
// the ranks share (NCCL's ncclUniqueId; the id of each generation's data
// communicator in comm::regrouped). Rank 0 makes the id (or fails to) and
// publishes a record; every other rank validates the record before use, so
// a stale, truncated or foreign value in a shared store is a format_error,
// and rank 0's failure reaches every rank with its reason instead of
// leaving them waiting. Needs no NCCL: the payload is bytes.
//
// Record layout (little-endian):
//   0   8 bytes  magic "DLNCCLID" (first used for NCCL's id)
//   8   u32      version (1)
//   12  u32      status: 0 = payload is the id, 1 = payload is rank 0's error
//   16  u32      payload length in bytes
//   20  payload
//   ..  u32      FNV-1a checksum of every byte before it

#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/core/error.hpp"
#include "diloco/core/timeout.hpp"

namespace diloco::comm {

/// A key-value store the ranks share, with gloo::rendezvous::Store's
/// interface: set a key, wait (with a timeout) until keys exist, get a key.
template <class S>
concept unique_id_store = requires(S& s, const std::string& key, const std::vector<char>& value,
                                   const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  { s.set(key, value) };
  { s.wait(keys, timeout) };
  { s.get(key) } -> std::convertible_to<std::vector<char>>;
};

namespace detail_id {

inline constexpr char record_magic[8] = {'D', 'L', 'N', 'C', 'C', 'L', 'I', 'D'};
inline constexpr std::uint32_t record_version = 1;
inline constexpr std::uint32_t status_id = 0;
inline constexpr std::uint32_t status_failure = 1;
inline constexpr std::size_t record_header_bytes = 20;
inline constexpr std::size_t max_failure_message = 400;
// Large enough for an NCCL id or a failure; the MPI bootstrap broadcasts
// this many bytes.
inline constexpr std::size_t record_capacity = 512;
static_assert(record_header_bytes + max_failure_message + 4 <= record_capacity);

inline std::uint32_t fnv1a(std::span<const char> bytes) {
  std::uint32_t h = 2166136261u;
  for (char c : bytes) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

inline void put_u32(std::vector<char>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

inline std::uint32_t get_u32(std::span<const char> bytes, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(bytes[at + i])) << (8 * i);
  return v;
}

inline std::vector<char> encode_record(std::uint32_t status, std::span<const char> payload) {
  std::vector<char> out(record_magic, record_magic + sizeof record_magic);
  put_u32(out, record_version);
  put_u32(out, status);
  put_u32(out, static_cast<std::uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  put_u32(out, fnv1a(out));
  return out;
}

// Rank 0 could not make the id: the record carries why (truncated).
inline std::vector<char> encode_failure(std::string_view message) {
  if (message.size() > max_failure_message) message = message.substr(0, max_failure_message);
  return encode_record(status_failure, std::span<const char>(message.data(), message.size()));
}

// A validated record: whether it carries an id or rank 0's failure, and
// the payload (a view into the bytes decoded).
struct record_view {
  bool failed = false;
  std::span<const char> payload{};
  std::string_view failure() const { return {payload.data(), payload.size()}; }
};

// Validates a record; `what` names the id and `source` where the bytes came
// from, for messages ("nccl unique id from store key 'k': bad magic ...").
// Trailing bytes after the checksum are allowed (the MPI bootstrap sends a
// fixed-size buffer). A failure record is returned, not thrown: what it
// means is the caller's.
inline record_view decode_record(std::span<const char> bytes, std::string_view what, const std::string& source) {
  using diloco::detail::raise;
  if (bytes.size() < record_header_bytes + 4)
    raise<format_error>(what, " from ", source, ": ", bytes.size(), " bytes, a record needs at least ",
                        record_header_bytes + 4);
  if (std::memcmp(bytes.data(), record_magic, sizeof record_magic) != 0)
    raise<format_error>(what, " from ", source,
                        ": bad magic (expected \"DLNCCLID\"): the value was not written by diloco's id exchange");
  const std::uint32_t version = get_u32(bytes, 8);
  if (version != record_version)
    raise<format_error>(what, " from ", source, ": record version ", version, ", expected ", record_version);
  const std::uint32_t status = get_u32(bytes, 12);
  const std::size_t length = get_u32(bytes, 16);
  if (length > bytes.size() - record_header_bytes - 4)
    raise<format_error>(what, " from ", source, ": payload of ", length, " bytes does not fit in the ",
                        bytes.size(), "-byte record (truncated?)");
  const std::size_t end = record_header_bytes + length;
  const std::uint32_t stored = get_u32(bytes, end);
  const std::uint32_t computed = fnv1a(bytes.first(end));
  if (stored != computed)
    raise<format_error>(what, " from ", source, ": checksum mismatch (stored ", stored, ", computed ", computed,
                        "): the record is corrupt");
  if (status != status_id && status != status_failure)
    raise<format_error>(what, " from ", source, ": unknown status ", status, " (expected 0 or 1)");
  return {status == status_failure, bytes.subspan(record_header_bytes, length)};
}

// Rank 0's side of every bootstrap: the record for the id payload make_id()
// returns (bytes), or for the reason it threw.
template <class MakeId>
std::vector<char> make_record(MakeId&& make_id) {
  try {
    const auto payload = make_id();
    return encode_record(status_id, std::span<const char>(payload.data(), payload.size()));
  } catch (const std::exception& e) {
    return encode_failure(e.what());
  } catch (...) {
    return encode_failure("a non-standard exception");
  }
}

// Hands rank 0's record to every rank through a shared store: rank 0 makes
// it (make_id) and sets `key`, the others wait for the key (up to
// `timeout`) and read it back. Returns the record, not yet decoded.
// `who` opens the messages ("nccl", "nccl (generation 3)"), `what` names
// the id ("the unique id"). Throws comm_error when rank 0 cannot publish
// or the key does not appear in time.
template <unique_id_store Store, class MakeId>
std::vector<char> exchange_record(Store& store, int rank, const std::string& key, std::chrono::milliseconds timeout,
                                  MakeId&& make_id, std::string_view who, std::string_view what) {
  using diloco::detail::raise;
  const std::string source = diloco::detail::concat("store key '", key, "'");
  if (rank == 0) {
    std::vector<char> record = detail_id::make_record(make_id);
    try {
      store.set(key, record);
    } catch (const std::exception& e) {
      raise<comm_error>(who, " rank 0: could not publish ", what, " under ", source, ": ", e.what());
    }
    return record;
  }
  try {
    // A store's zero is Gloo's "no timeout".
    store.wait({key}, diloco::detail::unbounded(timeout) ? std::chrono::milliseconds::zero() : timeout);
    return store.get(key);
  } catch (const std::exception& e) {
    raise<comm_error>(who, " rank ", rank, ": waited ",
                      diloco::detail::unbounded(timeout) ? std::string("without a timeout")
                                                         : diloco::detail::concat("up to ", timeout.count(), " ms"),
                      " for rank 0 to publish ", what, " under ", source, ": ", e.what());
  }
}

}  // namespace detail_id
}  // namespace diloco::comm
