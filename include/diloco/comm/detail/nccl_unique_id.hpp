// SPDX-License-Identifier: Apache-2.0
#pragma once

// The ncclUniqueId on its way from rank 0 to the others, as an id record
// (comm/detail/id_record.hpp: magic, version, status, length, checksum), so
// a stale, truncated or foreign value in a shared store is a format_error,
// and rank 0's failure reaches every rank as a comm_error naming its cause
// instead of leaving them waiting.

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/comm/detail/id_record.hpp"
#include "diloco/core/error.hpp"

namespace diloco::comm::detail_nccl {

using detail_id::encode_failure;
using detail_id::record_capacity;
static_assert(detail_id::record_header_bytes + sizeof(ncclUniqueId) + 4 <= record_capacity);

inline constexpr std::string_view id_name = "nccl unique id";

inline std::span<const char> id_bytes(const ncclUniqueId& id) { return {id.internal, sizeof id.internal}; }

inline std::vector<char> encode_unique_id(const ncclUniqueId& id) {
  return detail_id::encode_record(detail_id::status_id, id_bytes(id));
}

// An id from a validated record's payload (format_error if it is not one).
inline ncclUniqueId unique_id_from(std::span<const char> payload, const std::string& source) {
  if (payload.size() != sizeof(ncclUniqueId))
    diloco::detail::raise<format_error>(id_name, " from ", source, ": payload of ", payload.size(),
                                        " bytes, an ncclUniqueId has ", sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::memcpy(id.internal, payload.data(), sizeof id.internal);
  return id;
}

// Validates a record and returns the id it carries; a failure record is a
// comm_error with rank 0's reason. `source` names where the bytes came
// from, for messages.
inline ncclUniqueId decode_unique_id(std::span<const char> bytes, const std::string& source) {
  const detail_id::record_view record = detail_id::decode_record(bytes, id_name, source);
  if (record.failed)
    diloco::detail::raise<comm_error>("nccl: rank 0 could not create the NCCL unique id: ", record.failure());
  return unique_id_from(record.payload, source);
}

// make_id() (an ncclUniqueId) as the bytes detail_id's records carry.
template <class MakeId>
auto id_payload(MakeId& make_id) {
  return [&make_id] {
    const ncclUniqueId id = make_id();
    const auto bytes = id_bytes(id);
    return std::vector<char>(bytes.begin(), bytes.end());
  };
}

// Rank 0's record for the id make_id() returns, or for the reason it threw.
template <class MakeId>
std::vector<char> make_record(MakeId&& make_id) {
  return detail_id::make_record(id_payload(make_id));
}

// Hands rank 0's id to every rank through a shared store: rank 0 sets `key`,
// the others wait for it (up to `timeout`) and read it back.
template <unique_id_store Store, class MakeId>
ncclUniqueId exchange_unique_id(Store& store, int rank, const std::string& key, std::chrono::milliseconds timeout,
                                MakeId&& make_id) {
  const std::vector<char> record =
      detail_id::exchange_record(store, rank, key, timeout, id_payload(make_id), "nccl", "the unique id");
  // Rank 0 decodes its own record too: that rethrows its own failure.
  return decode_unique_id(record, diloco::detail::concat("store key '", key, "'"));
}

}  // namespace diloco::comm::detail_nccl
