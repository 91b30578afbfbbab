// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checkpoint file format: bytes <-> header fields and named sections,
// with every size bounded and every byte under a checksum. It knows nothing
// of algorithms: checkpoint/state_io.hpp fills it from a visit_state walk.
//
// All integers little-endian, fp32 values as their IEEE bits.
//
//   preamble (24 bytes)
//     0  magic "DILOCOCK"
//     8  u32 format version (2; version 1, which has no bytes sections, is
//        read too)
//    12  u32 section count (the header section included)
//    16  u64 file bytes (preamble, sections and trailer)
//   sections, back to back; each
//     u32 kind (1 header, 2 buffer, 3 scalar, 4 bytes), u32 name bytes, u64 payload
//     bytes, the name, the payload, then u64 the checksum of the section's
//     bytes before it (frame, name and payload)
//   trailer (8 bytes)
//     u64 checksum of every byte before it
//
// Section 0 is the header (kind 1, name "header"); its payload is a u32
// field count, then per field: u8 value kind (option_value::kind), u32 name
// bytes, the name, and the value: u64 bits, or for text u32 bytes and the
// text. Then one section per visited state entry, in visit order: a buffer
// carries its fp32 values, a scalar one u64, a bytes section raw bytes (a
// wire segment, a text).
//
// Checksums are core/checksum.hpp's (checksum_words, finished with the
// length): they detect accidents (bit flips, truncation, splices), not
// attackers.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/core/checksum.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/options.hpp"

namespace diloco::checkpoint {

/// The file's first 8 bytes, "DILOCOCK".
inline constexpr std::array<char, 8> magic{'D', 'I', 'L', 'O', 'C', 'O', 'C', 'K'};
inline constexpr std::uint32_t format_version = 2;  ///< the version this library writes (and the newest it reads)
/// The oldest version this library reads: version 1 is version 2 without bytes sections.
inline constexpr std::uint32_t oldest_format_version = 1;
inline constexpr std::size_t preamble_bytes = 24;  ///< magic, version, section count, file bytes
inline constexpr std::size_t trailer_bytes = 8;   ///< the whole-file checksum
inline constexpr std::size_t frame_bytes = 16;    ///< kind, name bytes, payload bytes
inline constexpr std::size_t section_tail = 8;    ///< the section's checksum

/// What a section holds: the header's fields, an fp32 buffer, one u64
/// scalar, or raw bytes (format version 2).
enum class section_kind : std::uint32_t { header = 1, buffer = 2, scalar = 3, bytes = 4 };

/// "header", "buffer", "scalar" or "bytes", for messages.
inline const char* to_string(section_kind k) {
  switch (k) {
    case section_kind::header: return "header";
    case section_kind::buffer: return "buffer";
    case section_kind::scalar: return "scalar";
    case section_kind::bytes: return "bytes";
  }
  return "unknown";
}

/// A header field: a name and its value.
struct field {
  std::string name;    ///< the option's or entry's name
  option_value value;  ///< its value, type-erased
};

/// Where a section lies in the file.
struct section {
  section_kind kind = section_kind::buffer;  ///< what it holds
  std::string name;                ///< its name: "header", or the state entry's name
  std::size_t offset = 0;          ///< first byte of its frame
  std::size_t payload_offset = 0;  ///< first byte of its payload
  std::size_t payload_bytes = 0;   ///< bytes of its payload
  std::size_t end = 0;             ///< one past its checksum
  /// The values it holds: a buffer's floats, a bytes section's bytes, or 1 for a scalar or the header.
  std::size_t elements() const {
    return kind == section_kind::buffer ? payload_bytes / 4 : kind == section_kind::bytes ? payload_bytes : 1;
  }
};

namespace detail {

inline std::uint64_t checksum(const std::byte* data, std::size_t bytes) {
  return checksum_finish(checksum_words(data, bytes), bytes);
}

inline void put_u32(std::vector<std::byte>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xffu));
}
inline void put_u64(std::vector<std::byte>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xffu));
}
inline void put_text(std::vector<std::byte>& out, std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}
inline void set_u32(std::vector<std::byte>& out, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
}
inline void set_u64(std::vector<std::byte>& out, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
}
inline std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}
inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// fp32 values <-> little-endian bytes.
inline void put_floats(std::vector<std::byte>& out, const float* v, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + 4 * n);
  if constexpr (std::endian::native == std::endian::little) {
    if (n) std::memcpy(out.data() + at, v, 4 * n);
  } else {
    for (std::size_t i = 0; i < n; ++i) set_u32(out, at + 4 * i, std::bit_cast<std::uint32_t>(v[i]));
  }
}
inline void get_floats(const std::byte* p, std::size_t n, float* out) {
  if constexpr (std::endian::native == std::endian::little) {
    if (n) std::memcpy(out, p, 4 * n);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(get_u32(p + 4 * i));
  }
}

// Reads what a header section holds, each read bounded by the payload.
class field_reader {
 public:
  field_reader(const std::byte* p, std::size_t n) : p_(p), n_(n) {}
  std::size_t left() const { return n_ - at_; }
  const std::byte* take(std::size_t bytes, const char* what, std::size_t field_index) {
    if (bytes > left())
      diloco::detail::raise<format_error>("checkpoint header field ", field_index, ": its ", what, " needs ", bytes,
                                          " bytes but only ", left(), " remain in the header section");
    const std::byte* p = p_ + at_;
    at_ += bytes;
    return p;
  }

 private:
  const std::byte* p_;
  std::size_t n_;
  std::size_t at_ = 0;
};

}  // namespace detail

/// Builds a checkpoint: the header fields, then sections in order.
class writer {
 public:
  /// Starts a checkpoint: the preamble, then the header section with these fields.
  explicit writer(const std::vector<field>& header) {
    out_.reserve(preamble_bytes + 256);
    detail::put_text(out_, std::string_view(magic.data(), magic.size()));
    detail::put_u32(out_, format_version);
    detail::put_u32(out_, 0);  // section count, set by finish()
    detail::put_u64(out_, 0);  // file bytes, set by finish()
    std::vector<std::byte> payload;
    detail::put_u32(payload, static_cast<std::uint32_t>(header.size()));
    for (const field& f : header) {
      payload.push_back(static_cast<std::byte>(f.value.type));
      detail::put_u32(payload, static_cast<std::uint32_t>(f.name.size()));
      detail::put_text(payload, f.name);
      if (f.value.type == option_value::kind::text) {
        detail::put_u32(payload, static_cast<std::uint32_t>(f.value.str.size()));
        detail::put_text(payload, f.value.str);
      } else {
        detail::put_u64(payload, f.value.bits);
      }
    }
    const std::size_t at = begin(section_kind::header, "header", payload.size());
    out_.insert(out_.end(), payload.begin(), payload.end());
    end(at);
  }

  /// `host`: n fp32 values in host memory.
  void buffer(std::string_view name, const float* host, std::size_t n) {
    const std::size_t at = begin(section_kind::buffer, name, 4 * n);
    detail::put_floats(out_, host, n);
    end(at);
  }
  /// A bytes section: n raw bytes in host memory.
  void bytes(std::string_view name, const std::byte* host, std::size_t n) {
    const std::size_t at = begin(section_kind::bytes, name, n);
    if (n) out_.insert(out_.end(), host, host + n);
    end(at);
  }
  /// A scalar section: one u64.
  void scalar(std::string_view name, std::uint64_t value) {
    const std::size_t at = begin(section_kind::scalar, name, 8);
    detail::put_u64(out_, value);
    end(at);
  }

  /// The finished file: section count, size and the trailing checksum filled in.
  std::vector<std::byte> finish() && {
    detail::set_u32(out_, 12, sections_);
    detail::set_u64(out_, 16, out_.size() + trailer_bytes);
    detail::put_u64(out_, detail::checksum(out_.data(), out_.size()));
    return std::move(out_);
  }

 private:
  std::size_t begin(section_kind kind, std::string_view name, std::size_t payload) {
    const std::size_t at = out_.size();
    out_.reserve(at + frame_bytes + name.size() + payload + section_tail);
    detail::put_u32(out_, static_cast<std::uint32_t>(kind));
    detail::put_u32(out_, static_cast<std::uint32_t>(name.size()));
    detail::put_u64(out_, payload);
    detail::put_text(out_, name);
    return at;
  }
  void end(std::size_t at) {
    detail::put_u64(out_, detail::checksum(out_.data() + at, out_.size() - at));
    ++sections_;
  }

  std::vector<std::byte> out_;
  std::uint32_t sections_ = 0;
};

/// A checkpoint whose structure and checksums were verified (parse()). Views
/// the bytes it was parsed from, which must outlive it.
struct image {
  std::span<const std::byte> bytes;  ///< the whole file
  std::uint32_t version = 0;      ///< its format version
  std::vector<field> header;      ///< the header's fields, in file order
  std::vector<section> sections;  ///< sections[0] is the header

  /// The header field named `name`, or null.
  const field* find(std::string_view name) const {
    for (const field& f : header)
      if (f.name == name) return &f;
    return nullptr;
  }
  /// A scalar section's value.
  std::uint64_t scalar(const section& s) const { return detail::get_u64(bytes.data() + s.payload_offset); }
  /// A buffer section's values, copied to `out` (s.elements() floats; never
  /// more than the payload holds, whatever the section's kind).
  void floats(const section& s, float* out) const {
    detail::get_floats(bytes.data() + s.payload_offset, s.payload_bytes / 4, out);
  }
  /// A bytes section's bytes, copied to `out` (s.elements() bytes).
  void raw(const section& s, std::byte* out) const {
    if (s.payload_bytes) std::memcpy(out, bytes.data() + s.payload_offset, s.payload_bytes);
  }
};

/// Verifies everything that needs no knowledge of the algorithm: magic,
/// version, declared size against the bytes, every section's bounds, kind
/// and checksum, the whole-file checksum, the header's fields. Anything
/// wrong is a format_error saying what and what was expected.
inline image parse(std::span<const std::byte> bytes) {
  using diloco::detail::raise;
  const std::size_t n = bytes.size();
  const std::byte* b = bytes.data();
  if (n < preamble_bytes + trailer_bytes)
    raise<format_error>("checkpoint is ", n, " bytes; the smallest checkpoint has ", preamble_bytes + trailer_bytes,
                        " (a ", preamble_bytes, "-byte preamble and an ", trailer_bytes,
                        "-byte trailer): truncated or not a checkpoint");
  if (std::memcmp(b, magic.data(), magic.size()) != 0) {
    std::string seen;
    for (std::size_t i = 0; i < magic.size(); ++i) {
      const auto c = static_cast<unsigned char>(b[i]);
      seen += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
    }
    raise<format_error>("not a diloco checkpoint: magic is \"", seen, "\", expected \"DILOCOCK\"");
  }
  image img;
  img.bytes = bytes;
  img.version = detail::get_u32(b + 8);
  if (img.version < oldest_format_version || img.version > format_version)
    raise<format_error>("checkpoint format version is ", img.version, "; this library reads versions ",
                        oldest_format_version, " to ", format_version);
  const std::uint32_t count = detail::get_u32(b + 12);
  const std::uint64_t declared = detail::get_u64(b + 16);
  if (declared != n)
    raise<format_error>("checkpoint is ", n, " bytes but its preamble says ", declared,
                        declared > n ? ": the file is truncated" : ": the size field or the file is corrupt");
  const std::size_t body_end = n - trailer_bytes;
  if (count < 1) raise<format_error>("checkpoint preamble says 0 sections; expected at least the header section");
  // Each section takes at least frame + checksum bytes: bound the count
  // before reserving anything for it.
  if (count > (body_end - preamble_bytes) / (frame_bytes + section_tail))
    raise<format_error>("checkpoint preamble says ", count, " sections; ", body_end - preamble_bytes,
                        " bytes of sections hold at most ", (body_end - preamble_bytes) / (frame_bytes + section_tail));
  img.sections.reserve(count);
  std::size_t at = preamble_bytes;
  for (std::uint32_t i = 0; i < count; ++i) {
    section s;
    s.offset = at;
    if (body_end - at < frame_bytes + section_tail)
      raise<format_error>("checkpoint section ", i, " at byte ", at, ": its frame needs ", frame_bytes + section_tail,
                          " bytes but ", body_end - at, " remain before the trailer (preamble says ", count,
                          " sections)");
    const std::uint32_t kind = detail::get_u32(b + at);
    const std::uint32_t name_bytes = detail::get_u32(b + at + 4);
    const std::uint64_t payload = detail::get_u64(b + at + 8);
    const std::size_t room = body_end - at - frame_bytes - section_tail;
    if (name_bytes > room || payload > room - name_bytes)
      raise<format_error>("checkpoint section ", i, " at byte ", at, ": name (", name_bytes, " bytes) and payload (",
                          payload, " bytes) run past the end of the sections (", room, " bytes remain)");
    s.payload_offset = at + frame_bytes + name_bytes;
    s.payload_bytes = static_cast<std::size_t>(payload);
    s.end = s.payload_offset + s.payload_bytes + section_tail;
    const std::uint64_t stored = detail::get_u64(b + s.end - section_tail);
    const std::uint64_t computed = detail::checksum(b + at, s.end - section_tail - at);
    s.name.assign(reinterpret_cast<const char*>(b + at + frame_bytes), name_bytes);
    if (stored != computed)
      raise<format_error>("checkpoint section ", i, " (\"", s.name, "\", at byte ", at, ") checksum is ",
                          detail::hex(stored), ", expected ", detail::hex(computed), ": the section is corrupt");
    const std::uint32_t kinds = img.version >= 2 ? 4 : 3;  // bytes sections came with version 2
    if (kind < 1 || kind > kinds)
      raise<format_error>("checkpoint section ", i, " (\"", s.name, "\") has kind ", kind, "; expected 1 (header), 2 (buffer)",
                          kinds == 4 ? ", 3 (scalar) or 4 (bytes)" : " or 3 (scalar) in a version-1 file");
    s.kind = static_cast<section_kind>(kind);
    if ((i == 0) != (s.kind == section_kind::header))
      raise<format_error>("checkpoint section ", i, " (\"", s.name, "\") is a ", to_string(s.kind),
                          i == 0 ? " section; expected the header section first" : " section; only section 0 is the header");
    if (s.kind == section_kind::buffer && s.payload_bytes % 4 != 0)
      raise<format_error>("checkpoint section ", i, " (\"", s.name, "\") is a buffer of ", s.payload_bytes,
                          " bytes; expected a multiple of 4 (fp32 values)");
    if (s.kind == section_kind::scalar && s.payload_bytes != 8)
      raise<format_error>("checkpoint section ", i, " (\"", s.name, "\") is a scalar of ", s.payload_bytes,
                          " bytes; expected 8");
    img.sections.push_back(std::move(s));
    at = img.sections.back().end;
  }
  if (at != body_end)
    raise<format_error>("checkpoint has ", body_end - at, " bytes between its last section (", count,
                        " sections per the preamble) and the trailer; expected none");
  const std::uint64_t stored = detail::get_u64(b + body_end);
  const std::uint64_t computed = detail::checksum(b, body_end);
  if (stored != computed)
    raise<format_error>("checkpoint whole-file checksum is ", detail::hex(stored), ", expected ", detail::hex(computed),
                        ": the file is corrupt");

  // The header's fields.
  const section& h = img.sections[0];
  detail::field_reader r(b + h.payload_offset, h.payload_bytes);
  const std::uint32_t fields = detail::get_u32(r.take(4, "field count", 0));
  if (fields > r.left() / 6)  // kind, name length and at least one byte of value each
    raise<format_error>("checkpoint header says ", fields, " fields; its ", r.left(), " bytes hold at most ",
                        r.left() / 6);
  for (std::uint32_t i = 0; i < fields; ++i) {
    field f;
    const auto kind = static_cast<std::uint8_t>(*r.take(1, "value kind", i));
    if (kind < 1 || kind > 5)
      raise<format_error>("checkpoint header field ", i, " has value kind ", static_cast<unsigned>(kind),
                          "; expected 1 (bool) to 5 (text)");
    f.value.type = static_cast<option_value::kind>(kind);
    const std::uint32_t name_bytes = detail::get_u32(r.take(4, "name length", i));
    f.name.assign(reinterpret_cast<const char*>(r.take(name_bytes, "name", i)), name_bytes);
    if (f.value.type == option_value::kind::text) {
      const std::uint32_t text_bytes = detail::get_u32(r.take(4, "text length", i));
      f.value.str.assign(reinterpret_cast<const char*>(r.take(text_bytes, "text", i)), text_bytes);
    } else {
      f.value.bits = detail::get_u64(r.take(8, "value", i));
      if (f.value.type == option_value::kind::boolean && f.value.bits > 1)
        raise<format_error>("checkpoint header field \"", f.name, "\" is a bool with value ", f.value.bits,
                            "; expected 0 or 1");
    }
    if (img.find(f.name))
      raise<format_error>("checkpoint header field \"", f.name, "\" appears twice; expected each field once");
    img.header.push_back(std::move(f));
  }
  if (r.left() != 0)
    raise<format_error>("checkpoint header section has ", r.left(), " bytes after its ", fields,
                        " fields; expected none");
  return img;
}

/// A field the reader expects, and whether its value must match the file's
/// (fields that may differ per rank are checked for presence only).
struct expected_field {
  field f;              ///< the field, with the value expected
  bool enforce = true;  ///< whether the value must match (else the field need only be present)
  /// An option at its default value: a file written before the option
  /// existed (which ran as its default does) has no such field, and loads.
  bool may_be_absent = false;
};

/// Every expected field is present with the expected kind and, where
/// enforced, value, except options at their defaults, which may be absent
/// (files from before they existed); the file has no other fields. The first
/// difference is a format_error naming the field and both values.
inline void check_header(const image& img, const std::vector<expected_field>& expected) {
  using diloco::detail::raise;
  for (const expected_field& e : expected) {
    const field* f = img.find(e.f.name);
    if (!f && e.may_be_absent) continue;
    if (!f)
      raise<format_error>("checkpoint header has no field \"", e.f.name, "\"; expected it (this instance has ",
                          e.f.value.to_string(), ")");
    if (f->value.type != e.f.value.type)
      raise<format_error>("checkpoint header field \"", e.f.name, "\" is a ", to_string(f->value.type), " (",
                          f->value.to_string(), "); expected a ", to_string(e.f.value.type), " (",
                          e.f.value.to_string(), ")");
    if (e.enforce && !(f->value == e.f.value))
      raise<format_error>("checkpoint header field \"", e.f.name, "\" is ", f->value.to_string(),
                          " in the file; this instance has ", e.f.value.to_string(), " and they must match");
  }
  for (const field& f : img.header) {
    bool known = false;
    for (const expected_field& e : expected) known = known || e.f.name == f.name;
    if (!known)
      raise<format_error>("checkpoint header has a field \"", f.name, "\" (", f.value.to_string(),
                          ") that this instance does not expect");
  }
}

}  // namespace diloco::checkpoint
