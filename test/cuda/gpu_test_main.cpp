// SPDX-License-Identifier: Apache-2.0
// Main of the CUDA test programs. Test cases named "gpu: ..." need a device
// and are skipped, with a line saying so, when there is none (any runtime
// error counts as none); cases named "no gpu: ..." check how the library
// fails without one and run only then. Everything else always runs. Without
// a device the program exits 77 once the rest has passed, which CTest
// (SKIP_RETURN_CODE 77, test/cuda/CMakeLists.txt) reports as skipped, as
// it does the NCCL device tests: a build without a GPU must not count the
// GPU cases as passed. A failure still fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <diloco/core/cuda_error.hpp>

int main(int argc, char** argv) {
  doctest::Context context;
  const int devices = diloco::cuda_device_count();
  if (devices == 0) {
    std::printf("no GPU: skipping the GPU test cases\n");
    context.addFilter("test-case-exclude", "gpu:*");
  } else {
    std::printf("%d GPU(s): running the GPU test cases\n", devices);
    context.addFilter("test-case-exclude", "no gpu:*");
  }
  context.applyCommandLine(argc, argv);
  const int failed = context.run();
  if (context.shouldExit()) return failed;  // --help, --list-test-cases and the like
  if (devices == 0 && failed == 0) {
    std::printf("SKIPPED: no GPU, so the gpu: test cases did not run (exit 77)\n");
    return 77;
  }
  return failed;
}
