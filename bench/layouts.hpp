// SPDX-License-Identifier: Apache-2.0
#pragma once

// Layouts of the same parameters as many tensors, for the benchmarks that
// compare a many-tensor model with one flat tensor (bench_outer_step,
// bench_cuda_kernels): `--tensors 1,64,1024,4096,mixed`.

#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace bench {

// n parameters as `layout` ("mixed", or a tensor count T: T equal tensors,
// the last taking the remainder).
inline std::vector<std::size_t> layout_sizes(const std::string& layout, std::size_t n) {
  std::vector<std::size_t> sizes;
  if (layout == "mixed") {
    // Layers of width d = 256: q,k,v (3 d x d), the projection (d x d), the
    // MLP (4d x d, d x 4d), their biases (3d, d, 4d, d) and two layer
    // norms (d, d each); as many layers as fit, then an embedding table
    // takes the rest.
    const std::size_t d = 256;
    const std::vector<std::size_t> layer = {3 * d * d, d * d, 4 * d * d, 4 * d * d, 3 * d, d, 4 * d, d, d, d, d, d};
    std::size_t per_layer = 0;
    for (std::size_t x : layer) per_layer += x;
    std::size_t used = 0;
    while (used + per_layer <= n) {
      sizes.insert(sizes.end(), layer.begin(), layer.end());
      used += per_layer;
    }
    if (used < n) sizes.insert(sizes.begin(), n - used);
    return sizes;
  }
  const std::size_t t = std::stoul(layout);
  for (std::size_t k = 0; k < t; ++k) sizes.push_back(k + 1 < t ? n / t : n - (t - 1) * (n / t));
  return sizes;
}

// CLI11 check of a --tensors list: "" when every item is "mixed" or a
// tensor count in [1, 10^6], else the message.
inline std::string check_layouts(const std::string& list) {
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    if (item != "mixed" && (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
                            item.size() > 7 || std::stoul(item) == 0 || std::stoul(item) > 1000000))
      return "'" + item + "' is neither mixed nor a tensor count in [1, 1000000]";
  return {};
}

// The items of a --tensors list.
inline std::vector<std::string> layout_names(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

}  // namespace bench
