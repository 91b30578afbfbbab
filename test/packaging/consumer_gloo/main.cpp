// SPDX-License-Identifier: Apache-2.0
// Two ranks (threads of this process, each with its own Gloo communicator
// over loopback TCP) fit y = 3x - 1 with DiLoCo; exits non-zero unless the
// fit is close, so the test checks that the component works, not just links.
// Under the installed launcher (DILOCO_RANK set: `diloco-launch 2 --
// consumer`) each process is one rank, found with comm::gloo::from_env().
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <diloco/comm/gloo.hpp>
#include <diloco/diloco.hpp>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace dc = diloco;
using trainer = dc::algorithm<dc::inner::sgd, dc::outer::nesterov, dc::compress::none, dc::comm::gloo>;

// Trains rank comm.rank()'s share and returns the replica.
static std::vector<float> fit(dc::comm::gloo& comm) {
  std::vector<float> w{0.0f, 0.0f};  // slope, intercept
  trainer t(w, comm, {.inner_steps = 10, .inner = {.lr = 0.3f, .momentum = 0.5f}});
  std::vector<float> g(2);
  for (int step = 0; step < 1000; ++step) {
    g = {0.0f, 0.0f};
    for (int i = 0; i < 8; ++i) {
      const float x = static_cast<float>(comm.rank() * 8 + i) / (8.0f * static_cast<float>(comm.size()));
      const float err = w[0] * x + w[1] - (3.0f * x - 1.0f);
      g[0] += err * x / 8.0f;
      g[1] += err / 8.0f;
    }
    t.step(g);
  }
  return w;
}

static bool fits(const std::vector<float>& w) { return std::abs(w[0] - 3.0f) < 1e-2f && std::abs(w[1] + 1.0f) < 1e-2f; }

int main() {
  if (std::getenv("DILOCO_RANK") != nullptr) {
    try {
      auto comm = dc::comm::gloo::from_env();
      const auto w = fit(comm);
      std::printf("process rank %d of %d: slope %.4f intercept %.4f\n", comm.rank(), comm.size(), w[0], w[1]);
      return comm.size() == 2 && fits(w) ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  }
  std::string dir = (std::filesystem::temp_directory_path() / "diloco-consumer-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return 2;
  std::vector<float> result(2);
  bool failed = false;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        dc::comm::gloo comm({.rank = r, .size = 2, .rendezvous = dc::comm::gloo::file_store{dir}});
        auto w = fit(comm);
        if (r == 0) result = w;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        failed = true;
      }
    });
  }
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  std::printf("slope %.4f intercept %.4f\n", result[0], result[1]);
  return !failed && fits(result) ? 0 : 1;
}
