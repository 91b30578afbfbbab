// SPDX-License-Identifier: Apache-2.0
// The compiled grid, and the run-time choice in it (trainer.hpp).
#include <set>
#include <stdexcept>
#include <string>

#include "trainer.hpp"

namespace diloco::python {

const trainer_registry& registry() {
  static const trainer_registry r = [] {
    trainer_registry out;
    register_blocking(out);
    register_one_step_delay(out);
    register_streaming(out);
    return out;
  }();
  return r;
}

namespace {
// The values of one axis (0 outer, 1 compress, 2 sync) that the grid has, quoted, comma-separated.
std::string axis_values(std::size_t axis, const std::string& where_outer = "", const std::string& where_sync = "") {
  std::set<std::string> values;
  for (const auto& [key, f] : registry()) {
    const auto a = key.find('|'), b = key.rfind('|');
    const std::string parts[3] = {key.substr(0, a), key.substr(a + 1, b - a - 1), key.substr(b + 1)};
    if (!where_outer.empty() && parts[0] != where_outer) continue;
    if (!where_sync.empty() && parts[2] != where_sync) continue;
    values.insert(parts[axis]);
  }
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "'" : ", '") + v + "'";
  return out;
}
}  // namespace

std::unique_ptr<trainer_base> make_trainer(const trainer_config& c, std::vector<std::span<float>>& params,
                                           any_comm comm) {
  const std::string key = c.outer + "|" + c.compress + "|" + c.sync;
  const auto it = registry().find(key);
  if (it != registry().end()) return it->second(c, params, std::move(comm));
  if (axis_values(0).find("'" + c.outer + "'") == std::string::npos)
    throw std::invalid_argument("diloco: outer optimizer '" + c.outer + "' is not compiled in; allowed: " +
                                axis_values(0));
  if (axis_values(2).find("'" + c.sync + "'") == std::string::npos)
    throw std::invalid_argument("diloco: sync '" + c.sync + "' is not compiled in; allowed: " + axis_values(2));
  throw std::invalid_argument("diloco: compress '" + c.compress + "' with outer '" + c.outer + "' and sync '" +
                              c.sync + "' is not compiled in; allowed with them: " + axis_values(1, c.outer, c.sync) +
                              " (docs/python.md lists the compiled grid)");
}

}  // namespace diloco::python
