// README's first example as the package's test: four workers in one process
// fit y = 2x + 1; it fails unless the fit is close, so the test checks that
// the package works, not only that it links.
#include <diloco/diloco.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::threads>;

int main() {
  std::vector<float> result(2);
  dc::comm::threads::world world(4);
  world.run([&](dc::comm::threads& comm) {
    std::vector<float> w(2, 0.0f);
    trainer t(w, comm, {.inner_steps = 50, .inner = {.lr = 0.01f, .weight_decay = 0.0f}});
    for (int step = 0; step < 2000; ++step) {
      std::vector<float> grad(2, 0.0f);
      for (int i = 0; i < 8; ++i) {
        const float x = static_cast<float>(comm.rank() * 8 + i) / 32.0f;
        const float err = w[0] * x + w[1] - (2.0f * x + 1.0f);
        grad[0] += err * x / 8.0f;
        grad[1] += err / 8.0f;
      }
      t.step(grad);
    }
    if (comm.rank() == 0) result = w;
  });
  std::printf("diloco %d.%d.%d from Conan: w = (%.3f, %.3f)\n", dc::version_major, dc::version_minor,
              dc::version_patch, result[0], result[1]);
  return std::abs(result[0] - 2.0f) < 5e-3f && std::abs(result[1] - 1.0f) < 5e-3f ? 0 : 1;
}
