// SPDX-License-Identifier: Apache-2.0
// The package's test: one round of model averaging (FedAvg: outer SGD with
// lr 1 and no momentum, outer::sgd's defaults) with two workers, checked
// against its closed form. Worker m sees the constant gradient -(m + 1);
// H = 4 inner SGD steps of lr 0.5 take its replica from 0 to 2(m + 1), and
// the outer step sets every replica to their mean, (2 + 4) / 2 = 3 (every
// value exact in binary floating point). Run under the packaged launcher
// (bin/diloco-launch 2 -- test_package) it says which process it is; with
// the json component it prints the statistics as JSON too.
#include <diloco/diloco.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#if DILOCO_TEST_JSON
#include <diloco/core/json.hpp>
#endif

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::comm::threads>;

int main() {
  std::vector<float> after(2, -1.0f);
  std::uint64_t rounds = 0;
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(3, 0.0f);
    const std::vector<float> grad(3, -static_cast<float>(comm.rank() + 1));
    trainer t(w, comm, {.inner_steps = 4, .inner = {.lr = 0.5f}});
    for (int step = 0; step < 4; ++step) t.step(grad);
    after[static_cast<std::size_t>(comm.rank())] = w[0] == w[1] && w[1] == w[2] ? w[0] : -1.0f;
#if DILOCO_TEST_JSON
    if (comm.rank() == 0) std::printf("stats as JSON: %s\n", nlohmann::json(t.stats()).dump().c_str());
#endif
    if (comm.rank() == 0) rounds = t.stats().rounds;
  });
  const char* rank = std::getenv("DILOCO_RANK");
  std::printf("diloco %d.%d.%d from Conan%s%s: after %llu averaging round the replicas are %g and %g (expected 3)\n",
              dc::version_major, dc::version_minor, dc::version_patch, rank ? ", process rank " : "",
              rank ? rank : "", static_cast<unsigned long long>(rounds), static_cast<double>(after[0]),
              static_cast<double>(after[1]));
  return after[0] == 3.0f && after[1] == 3.0f && rounds == 1 ? 0 : 1;
}
