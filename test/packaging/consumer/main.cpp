// SPDX-License-Identifier: Apache-2.0
// Trains y = 3x - 1 with two simulated workers; exits non-zero unless the
// fit is close, so the test checks that the package works, not just links.
#include <cmath>
#include <cstdio>
#include <diloco/diloco.hpp>
#include <vector>

namespace dc = diloco;

// OpenMP is what the consumer chose, not what diloco was installed with.
#if EXPECT_OPENMP && !defined(_OPENMP)
#error "the consumer linked diloco::openmp but is not compiled with OpenMP"
#elif !EXPECT_OPENMP && defined(_OPENMP)
#error "diloco::diloco forced OpenMP on a consumer that did not ask for it"
#endif

#if defined(DILOCO_PACKAGE_VERSION)
static_assert(DILOCO_VERSION == (DILOCO_PACKAGE_VERSION), "find_package's version differs from diloco/version.hpp");
#endif

int main() {
  // With OpenMP the host executor takes the team size it is given; without,
  // it runs every pass on the calling thread.
  const int threads = dc::exec::host(3).threads();
  if (threads != (EXPECT_OPENMP ? 3 : 1)) {
    std::printf("host executor: %d threads, expected %d\n", threads, EXPECT_OPENMP ? 3 : 1);
    return 1;
  }
  std::printf("host executor: %d threads (OpenMP %s)\n", threads, EXPECT_OPENMP ? "on" : "off");
  using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;
  dc::comm::threads::world world(2);
  std::vector<float> result(2);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w{0.0f, 0.0f};  // slope, intercept
    trainer t(w, comm, {.inner_steps = 10, .inner = {.lr = 0.3f, .momentum = 0.5f}});
    std::vector<float> g(2);
    for (int step = 0; step < 1000; ++step) {
      g = {0.0f, 0.0f};
      for (int i = 0; i < 8; ++i) {
        const float x = static_cast<float>(comm.rank() * 8 + i) / 16.0f;
        const float err = w[0] * x + w[1] - (3.0f * x - 1.0f);
        g[0] += err * x / 8.0f;
        g[1] += err / 8.0f;
      }
      t.step(g);
    }
    if (comm.rank() == 0) result = w;
  });
  std::printf("slope %.4f intercept %.4f\n", result[0], result[1]);
  return std::abs(result[0] - 3.0f) < 1e-2f && std::abs(result[1] + 1.0f) < 1e-2f ? 0 : 1;
}
