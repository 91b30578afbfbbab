#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: a warnings-as-errors release build with every
# backend that is installed, then the host tests again under ASan+UBSan and
# the threaded tests under TSan. Exits non-zero on the first failure. The
# sanitizer builds leave out the benchmarks, skip the slow tests (the demo's
# training runs among them: release only) and the `codegen` one (whether
# -O3 -mfma changes the bits: release only), and build only the targets of
# the tests they run (scripts/build-tested.py). Which stage runs which tests,
# and why: test/README.md. Clang
# compiles the sanitizer builds: less than half GCC's time at -O0 with ASan
# (test_compressed_mean: 24 s against 61 s), and a second compiler's
# warnings; their debug information is line tables only
# (-gline-tables-only: reports keep file and line; 6 % less compile time than
# -g). Ninja builds every stage: CMake's Makefiles build several named
# targets one after another (.NOTPARALLEL), which left one core idle.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
jobs=$(nproc)

# cmake's configure arguments for build tree $1: Ninja for a new tree, the
# tree's own generator for an existing one (cmake refuses to switch).
generator() {
  if [ -f "$1/CMakeCache.txt" ]; then return; fi
  echo "-G Ninja"
}

# Each stage's header says how long the run has taken so far (bash's
# SECONDS), so a log shows what each stage cost.
stage() { echo "== $1 ($((SECONDS / 60)) min $((SECONDS % 60)) s since the start)"; }

stage "release build, all tests"
cmake -S . -B build $(generator build) -DCMAKE_BUILD_TYPE=Release -DDILOCO_WARNINGS_AS_ERRORS=ON
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

stage "Python package: pip install . and pytest"
# A virtual environment from Debian's python3 with its system packages
# (python3-torch, python3-numpy), in a build folder; scikit-build-core keeps
# its CMake tree in build-python/cmake, so a run rebuilds only what changed.
py=build-python/venv/bin/python
[ -x "$py" ] || /usr/bin/python3 -m venv --system-site-packages build-python/venv
"$py" -c "import nanobind, scikit_build_core, pytest" 2>/dev/null ||
  "$py" -m pip install -q nanobind scikit-build-core pytest
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$py" -m pip install -q --no-build-isolation . \
  --config-settings=build-dir=build-python/cmake --config-settings=cmake.define.DILOCO_WARNINGS_AS_ERRORS=ON
(cd python/tests && "../../$py" -m pytest -q -p no:cacheprovider)

stage "ASan + UBSan"
cmake -S . -B build-asan $(generator build-asan) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDILOCO_WARNINGS_AS_ERRORS=ON \
  -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
  -DDILOCO_SANITIZE=address,undefined -DDILOCO_ENABLE_CUDA=OFF -DDILOCO_ENABLE_TORCH=OFF -DDILOCO_BUILD_BENCHMARKS=OFF
asan_tests=(-L "unit|asan" -LE "slow|packaging|compile|codegen|demo")
scripts/build-tested.py build-asan "$jobs" "${asan_tests[@]}"
ctest --test-dir build-asan --output-on-failure -j"$jobs" "${asan_tests[@]}"

stage "ASan + UBSan (g++): the libtorch adapter and wrapper mode"
# Clang 14 cannot compile libtorch 1.13's headers as C++20 (an incomplete
# c10::IValue in std::vector), so test_torch and test_external (inner::external
# driving torch::optim, the user's state in the checkpoint) run under g++'s
# sanitizers. Without the precompiled headers: the two files build side by
# side, and a shared header would be built first, alone, on their path.
cmake -S . -B build-asan-torch $(generator build-asan-torch) -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=Debug \
  -DDILOCO_WARNINGS_AS_ERRORS=ON -DDILOCO_SANITIZE=address,undefined -DDILOCO_ENABLE_CUDA=OFF -DDILOCO_ENABLE_TORCH=ON \
  -DDILOCO_BUILD_BENCHMARKS=OFF -DDILOCO_BUILD_EXAMPLES=OFF -DDILOCO_TEST_PCH=OFF
torch_tests=(-R "^(test_torch|test_external)$")
scripts/build-tested.py build-asan-torch "$jobs" "${torch_tests[@]}"
ctest --test-dir build-asan-torch --output-on-failure "${torch_tests[@]}" --no-tests=error

stage "TSan (threads communicator, Gloo, threaded engine tests)"
# OpenMP is off here: its runtime is not instrumented and would report its own
# synchronization as races.
cmake -S . -B build-tsan $(generator build-tsan) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDILOCO_WARNINGS_AS_ERRORS=ON \
  -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
  -DDILOCO_SANITIZE=thread -DDILOCO_ENABLE_CUDA=OFF -DDILOCO_ENABLE_OPENMP=OFF -DDILOCO_ENABLE_TORCH=OFF \
  -DDILOCO_BUILD_BENCHMARKS=OFF
tsan_tests=(-L "threads|tsan" -LE "slow|codegen|replay")
scripts/build-tested.py build-tsan "$jobs" "${tsan_tests[@]}"
ctest --test-dir build-tsan --output-on-failure -j"$jobs" "${tsan_tests[@]}"

stage "all test suites passed"
