// SPDX-License-Identifier: Apache-2.0
// The compiled grid, and the run-time choice in it (trainer.hpp).
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "trainer.hpp"

namespace diloco::python {

namespace {
struct low_precision_registries {
  registry_of<bfloat16> bf16;
  registry_of<float16> fp16;
};
const low_precision_registries& low_precision() {
  static const low_precision_registries r = [] {
    low_precision_registries out;
    register_low_precision(out.bf16, out.fp16);
    return out;
  }();
  return r;
}
}  // namespace

template <>
const registry_of<float>& registry<float>() {
  static const trainer_registry r = [] {
    trainer_registry out;
    register_blocking(out);
    register_one_step_delay(out);
    register_streaming(out);
    return out;
  }();
  return r;
}
template <>
const registry_of<bfloat16>& registry<bfloat16>() {
  return low_precision().bf16;
}
template <>
const registry_of<float16>& registry<float16>() {
  return low_precision().fp16;
}

namespace {
// The values of one axis (0 outer, 1 compress, 2 sync) that E's grid has, quoted, comma-separated.
template <class E>
std::string axis_values(std::size_t axis, const std::string& where_outer = "", const std::string& where_sync = "") {
  std::set<std::string> values;
  for (const auto& [key, f] : registry<E>()) {
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

template <class E>
std::unique_ptr<trainer_base> make(const trainer_config& c, std::vector<std::span<E>>& params, any_comm comm) {
  const std::string key = c.outer + "|" + c.compress + "|" + c.sync;
  const auto it = registry<E>().find(key);
  if (it != registry<E>().end()) return it->second(c, params, std::move(comm));
  const std::string dtype = std::is_same_v<E, float> ? "" : std::string(" with ") + low_precision_name_v<E> + " parameters";
  if (axis_values<E>(0).find("'" + c.outer + "'") == std::string::npos)
    throw std::invalid_argument("diloco: outer optimizer '" + c.outer + "' is not compiled in" + dtype +
                                "; allowed: " + axis_values<E>(0));
  if (axis_values<E>(2).find("'" + c.sync + "'") == std::string::npos)
    throw std::invalid_argument("diloco: sync '" + c.sync + "' is not compiled in" + dtype +
                                "; allowed: " + axis_values<E>(2));
  throw std::invalid_argument("diloco: compress '" + c.compress + "' with outer '" + c.outer + "' and sync '" +
                              c.sync + "' is not compiled in" + dtype + "; allowed with them: " +
                              axis_values<E>(1, c.outer, c.sync) + " (docs/python.md lists the compiled grid)");
}
}  // namespace

std::unique_ptr<trainer_base> make_trainer(const trainer_config& c, std::vector<std::span<float>>& params,
                                           any_comm comm) {
  return make(c, params, std::move(comm));
}
std::unique_ptr<trainer_base> make_trainer(const trainer_config& c, std::vector<std::span<bfloat16>>& params,
                                           any_comm comm) {
  return make(c, params, std::move(comm));
}
std::unique_ptr<trainer_base> make_trainer(const trainer_config& c, std::vector<std::span<float16>>& params,
                                           any_comm comm) {
  return make(c, params, std::move(comm));
}

}  // namespace diloco::python
