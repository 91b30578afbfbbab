// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "diloco/codec/formats.hpp"
#include "diloco/core/checksum.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/macros.hpp"

DILOCO_EXACT_FP_BEGIN

namespace diloco::wire {

inline constexpr std::uint32_t magic = 0x57434c44u;  ///< the segment's first 4 bytes, "DLCW" little-endian
inline constexpr std::uint16_t version = 1;  ///< the format version this reader writes and accepts
inline constexpr std::size_t header_bytes = 64;  ///< the header's size; the payload follows it
inline constexpr std::uint8_t flag_stochastic = 1u;  ///< flags bit: stochastic rounding
inline constexpr std::uint8_t flag_error_feedback = 2u;  ///< flags bit: error feedback
inline constexpr std::uint8_t known_flags = flag_stochastic | flag_error_feedback;  ///< every flag a reader accepts

/// A segment header. The wire format of a compressed segment is a 64-byte header, then
/// the codec's payload. Every segment is validated in full before any of its
/// payload is decoded; anything that does not match what the receiver
/// expects is a format_error saying which field and what was expected.
///
/// ```
/// offset size field
///      0    4 magic "DLCW" (0x57434c44, little-endian)
///      4    2 version (1)
///      6    1 codec id (compress::codec_id)
///      7    1 flags (bit 0: stochastic rounding; bit 1: error feedback)
///      8    4 block size (elements per codec block)
///     12    4 sender rank
///     16    8 element count
///     24    8 payload length in bytes
///     32    8 round (1-based outer round the segment belongs to)
///     40    4 norm (fp32: the sender's pseudo-gradient norm in stage 1,
///              the decoded reduced shard's norm in stage 2)
///     44    4 status (0 = ok; 1 + r = the sender got a corrupt segment
///              from rank r and sends no data)
///     48    8 checksum of the 64 header bytes (this field as zero) and
///              the payload (diloco/core/checksum.hpp)
///     56    4 fragment (the sync schedule's fragment the segment belongs
///              to; 0 for a whole-model round)
///     60    4 reserved, zero
/// ```
/// All multi-byte fields are little-endian. The magic, version, checksum and reserved bytes
/// are the writer's (write_header).
struct header {
  compress::codec_id codec = compress::codec_id::none;  ///< the codec of the payload
  std::uint8_t flags = 0;  ///< flag_stochastic, flag_error_feedback
  std::uint32_t block_size = 0;  ///< elements per codec block
  std::uint32_t sender = 0;  ///< the sender's rank
  std::uint64_t elements = 0;  ///< elements the payload encodes
  std::uint64_t payload_bytes = 0;  ///< the payload's length in bytes
  std::uint64_t round = 0;  ///< the 1-based outer round the segment belongs to
  float norm = 0.0f;  ///< the sender's pseudo-gradient norm (stage 1) or the decoded reduced shard's (stage 2)
  std::uint32_t status = 0;  ///< 0, or 1 + r: the sender got a corrupt segment from rank r and sends no data
  std::uint32_t fragment = 0;  ///< the schedule's fragment (0 for a whole-model round)
};

namespace detail {
template <class T>
void put(std::byte* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <class T>
T get(const std::byte* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}
// The checksum's sum over the 64 header bytes, the checksum field as zero.
inline std::uint64_t header_words_sum(const std::byte* seg) {
  std::byte h[header_bytes];
  std::memcpy(h, seg, header_bytes);
  std::memset(h + 48, 0, 8);
  return checksum_words(h, header_bytes, 0);
}
// The checksum's sum over a payload (its words follow the header's). Being
// a sum, it may also be computed elsewhere, e.g. on the device that holds
// the payload.
inline std::uint64_t payload_words_sum(const std::byte* payload, std::uint64_t payload_bytes) {
  return checksum_words(payload, static_cast<std::size_t>(payload_bytes), header_bytes / 8);
}
inline std::uint64_t finish_checksum(std::uint64_t header_sum, std::uint64_t payload_sum, std::uint64_t payload_bytes) {
  return checksum_finish(header_sum + payload_sum, header_bytes + payload_bytes);
}
inline std::uint64_t segment_checksum(const std::byte* seg, std::uint64_t payload_bytes) {
  return finish_checksum(header_words_sum(seg), payload_words_sum(seg + header_bytes, payload_bytes), payload_bytes);
}

inline void write_fields(std::byte* seg, const header& h) {
  std::memset(seg, 0, header_bytes);
  put<std::uint32_t>(seg + 0, magic);
  put<std::uint16_t>(seg + 4, version);
  put<std::uint8_t>(seg + 6, static_cast<std::uint8_t>(h.codec));
  put<std::uint8_t>(seg + 7, h.flags);
  put<std::uint32_t>(seg + 8, h.block_size);
  put<std::uint32_t>(seg + 12, h.sender);
  put<std::uint64_t>(seg + 16, h.elements);
  put<std::uint64_t>(seg + 24, h.payload_bytes);
  put<std::uint64_t>(seg + 32, h.round);
  put<float>(seg + 40, h.norm);
  put<std::uint32_t>(seg + 44, h.status);
  put<std::uint32_t>(seg + 56, h.fragment);
}
}  // namespace detail

/// Writes the header of a segment whose payload is already in place after it.
inline void write_header(std::byte* seg, const header& h) {
  detail::write_fields(seg, h);
  detail::put<std::uint64_t>(seg + 48, detail::segment_checksum(seg, h.payload_bytes));
}

/// Writes the 64 header bytes of a segment whose payload lies elsewhere (in
/// device memory), given detail::payload_words_sum of that payload.
inline void write_header(std::byte* head, const header& h, std::uint64_t payload_sum) {
  detail::write_fields(head, h);
  detail::put<std::uint64_t>(head + 48,
                             detail::finish_checksum(detail::header_words_sum(head), payload_sum, h.payload_bytes));
}

/// What the receiver knows a segment must say. The norm and status are read,
/// not expected.
struct expectation {
  ///@{
  /// The header fields a receiver checks: each must be as expected.
  compress::codec_id codec;
  std::uint8_t flags;
  std::uint32_t block_size;
  std::uint32_t sender;
  std::uint64_t elements;
  std::uint64_t payload_bytes;
  std::uint64_t round;
  std::uint32_t fragment = 0;
  ///@}

  /// What a receiver expects of a segment it would itself write as `h`.
  static expectation of(const header& h) {
    return {h.codec, h.flags, h.block_size, h.sender, h.elements, h.payload_bytes, h.round, h.fragment};
  }
};

/// Validates `bytes` (a received slot: the segment and any padding after it)
/// against `want` and returns the header. Throws format_error naming the
/// first field that is wrong. A segment with a non-zero status carries no
/// payload (payload length 0).
///
/// This form reads the header at `s` of a received slot of `slot_bytes`
/// bytes whose payload may live elsewhere: payload_sum(n) returns
/// detail::payload_words_sum of its first n bytes (called once the length
/// field has been checked).
template <class PayloadSum>
header read_header(const std::byte* s, std::size_t slot_bytes, const expectation& want, const char* where,
                   PayloadSum&& payload_sum) {
  using detail::get;
  auto fail = [&](const auto&... parts) { diloco::detail::raise<format_error>(where, ": ", parts...); };
  if (slot_bytes < header_bytes) fail("truncated segment: ", slot_bytes, " bytes, the header alone needs ", header_bytes);
  if (const auto m = get<std::uint32_t>(s); m != magic) fail("bad magic ", m, " (expected ", magic, ", \"DLCW\")");
  if (const auto v = get<std::uint16_t>(s + 4); v != version) fail("unsupported version ", v, " (expected ", version, ")");
  header h;
  h.codec = static_cast<compress::codec_id>(get<std::uint8_t>(s + 6));
  h.flags = get<std::uint8_t>(s + 7);
  h.block_size = get<std::uint32_t>(s + 8);
  h.sender = get<std::uint32_t>(s + 12);
  h.elements = get<std::uint64_t>(s + 16);
  h.payload_bytes = get<std::uint64_t>(s + 24);
  h.round = get<std::uint64_t>(s + 32);
  h.norm = get<float>(s + 40);
  h.status = get<std::uint32_t>(s + 44);
  h.fragment = get<std::uint32_t>(s + 56);
  if (h.codec != want.codec)
    fail("codec id ", static_cast<unsigned>(h.codec), " (expected ", static_cast<unsigned>(want.codec), ")");
  if (h.flags & ~known_flags) fail("unknown flags ", static_cast<unsigned>(h.flags));
  if (h.flags != want.flags) fail("flags ", static_cast<unsigned>(h.flags), " (expected ", static_cast<unsigned>(want.flags), ")");
  if (h.block_size != want.block_size) fail("block size ", h.block_size, " (expected ", want.block_size, ")");
  if (h.sender != want.sender) fail("sender rank ", h.sender, " (expected ", want.sender, ")");
  if (h.round != want.round) fail("round ", h.round, " (expected ", want.round, "): a stale or future segment");
  if (h.fragment != want.fragment)
    fail("fragment ", h.fragment, " (expected ", want.fragment, "): a segment of another fragment's reduction");
  if (h.elements != want.elements) fail("element count ", h.elements, " (expected ", want.elements, ")");
  const std::uint64_t payload = h.status == 0 ? want.payload_bytes : 0;
  if (h.payload_bytes != payload) fail("payload length ", h.payload_bytes, " (expected ", payload, ")");
  if (slot_bytes - header_bytes < h.payload_bytes)
    fail("truncated segment: ", slot_bytes, " bytes, header and payload need ", header_bytes + h.payload_bytes);
  for (std::size_t b = 60; b < header_bytes; ++b)
    if (s[b] != std::byte{0}) fail("reserved header byte ", b, " is not zero");
  if (const auto c = get<std::uint64_t>(s + 48);
      c != detail::finish_checksum(detail::header_words_sum(s), payload_sum(h.payload_bytes), h.payload_bytes))
    fail("checksum mismatch (stored ", c, "): the segment was corrupted");
  return h;
}

/// The usual form: the slot, payload included, in host memory.
inline header read_header(std::span<const std::byte> bytes, const expectation& want, const char* where) {
  return read_header(bytes.data(), bytes.size(), want, where, [&](std::uint64_t payload_bytes) {
    return detail::payload_words_sum(bytes.data() + header_bytes, payload_bytes);
  });
}

}  // namespace diloco::wire

DILOCO_EXACT_FP_END
