// SPDX-License-Identifier: Apache-2.0
#pragma once

// An engine's visited state <-> checkpoint bytes. Generic over whatever
// visit_state walks: every buffer and scalar it names becomes a section, in
// visit order, so state added to a visit_state is checkpointed with no
// change here. Device buffers are staged through host memory with the
// engine's own executor (to_host / from_host).
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

inline std::vector<std::byte> serialize(diloco::detail::engine_base& e, const std::vector<expected_field>& fields,
                                        scope s) {
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
  return std::move(w).finish();
}

inline void restore(diloco::detail::engine_base& e, std::span<const std::byte> bytes,
                    const std::vector<expected_field>& expected, scope s) {
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
  if (in_file != live.size())
    raise<format_error>("checkpoint has ", in_file, " state sections; this instance has ", live.size(),
                        in_file < live.size() ? diloco::detail::concat(" (the file lacks \"", live[in_file].name, "\")")
                                              : diloco::detail::concat(" (the file has an extra \"",
                                                                       img.sections[live.size() + 1].name, "\")"));
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
}

}  // namespace detail
}  // namespace diloco::checkpoint
