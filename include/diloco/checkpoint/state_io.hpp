// SPDX-License-Identifier: Apache-2.0
#pragma once

// An engine's visited state <-> checkpoint bytes. Generic over whatever
// visit_state walks: every buffer and scalar it names becomes a section, in
// visit order, so state added to a visit_state is checkpointed with no
// change here. Device buffers are staged through host memory with the
// engine's own executor (to_host / from_host).
//
// A worker checkpoint then holds the reductions that were in flight when it
// was taken (engine_base::settle waited for them without applying them):
// per such fragment a scalar "in_flight" naming it, then what its
// application reads (engine_base::visit_ready: the verdict, the reducer's
// result buffers). A restore puts each back in flight, ready, so the
// schedule applies it at its own step with the same inputs: a run resumed
// from a checkpoint gives the bits of one that never saved.
//
// Restoring verifies everything first (checkpoint::parse: structure and
// checksums; check_header: policies, options, sizes; then every section's
// kind, name and size against the live walk) and only then writes the live
// state; a format_error leaves it untouched.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/checkpoint/format.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/state.hpp"
#include "diloco/engine.hpp"
#include "diloco/reduce/ready.hpp"

namespace diloco::checkpoint {

/// worker: everything one rank needs to resume (its replica, inner state,
/// residuals, schedule buffers, and the global part). global: the part that
/// is equal on every rank (theta_global, the outer state and step counts,
/// rounds, the schedule's clock), written once for a run.
enum class scope { worker, global };

/// "worker" or "global", for messages and the header.
inline const char* to_string(scope s) { return s == scope::worker ? "worker" : "global"; }

namespace detail {

struct live_entry {
  std::string name;
  section_kind kind = section_kind::buffer;
  bool device = false;
  float* data = nullptr;  // buffers
  std::size_t size = 0;   // buffers: elements
  std::uint64_t* value = nullptr;  // scalars
};

inline std::vector<live_entry> walk(diloco::detail::engine_base& e, scope s) {
  struct collector final : state_visitor {
    std::vector<live_entry> out;
    void buffer(std::string_view name, float* data, std::size_t size, bool device) override {
      out.push_back({std::string(name), section_kind::buffer, device, data, size, nullptr});
    }
    void scalar(std::string_view name, std::uint64_t& value) override {
      out.push_back({std::string(name), section_kind::scalar, false, nullptr, 0, &value});
    }
  } c;
  e.visit_state(c);
  if (s == scope::worker) e.visit_replica(c);
  if (s == scope::global) std::erase_if(c.out, [](const live_entry& x) { return !is_global_entry(x.name); });
  return std::move(c.out);
}

/// The scalar section that opens a fragment's in-flight entries; its value is the fragment.
inline constexpr std::string_view in_flight_section = "in_flight";
/// The longest text an in-flight entry may hold (a verdict's problem).
inline constexpr std::size_t max_text_bytes = std::size_t{1} << 20;

// Writes a ready reduction's entries as sections (device buffers staged).
class ready_writer final : public reduce::ready_visitor {
 public:
  ready_writer(writer& w, diloco::detail::engine_base& e) : w_(w), e_(e) {}
  void floats(std::string_view name, float* data, std::size_t size, bool device) override {
    if (device) {
      staging_.resize(size);
      e_.to_host(staging_.data(), data, size);
      data = staging_.data();
    }
    w_.buffer(name, data, size);
  }
  void bytes(std::string_view name, std::byte* data, std::size_t size, bool device) override {
    if (device) {
      bytes_.resize(size);
      e_.to_host(bytes_.data(), data, size);
      data = bytes_.data();
    }
    w_.bytes(name, data, size);
  }
  void scalar(std::string_view name, std::uint64_t& value) override { w_.scalar(name, value); }
  void text(std::string_view name, std::string& value) override {
    w_.bytes(name, reinterpret_cast<const std::byte*>(value.data()), value.size());
  }

 private:
  writer& w_;
  diloco::detail::engine_base& e_;
  std::vector<float> staging_;
  std::vector<std::byte> bytes_;
};

// Walks a ready reduction's entries against the file's sections from
// `at` on: kind, name and size must match (a text may have any length up to
// max_text_bytes). `load`: copies each into the live entry; else only
// checks, handing scalars and texts their values from the file (the visit
// may check them; they are scratch in an instance with nothing in flight).
class ready_reader final : public reduce::ready_visitor {
 public:
  ready_reader(const image& img, std::size_t at, std::size_t fragment, diloco::detail::engine_base& e, bool load)
      : img_(img), at_(at), fragment_(fragment), e_(e), load_(load) {}
  std::size_t at() const { return at_; }

  void floats(std::string_view name, float* data, std::size_t size, bool device) override {
    const section& f = next(section_kind::buffer, name, size, false);
    if (!load_) return;
    if (device) {
      staging_.resize(size);
      img_.floats(f, staging_.data());
      e_.from_host(data, staging_.data(), size);
    } else {
      img_.floats(f, data);
    }
  }
  void bytes(std::string_view name, std::byte* data, std::size_t size, bool device) override {
    const section& f = next(section_kind::bytes, name, size, false);
    if (!load_) return;
    if (device) {
      bytes_.resize(size);
      img_.raw(f, bytes_.data());
      e_.from_host(data, bytes_.data(), size);
    } else {
      img_.raw(f, data);
    }
  }
  void scalar(std::string_view name, std::uint64_t& value) override {
    value = img_.scalar(next(section_kind::scalar, name, 1, false));
  }
  void text(std::string_view name, std::string& value) override {
    const section& f = next(section_kind::bytes, name, 0, true);
    value.assign(reinterpret_cast<const char*>(img_.bytes.data() + f.payload_offset), f.payload_bytes);
  }

 private:
  // The next section, which must be `kind` "name" of `size` elements (a
  // `text`: any length up to max_text_bytes).
  const section& next(section_kind kind, std::string_view name, std::size_t size, bool text) {
    using diloco::detail::concat;
    using diloco::detail::raise;
    const char* unit = kind == section_kind::buffer ? " floats" : " bytes";
    if (at_ >= img_.sections.size())
      raise<format_error>("checkpoint ends in fragment ", fragment_, "'s reduction in flight; this instance expects ",
                          to_string(kind), " \"", name, "\" next");
    const section& f = img_.sections[at_];
    const bool fits = text ? f.payload_bytes <= max_text_bytes : f.elements() == size;
    if (f.kind != kind || f.name != name || !fits)
      raise<format_error>("checkpoint state section ", at_, " is ", to_string(f.kind), " \"", f.name, "\"",
                          f.kind == section_kind::scalar ? "" : concat(" of ", f.elements(), f.kind == section_kind::buffer ? " floats" : " bytes"),
                          "; this instance expects ", to_string(kind), " \"", name, "\"",
                          kind == section_kind::scalar ? ""
                          : text                        ? concat(" of at most ", max_text_bytes, " bytes")
                                                        : concat(" of ", size, unit),
                          " (fragment ", fragment_, "'s reduction in flight)");
    ++at_;
    return f;
  }

  const image& img_;
  std::size_t at_;
  std::size_t fragment_;
  diloco::detail::engine_base& e_;
  bool load_;
  std::vector<float> staging_;
  std::vector<std::byte> bytes_;
};

// The user's own bytes (algorithm::save(path, writer)): the file's last
// section, after the reductions in flight.
inline constexpr const char* user_section = "user";

inline std::vector<std::byte> serialize(diloco::detail::engine_base& e, const std::vector<expected_field>& fields,
                                        scope s, const std::vector<std::byte>* user = nullptr) {
  std::vector<field> header;
  for (const expected_field& x : fields) header.push_back(x.f);
  writer w(header);
  std::vector<float> staging;
  for (const live_entry& x : walk(e, s)) {
    if (x.kind == section_kind::scalar) {
      w.scalar(x.name, *x.value);
    } else if (x.device) {
      staging.resize(x.size);
      e.to_host(staging.data(), x.data, x.size);
      w.buffer(x.name, staging.data(), x.size);
    } else {
      w.buffer(x.name, x.data, x.size);
    }
  }
  // The reductions in flight, settled by the caller (worker scope only: a
  // reduction's result and residual are this rank's).
  if (s == scope::worker)
    for (std::size_t p = 0; p < e.fragment_count(); ++p) {
      if (!e.ready(p)) continue;
      w.scalar(in_flight_section, p);
      ready_writer rw(w, e);
      e.visit_ready(p, rw);
    }
  if (user) w.bytes(user_section, user->data(), user->size());
  return std::move(w).finish();
}

// `user`: where the user's section goes (a format_error when the file has
// none); without it such a section is skipped.
inline void restore(diloco::detail::engine_base& e, std::span<const std::byte> bytes,
                    const std::vector<expected_field>& expected, scope s, std::vector<std::byte>* user = nullptr) {
  using diloco::detail::raise;
  const image img = parse(bytes);
  check_header(img, expected);
  const std::vector<live_entry> live = walk(e, s);
  const std::size_t in_file = img.sections.size() - 1;
  for (std::size_t i = 0; i < in_file && i < live.size(); ++i) {
    const section& f = img.sections[i + 1];
    const live_entry& x = live[i];
    const std::size_t want = x.kind == section_kind::buffer ? x.size : 1;
    if (f.kind != x.kind || f.name != x.name || f.elements() != want)
      raise<format_error>("checkpoint state section ", i + 1, " is ", to_string(f.kind), " \"", f.name, "\"",
                          f.kind == section_kind::buffer ? diloco::detail::concat(" of ", f.elements(), " floats") : "",
                          "; this instance expects ", to_string(x.kind), " \"", x.name, "\"",
                          x.kind == section_kind::buffer ? diloco::detail::concat(" of ", want, " floats") : "");
  }
  // Past the visited state: the reductions that were in flight, each
  // opened by a scalar naming its fragment (in increasing order).
  std::vector<std::pair<std::size_t, std::size_t>> ready;  // fragment, its first entry's section
  std::size_t at = live.size() + 1;
  while (in_file > live.size() && at < img.sections.size()) {
    const section& m = img.sections[at];
    if (s != scope::worker || m.kind != section_kind::scalar || m.name != in_flight_section) break;
    const std::uint64_t p = img.scalar(m);
    if (p >= e.fragment_count() || (!ready.empty() && p <= ready.back().first))
      raise<format_error>("checkpoint section ", at, " names fragment ", p, "'s reduction in flight; this instance has ",
                          e.fragment_count(), " fragment", e.fragment_count() == 1 ? "" : "s",
                          ", each named at most once, in increasing order",
                          ready.empty() ? "" : diloco::detail::concat(" (the previous was ", ready.back().first, ")"));
    ready.push_back({static_cast<std::size_t>(p), at + 1});
    ready_reader check(img, at + 1, static_cast<std::size_t>(p), e, false);
    e.visit_ready(static_cast<std::size_t>(p), check);
    at = check.at();
  }
  const bool has_user = at < img.sections.size() && at > live.size() && img.sections[at].kind == section_kind::bytes &&
                        img.sections[at].name == user_section;
  if (user && !has_user)
    raise<format_error>("checkpoint holds no user state (it was written by save(path), not save(path, writer)); "
                        "load(path) restores the library's state alone");
  const std::size_t user_at = at;
  if (has_user) ++at;
  if (in_file < live.size() || at != img.sections.size())
    raise<format_error>("checkpoint has ", in_file, " state sections; this instance has ", live.size(),
                        ready.empty() ? "" : diloco::detail::concat(" and ", at - live.size() - 1, " of reductions in flight"),
                        in_file < live.size() ? diloco::detail::concat(" (the file lacks \"", live[in_file].name, "\")")
                                              : diloco::detail::concat(" (the file has an extra \"",
                                                                       img.sections[at].name, "\")"));
  // Everything checked: only now is the live state written.
  std::vector<float> staging;
  for (std::size_t i = 0; i < live.size(); ++i) {
    const section& f = img.sections[i + 1];
    const live_entry& x = live[i];
    if (x.kind == section_kind::scalar) {
      *x.value = img.scalar(f);
    } else if (x.device) {
      staging.resize(x.size);
      img.floats(f, staging.data());
      e.from_host(x.data, staging.data(), x.size);
    } else {
      img.floats(f, x.data);
    }
  }
  for (const auto& [p, first] : ready) {
    ready_reader load(img, first, p, e, true);
    e.visit_ready(p, load);
    e.set_ready(p);
  }
  if (user && has_user) {
    user->resize(img.sections[user_at].elements());
    img.raw(img.sections[user_at], user->data());
  }
}

}  // namespace detail
}  // namespace diloco::checkpoint
