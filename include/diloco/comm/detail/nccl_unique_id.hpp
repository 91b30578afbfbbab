#pragma once

// The ncclUniqueId on its way from rank 0 to the others. Rank 0 makes the id
// (or fails to) and publishes a record; every other rank validates the record
// before use, so a stale, truncated or foreign value in a shared store is a
// format_error, and rank 0's failure reaches every rank as a comm_error
// naming its cause instead of leaving them waiting.
//
// Record layout (little-endian):
//   0   8 bytes  magic "DLNCCLID"
//   8   u32      version (1)
//   12  u32      status: 0 = payload is the id, 1 = payload is rank 0's error
//   16  u32      payload length in bytes
//   20  payload
//   ..  u32      FNV-1a checksum of every byte before it

#include <nccl.h>

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

// A key-value store the ranks share, with gloo::rendezvous::Store's
// interface: set a key, wait (with a timeout) until keys exist, get a key.
template <class S>
concept unique_id_store = requires(S& s, const std::string& key, const std::vector<char>& value,
                                   const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  { s.set(key, value) };
  { s.wait(keys, timeout) };
  { s.get(key) } -> std::convertible_to<std::vector<char>>;
};

namespace detail_nccl {

inline constexpr char record_magic[8] = {'D', 'L', 'N', 'C', 'C', 'L', 'I', 'D'};
inline constexpr std::uint32_t record_version = 1;
inline constexpr std::uint32_t status_id = 0;
inline constexpr std::uint32_t status_failure = 1;
inline constexpr std::size_t record_header_bytes = 20;
inline constexpr std::size_t max_failure_message = 400;
// Large enough for either payload; the MPI bootstrap broadcasts this many.
inline constexpr std::size_t record_capacity = 512;
static_assert(record_header_bytes + sizeof(ncclUniqueId) + 4 <= record_capacity);
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

inline std::vector<char> encode_unique_id(const ncclUniqueId& id) {
  return encode_record(status_id, std::span<const char>(id.internal, sizeof id.internal));
}

// Rank 0 could not make the id: the record carries why (truncated).
inline std::vector<char> encode_failure(std::string_view message) {
  if (message.size() > max_failure_message) message = message.substr(0, max_failure_message);
  return encode_record(status_failure, std::span<const char>(message.data(), message.size()));
}

// Validates a record and returns the id it carries. `source` names where the
// bytes came from, for messages. Trailing bytes after the checksum are
// allowed (the MPI bootstrap sends a fixed-size buffer).
inline ncclUniqueId decode_unique_id(std::span<const char> bytes, const std::string& source) {
  using diloco::detail::raise;
  if (bytes.size() < record_header_bytes + 4)
    raise<format_error>("nccl unique id from ", source, ": ", bytes.size(), " bytes, a record needs at least ",
                        record_header_bytes + 4);
  if (std::memcmp(bytes.data(), record_magic, sizeof record_magic) != 0)
    raise<format_error>("nccl unique id from ", source,
                        ": bad magic (expected \"DLNCCLID\"): the value was not written by diloco::comm::nccl");
  const std::uint32_t version = get_u32(bytes, 8);
  if (version != record_version)
    raise<format_error>("nccl unique id from ", source, ": record version ", version, ", expected ", record_version);
  const std::uint32_t status = get_u32(bytes, 12);
  const std::size_t length = get_u32(bytes, 16);
  if (length > bytes.size() - record_header_bytes - 4)
    raise<format_error>("nccl unique id from ", source, ": payload of ", length, " bytes does not fit in the ",
                        bytes.size(), "-byte record (truncated?)");
  const std::size_t end = record_header_bytes + length;
  const std::uint32_t stored = get_u32(bytes, end);
  const std::uint32_t computed = fnv1a(bytes.first(end));
  if (stored != computed)
    raise<format_error>("nccl unique id from ", source, ": checksum mismatch (stored ", stored, ", computed ",
                        computed, "): the record is corrupt");
  const auto payload = bytes.subspan(record_header_bytes, length);
  if (status == status_failure)
    raise<comm_error>("nccl: rank 0 could not create the NCCL unique id: ",
                      std::string_view(payload.data(), payload.size()));
  if (status != status_id)
    raise<format_error>("nccl unique id from ", source, ": unknown status ", status, " (expected 0 or 1)");
  if (length != sizeof(ncclUniqueId))
    raise<format_error>("nccl unique id from ", source, ": payload of ", length, " bytes, an ncclUniqueId has ",
                        sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::memcpy(id.internal, payload.data(), sizeof id.internal);
  return id;
}

// Rank 0's side of every bootstrap: the record for the id make_id() returns,
// or for the reason it threw.
template <class MakeId>
std::vector<char> make_record(MakeId&& make_id) {
  try {
    return encode_unique_id(make_id());
  } catch (const std::exception& e) {
    return encode_failure(e.what());
  } catch (...) {
    return encode_failure("a non-standard exception");
  }
}

// Hands rank 0's id to every rank through a shared store: rank 0 sets `key`,
// the others wait for it (up to `timeout`) and read it back.
template <unique_id_store Store, class MakeId>
ncclUniqueId exchange_unique_id(Store& store, int rank, const std::string& key, std::chrono::milliseconds timeout,
                                MakeId&& make_id) {
  using diloco::detail::raise;
  const std::string source = diloco::detail::concat("store key '", key, "'");
  if (rank == 0) {
    const std::vector<char> record = make_record(make_id);
    try {
      store.set(key, record);
    } catch (const std::exception& e) {
      raise<comm_error>("nccl rank 0: could not publish the unique id under ", source, ": ", e.what());
    }
    return decode_unique_id(record, source);  // rethrows rank 0's own failure
  }
  std::vector<char> record;
  try {
    // A store's zero is Gloo's "no timeout".
    store.wait({key}, diloco::detail::unbounded(timeout) ? std::chrono::milliseconds::zero() : timeout);
    record = store.get(key);
  } catch (const std::exception& e) {
    raise<comm_error>("nccl rank ", rank, ": waited ",
                      diloco::detail::unbounded(timeout) ? std::string("without a timeout")
                                                         : diloco::detail::concat("up to ", timeout.count(), " ms"),
                      " for rank 0 to publish the unique id under ",
                      source, ": ", e.what());
  }
  return decode_unique_id(record, source);
}

}  // namespace detail_nccl
}  // namespace diloco::comm
