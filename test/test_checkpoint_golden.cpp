// SPDX-License-Identifier: Apache-2.0
// The checkpoint format, pinned byte by byte (issue 45, item 7). Every other
// checkpoint test writes its files with the library's own writer, so a change
// to the layout that the writer and the reader share would pass them all. Here
// the files are built by a small writer of the test's own (golden_file below:
// it does not call checkpoint::writer, serialize or core/checksum.hpp), from
// the layout as checkpoint/format.hpp's comment and docs/internals.md
// ("Checkpoints") state it, with the values the test chose:
//
//   * format version 1 and version 2 (the current one), for sync::blocking
//     (fp32, compress::none) and for sync::one_step_delay with blockwise int8
//     and error feedback; the version-2 one_step_delay file also holds a
//     reduction in flight (version 2's bytes sections: the verdict's problem
//     text and the gathered wire segment);
//   * a fresh instance loads each file, and its θ_global, outer momentum,
//     inner momentum, residual, schedule start, round and step counters and
//     replica must equal the values put in the file, bit for bit; the
//     reduction in flight is applied by finish(), and θ_global, the momentum,
//     the replica, the schedule start and the committed residual must equal
//     the outer step computed here by hand from the int8 codes in the file;
//   * the library's writer, given the state a golden file holds, writes the
//     version-2 golden bytes exactly (so the writer is pinned too);
//   * a flipped byte (every byte of two files, in turn), a wrong version,
//     a wrong magic, a bytes section in a version-1 file and a wrong option
//     are refused with format_error, the live state untouched; a load while
//     the loaded reduction is in flight is a state_error.
//
// One rank (comm::local): the rank and world header fields are 0 and 1.
#include <doctest/doctest.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <diloco/diloco.hpp>
#include <span>
#include <string>
#include <vector>

#include "resume_check.hpp"
#include "same_bits.hpp"

namespace dc = diloco;

namespace {

// ------------------------------------------------------------ the test's own writer

// The checksum, from core/checksum.hpp's statement of it: the wrapping sum
// over the 64-bit little-endian words w_i of the bytes (the last one
// zero-padded) of mix64(w_i + (i + 1) * golden), then mix64(sum ^
// mix64(length in bytes)). mix64 is SplitMix64's finalizer.
std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
std::uint64_t checksum(const std::vector<std::uint8_t>& b, std::size_t from, std::size_t to) {
  const std::uint64_t golden = 0x9e3779b97f4a7c15ULL;
  std::uint64_t sum = 0;
  for (std::size_t at = from, i = 0; at < to; at += 8, ++i) {
    std::uint64_t w = 0;
    for (std::size_t j = 0; j < 8 && at + j < to; ++j) w |= std::uint64_t{b[at + j]} << (8 * j);
    sum += mix64(w + (i + 1) * golden);
  }
  return mix64(sum ^ mix64(static_cast<std::uint64_t>(to - from)));
}

void u32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void u64(std::vector<std::uint8_t>& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void text(std::vector<std::uint8_t>& b, const std::string& s) { b.insert(b.end(), s.begin(), s.end()); }
void put_u32_at(std::vector<std::uint8_t>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64_at(std::vector<std::uint8_t>& b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}

// A header field: u8 value kind (1 bool, 2 signed, 3 unsigned, 4 floating:
// the double's bits, 5 text), the name, the value.
struct hfield {
  std::uint8_t kind;
  std::string name;
  std::uint64_t bits;
  std::string str;
};
hfield f_text(std::string name, std::string s) { return {5, std::move(name), 0, std::move(s)}; }
hfield f_unsigned(std::string name, std::uint64_t v) { return {3, std::move(name), v, {}}; }
hfield f_signed(std::string name, std::int64_t v) { return {2, std::move(name), static_cast<std::uint64_t>(v), {}}; }
hfield f_bool(std::string name, bool v) { return {1, std::move(name), v ? 1u : 0u, {}}; }
// float options are stored as the double they widen to.
hfield f_float(std::string name, float v) {
  return {4, std::move(name), std::bit_cast<std::uint64_t>(static_cast<double>(v)), {}};
}

// A checkpoint file, built field by field:
//
//   preamble, 24 bytes
//     0  "DILOCOCK"
//     8  u32 format version
//    12  u32 section count, the header section included
//    16  u64 file bytes
//   sections, back to back:
//     u32 kind (1 header, 2 fp32 buffer, 3 u64 scalar, 4 bytes), u32 name
//     bytes, u64 payload bytes, the name, the payload, u64 checksum of the
//     section's bytes before it (from its kind on)
//   trailer: u64 checksum of every byte before it
//
// All integers little-endian. The header section (named "header") holds u32
// field count, then per field u8 kind, u32 name bytes, the name, and a u64
// value, or for text u32 bytes and the text.
class golden_file {
 public:
  golden_file(std::uint32_t version, const std::vector<hfield>& fields) {
    text(b_, "DILOCOCK");
    u32(b_, version);
    u32(b_, 0);  // section count, filled in by bytes()
    u64(b_, 0);  // file bytes, filled in by bytes()
    std::vector<std::uint8_t> p;
    u32(p, static_cast<std::uint32_t>(fields.size()));
    for (const hfield& f : fields) {
      p.push_back(f.kind);
      u32(p, static_cast<std::uint32_t>(f.name.size()));
      text(p, f.name);
      if (f.kind == 5) {
        u32(p, static_cast<std::uint32_t>(f.str.size()));
        text(p, f.str);
      } else {
        u64(p, f.bits);
      }
    }
    section(1, "header", p);
  }
  void buffer(const std::string& name, const std::vector<float>& v) {
    std::vector<std::uint8_t> p;
    for (float x : v) u32(p, std::bit_cast<std::uint32_t>(x));
    section(2, name, p);
  }
  void scalar(const std::string& name, std::uint64_t v) {
    std::vector<std::uint8_t> p;
    u64(p, v);
    section(3, name, p);
  }
  void raw(const std::string& name, const std::vector<std::uint8_t>& p) { section(4, name, p); }

  // The finished file: the count and size filled in, the trailer appended.
  std::vector<std::byte> bytes() const {
    std::vector<std::uint8_t> b = b_;
    put_u32_at(b, 12, sections_);
    put_u64_at(b, 16, b.size() + 8);
    u64(b, checksum(b, 0, b.size()));
    std::vector<std::byte> out(b.size());
    std::memcpy(out.data(), b.data(), b.size());
    return out;
  }

 private:
  void section(std::uint32_t kind, const std::string& name, const std::vector<std::uint8_t>& payload) {
    const std::size_t at = b_.size();
    u32(b_, kind);
    u32(b_, static_cast<std::uint32_t>(name.size()));
    u64(b_, payload.size());
    text(b_, name);
    b_.insert(b_.end(), payload.begin(), payload.end());
    u64(b_, checksum(b_, at, b_.size()));
    ++sections_;
  }
  std::vector<std::uint8_t> b_;
  std::uint32_t sections_ = 0;
};

// Re-seals a file after a test changed bytes of it: the whole-file checksum
// again (the preamble is covered by it alone), so only the change itself can
// be what the reader refuses.
std::vector<std::byte> reseal(std::vector<std::byte> f) {
  std::vector<std::uint8_t> b(f.size() - 8);
  std::memcpy(b.data(), f.data(), b.size());
  const std::uint64_t sum = checksum(b, 0, b.size());
  for (int i = 0; i < 8; ++i) f[b.size() + static_cast<std::size_t>(i)] = static_cast<std::byte>(sum >> (8 * i));
  return f;
}

// ------------------------------------------------------------ the instances

// Two tensors of 3 and 5 elements: 8 in the flat order, tensor 1 from 3 on
// (host memory: no padding).
constexpr std::size_t n0 = 3, n1 = 5, flat = n0 + n1;

using fp32_blocking = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::local>;
using int8_ef = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32>>;
using int8_delayed = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, int8_ef, dc::comm::local, dc::sync::one_step_delay>;

template <class T>
typename T::options options() {
  typename T::options o;
  o.inner_steps = 4;
  o.inner.lr = 0.25f;
  o.inner.momentum = 0.5f;  // so the inner optimizer has a slot buffer
  o.outer.lr = 0.5f;
  o.outer.momentum = 0.5f;
  o.host_threads = 1;
  return o;
}

// The header the instances above carry, in the order the library writes
// it (the reader looks fields up by name; the order matters only to the
// comparison with the library's writer): scope, policies, memory space,
// rank and world, sizes, then every option as "options.<field>".
std::vector<hfield> header(const std::string& compressor, const std::string& sync, bool seed) {
  std::vector<hfield> h{f_text("scope", "worker"),
                        f_text("policy.inner", "sgd"),
                        f_text("policy.outer", "outer nesterov"),
                        f_text("policy.compressor", compressor),
                        f_text("policy.sync", sync),
                        f_text("memory_space", "host"),
                        f_unsigned("rank", 0),
                        f_unsigned("world", 1),
                        f_unsigned("tensor_count", 2),
                        f_unsigned("tensor.0.elements", n0),
                        f_unsigned("tensor.1.elements", n1),
                        f_unsigned("flat_elements", flat),
                        f_unsigned("options.inner_steps", 4),
                        f_float("options.inner.lr", 0.25f),
                        f_float("options.inner.momentum", 0.5f),
                        f_float("options.inner.dampening", 0.0f),
                        f_float("options.inner.weight_decay", 0.0f),
                        f_bool("options.inner.nesterov", false),
                        f_float("options.inner.max_grad_norm", 0.0f),
                        f_float("options.outer.lr", 0.5f),
                        f_float("options.outer.momentum", 0.5f)};
  if (seed) h.push_back(f_unsigned("options.compress.seed", 0));
  h.push_back(f_bool("options.broadcast_initial", true));
  h.push_back(f_signed("options.host_threads", 1));
  return h;
}

// The values the files hold: dyadic, so every sum and product below is exact.
std::vector<float> ramp(float first, float step, std::size_t n = flat) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = first + step * static_cast<float>(i);
  return v;
}
const std::vector<float> theta = ramp(1.0f, 0.125f);           // θ_global
const std::vector<float> outer_b = ramp(0.0625f, 0.0625f);     // outer momentum b
const std::vector<float> inner_b = ramp(-0.5f, 0.03125f);      // inner momentum
const std::vector<float> residual = ramp(0.015625f, -0.0078125f);  // error-feedback residual
const std::vector<float> start = ramp(1.0f, 0.25f);             // one_step_delay's phase start
const std::vector<float> rep0 = ramp(0.5f, 0.0625f, n0);        // replica, tensor 0
const std::vector<float> rep1 = ramp(0.75f, -0.0625f, n1);      // replica, tensor 1
const std::vector<float> next_residual = ramp(-0.03125f, 0.00390625f);  // what the round in flight commits
// The round in flight's reduced mean as int8 codes; the blocks' factor
// (amax) is 127/16, so code q decodes to q * amax / 127 = q / 16.
const std::vector<std::int8_t> codes{-12, 5, 127, -127, 0, 3, -1, 64};
constexpr float amax = 127.0f / 16.0f;

// sync::blocking, fp32: θ_global, outer.slots, the inner optimizer's slots
// and step count, rounds, the schedule's position and steps in the round,
// fragment 0's outer step count, then the replica.
std::vector<std::byte> blocking_file(std::uint32_t version, const std::vector<hfield>& h) {
  golden_file g(version, h);
  g.buffer("theta_global", theta);
  g.buffer("outer.slots", outer_b);
  g.buffer("inner.slots", inner_b);
  g.scalar("inner.steps", 37);
  g.scalar("rounds", 9);
  g.scalar("schedule.position", 37);
  g.scalar("schedule.steps_in_round", 1);
  g.scalar("fragment.0.outer_steps", 9);
  g.buffer("replica.0", rep0);
  g.buffer("replica.1", rep1);
  return g.bytes();
}
std::vector<std::byte> blocking_file(std::uint32_t version) { return blocking_file(version, header("none", "blocking", false)); }

const std::string int8_fingerprint = "blockwise int8, block 32, round to nearest, error feedback";

// The gathered segments of the round in flight (fragment.0.ready.gathered):
// one slot per rank, each the 64-byte wire header then the reduced shard's
// payload, the slot rounded up to 64 bytes. One rank, two blocks (tensor 0's
// 3 elements, tensor 1's 5; blocks never span tensors) of stride 4 + 32 (an
// fp32 amax, then 32 int8 codes, zero beyond the block's elements): 64 + 72
// = 136, a slot of 192. The header was checked when the round completed,
// before the save; the application reads only the payload, and this file
// leaves the header zero.
std::vector<std::uint8_t> gathered() {
  std::vector<std::uint8_t> g(192, 0);
  std::size_t at = 64;
  for (const auto& [first, len] : {std::pair<std::size_t, std::size_t>{0, n0}, {n0, n1}}) {
    const auto a = std::bit_cast<std::uint32_t>(amax);
    for (int i = 0; i < 4; ++i) g[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(a >> (8 * i));
    for (std::size_t j = 0; j < len; ++j) g[at + 4 + j] = static_cast<std::uint8_t>(codes[first + j]);
    at += 36;
  }
  return g;
}

// sync::one_step_delay, int8 with error feedback: the blocking entries, with
// fragment 0's residual after its outer step count and the phase start
// ("schedule.start") before the replica. `in_flight`: then a scalar
// "in_flight" naming fragment 0 and what applying its reduction reads, under
// "fragment.0.ready.": the verdict (accepted, corrupt, the two norms as the
// doubles' bits, the encoded bytes, the problem as a bytes section), the
// gathered segments (bytes) and the residual the round commits.
std::vector<std::byte> delayed_file(std::uint32_t version, bool in_flight, const std::vector<hfield>& h) {
  golden_file g(version, h);
  g.buffer("theta_global", theta);
  g.buffer("outer.slots", outer_b);
  g.buffer("inner.slots", inner_b);
  g.scalar("inner.steps", 14);
  g.scalar("rounds", 2);
  g.scalar("schedule.position", 14);
  g.scalar("schedule.steps_in_round", 2);
  g.scalar("fragment.0.outer_steps", 2);
  g.buffer("fragment.0.residual", residual);
  g.buffer("schedule.start", start);
  g.buffer("replica.0", rep0);
  g.buffer("replica.1", rep1);
  if (in_flight) {
    g.scalar("in_flight", 0);
    g.scalar("fragment.0.ready.accepted", 1);
    g.scalar("fragment.0.ready.corrupt", 0);
    g.scalar("fragment.0.ready.delta_norm", std::bit_cast<std::uint64_t>(2.5));
    g.scalar("fragment.0.ready.error_norm", std::bit_cast<std::uint64_t>(0.125));
    g.scalar("fragment.0.ready.encoded_bytes", 72);
    g.raw("fragment.0.ready.problem", {});
    g.raw("fragment.0.ready.gathered", gathered());
    g.buffer("fragment.0.ready.next_residual", next_residual);
  }
  return g.bytes();
}
std::vector<std::byte> delayed_file(std::uint32_t version, bool in_flight) {
  return delayed_file(version, in_flight, header(int8_fingerprint, "one_step_delay", true));
}

// ------------------------------------------------------------ reading the instance

struct model {
  std::vector<std::vector<float>> w{std::vector<float>(n0, -3.0f), std::vector<float>(n1, -4.0f)};
};

// Entry `name` of the instance's state: a buffer's values, or a scalar.
template <class T>
std::vector<float> buffer_of(const T& t, const std::string& name) {
  for (const auto& e : t.state())
    if (e.name == name && !e.is_scalar) return {e.data, e.data + e.size};
  FAIL("no buffer entry " << name);
  return {};
}
template <class T>
std::uint64_t scalar_of(const T& t, const std::string& name) {
  for (const auto& e : t.state())
    if (e.name == name && e.is_scalar) return e.value;
  FAIL("no scalar entry " << name);
  return 0;
}
template <class T>
std::vector<std::string> names_of(const T& t) {
  std::vector<std::string> out;
  for (const auto& e : t.state()) out.push_back(e.name);
  return out;
}


// The fresh instance's own state (before any load), to see that a refused
// file leaves it untouched.
template <class T>
std::vector<std::vector<float>> live(const T& t, const model& m) {
  std::vector<std::vector<float>> out;
  for (const auto& e : t.state())
    out.push_back(e.is_scalar ? std::vector<float>{static_cast<float>(e.value)} : std::vector<float>(e.data, e.data + e.size));
  out.push_back(m.w[0]);
  out.push_back(m.w[1]);
  return out;
}

bool equal_bytes(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

// ------------------------------------------------------------ blocking

TEST_CASE("golden checkpoint, sync::blocking, fp32: versions 1 and 2 load into a fresh instance with the values put in") {
  for (const std::uint32_t version : {1u, 2u}) {
    CAPTURE(version);
    dc::comm::local comm;
    model m;
    fp32_blocking t(m.w, comm, options<fp32_blocking>());
    t.load(blocking_file(version));

    CHECK(names_of(t) == std::vector<std::string>{"theta_global", "outer.slots", "inner.slots", "inner.steps", "rounds",
                                                  "schedule.position", "schedule.steps_in_round",
                                                  "fragment.0.outer_steps"});
    CHECK(same_bits(buffer_of(t, "theta_global"), theta));
    CHECK(same_bits(buffer_of(t, "outer.slots"), outer_b));
    CHECK(same_bits(buffer_of(t, "inner.slots"), inner_b));
    CHECK(scalar_of(t, "inner.steps") == 37);
    CHECK(scalar_of(t, "rounds") == 9);
    CHECK(scalar_of(t, "schedule.position") == 37);
    CHECK(scalar_of(t, "schedule.steps_in_round") == 1);
    CHECK(scalar_of(t, "fragment.0.outer_steps") == 9);
    CHECK(t.stats().rounds == 9);
    CHECK(t.steps_in_round() == 1);
    CHECK(same_bits(m.w[0], rep0));
    CHECK(same_bits(m.w[1], rep1));
    // The public views agree: θ_global flat, tensor 1 from element 3 on.
    const auto gp = t.global_parameters();
    CHECK(same_bits(std::vector<float>(gp.data(), gp.data() + gp.size()), theta));
    CHECK(t.global_offset(1) == n0);

    // The library's writer, given this state, writes the version-2 golden
    // bytes (a version-1 file comes back as version 2).
    CHECK(equal_bytes(t.save_bytes(), blocking_file(2)));
  }
}

// ------------------------------------------------------------ one_step_delay, int8 + error feedback

TEST_CASE("golden checkpoint, sync::one_step_delay, int8 + error feedback: versions 1 and 2 load with the values put in") {
  for (const std::uint32_t version : {1u, 2u}) {
    CAPTURE(version);
    dc::comm::local comm;
    model m;
    int8_delayed t(m.w, comm, options<int8_delayed>());
    t.load(delayed_file(version, false));

    CHECK(names_of(t) == std::vector<std::string>{"theta_global", "outer.slots", "inner.slots", "inner.steps", "rounds",
                                                  "schedule.position", "schedule.steps_in_round",
                                                  "fragment.0.outer_steps", "fragment.0.residual", "schedule.start"});
    CHECK(same_bits(buffer_of(t, "theta_global"), theta));
    CHECK(same_bits(buffer_of(t, "outer.slots"), outer_b));
    CHECK(same_bits(buffer_of(t, "inner.slots"), inner_b));
    CHECK(same_bits(buffer_of(t, "fragment.0.residual"), residual));
    const auto r = t.compression_residual();
    CHECK(same_bits(std::vector<float>(r.data(), r.data() + r.size()), residual));
    CHECK(same_bits(buffer_of(t, "schedule.start"), start));
    CHECK(scalar_of(t, "inner.steps") == 14);
    CHECK(scalar_of(t, "rounds") == 2);
    CHECK(scalar_of(t, "schedule.position") == 14);
    CHECK(scalar_of(t, "schedule.steps_in_round") == 2);
    CHECK(scalar_of(t, "fragment.0.outer_steps") == 2);
    CHECK(t.stats().rounds == 2);
    CHECK(t.steps_in_round() == 2);
    CHECK(same_bits(m.w[0], rep0));
    CHECK(same_bits(m.w[1], rep1));
    CHECK(equal_bytes(t.save_bytes(), delayed_file(2, false)));
  }
}

TEST_CASE("golden checkpoint, version 2, one_step_delay: the reduction in flight is restored and applied as the file says") {
  dc::comm::local comm;
  model m;
  int8_delayed t(m.w, comm, options<int8_delayed>());
  const auto file = delayed_file(2, true);
  t.load(file);

  // The state as put in; the round in flight is not applied yet.
  CHECK(same_bits(buffer_of(t, "theta_global"), theta));
  CHECK(same_bits(buffer_of(t, "fragment.0.residual"), residual));
  CHECK(same_bits(buffer_of(t, "schedule.start"), start));
  CHECK(same_bits(m.w[0], rep0));
  CHECK(same_bits(m.w[1], rep1));
  CHECK(t.stats().rounds == 2);
  // The writer gives the file back, the round in flight included.
  CHECK(equal_bytes(t.save_bytes(), file));

  // A second load while that round is in flight is refused (state_error),
  // whatever the file.
  CHECK_THROWS_AS(t.load(delayed_file(2, false)), dc::state_error);

  // finish() applies it. By hand, per element i (outer Nesterov, lr 1/2,
  // momentum 1/2, its third step: b ← μ b + d, θ ← θ − lr (d + μ b); the
  // replica re-based, l ← θ − (s − l), and the start takes it; the
  // residual becomes the one the round commits). d_i = codes[i] / 16. All
  // exact in float.
  t.finish();
  std::vector<float> want_theta(flat), want_b(flat), want_local(flat);
  for (std::size_t i = 0; i < flat; ++i) {
    const double d = static_cast<double>(codes[i]) / 16.0;
    const double b = 0.5 * static_cast<double>(outer_b[i]) + d;
    const double g = d + 0.5 * b;
    const double th = static_cast<double>(theta[i]) - 0.5 * g;
    const double l = static_cast<double>(i < n0 ? rep0[i] : rep1[i - n0]);
    want_theta[i] = static_cast<float>(th);
    want_b[i] = static_cast<float>(b);
    want_local[i] = static_cast<float>(th - (static_cast<double>(start[i]) - l));
    CHECK(static_cast<double>(want_theta[i]) == th);  // exact: the hand computation needs no rounding
    CHECK(static_cast<double>(want_local[i]) == th - (static_cast<double>(start[i]) - l));
  }
  CHECK(same_bits(buffer_of(t, "theta_global"), want_theta));
  CHECK(same_bits(buffer_of(t, "outer.slots"), want_b));
  CHECK(same_bits(buffer_of(t, "fragment.0.residual"), next_residual));
  CHECK(same_bits(buffer_of(t, "schedule.start"), want_local));
  CHECK(same_bits(m.w[0], std::vector<float>(want_local.begin(), want_local.begin() + n0)));
  CHECK(same_bits(m.w[1], std::vector<float>(want_local.begin() + n0, want_local.end())));
  CHECK(scalar_of(t, "fragment.0.outer_steps") == 3);
  CHECK(t.stats().rounds == 3);
  // Untouched by the application: the inner optimizer and the clock.
  CHECK(same_bits(buffer_of(t, "inner.slots"), inner_b));
  CHECK(scalar_of(t, "schedule.position") == 14);
}

// ------------------------------------------------------------ refusals

TEST_CASE("golden checkpoint: a flipped byte, a wrong version or magic, a bytes section in version 1 are format_errors") {
  dc::comm::local comm;
  model mb, md;
  fp32_blocking b(mb.w, comm, options<fp32_blocking>());
  int8_delayed d(md.w, comm, options<int8_delayed>());
  const auto b_before = live(b, mb);
  const auto d_before = live(d, md);

  SUBCASE("every byte flipped, each in turn (blocking version 1, one_step_delay version 2 with a round in flight)") {
    const auto fb = blocking_file(1);
    std::size_t refused = 0;
    for (std::size_t i = 0; i < fb.size(); ++i) {
      auto bad = fb;
      bad[i] ^= std::byte{0x04};
      if (contains(load_error(b, bad), "checkpoint")) ++refused;
    }
    CHECK(refused == fb.size());
    const auto fd = delayed_file(2, true);
    refused = 0;
    for (std::size_t i = 0; i < fd.size(); ++i) {
      auto bad = fd;
      bad[i] ^= std::byte{0x40};
      if (contains(load_error(d, bad), "checkpoint")) ++refused;
    }
    CHECK(refused == fd.size());
  }
  SUBCASE("a wrong version: 0 and 3 (re-sealed, so that the version is what is refused)") {
    for (const std::uint32_t v : {0u, 3u}) {
      CAPTURE(v);
      auto bad = blocking_file(2);
      for (int i = 0; i < 4; ++i) bad[8 + static_cast<std::size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
      const std::string msg = load_error(b, reseal(bad));
      CHECK(contains(msg, "checkpoint format version is " + std::to_string(v)));
    }
  }
  SUBCASE("a wrong magic (re-sealed)") {
    auto bad = delayed_file(2, true);
    bad[7] = std::byte{'X'};  // "DILOCOCX"
    CHECK(contains(load_error(d, reseal(bad)), "not a diloco checkpoint"));
  }
  SUBCASE("a version-1 file cannot hold a reduction in flight: its problem text is a bytes section (kind 4)") {
    const std::string msg = load_error(d, delayed_file(1, true));
    CHECK(contains(msg, "has kind 4"));
  }
  SUBCASE("a header field the instance does not match: options.outer.lr") {
    auto h = header("none", "blocking", false);
    for (auto& f : h)
      if (f.name == "options.outer.lr") f = f_float(f.name, 0.75f);
    CHECK(contains(load_error(b, blocking_file(2, h)), "\"options.outer.lr\""));
  }
  SUBCASE("another configuration's file: the blocking file into the one_step_delay instance") {
    CHECK(contains(load_error(d, blocking_file(2)), "checkpoint header field \"policy.compressor\""));
  }
  CHECK(live(b, mb) == b_before);
  CHECK(live(d, md) == d_before);
}
