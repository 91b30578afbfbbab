#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: a warnings-as-errors release build with every
# backend that is installed, then the host tests under ASan+UBSan (the
# release build compiles those with g++'s -fsyntax-only and leaves their runs
# to that stage) and the threaded tests under TSan. Exits non-zero on the
# first failure. The
# sanitizer builds leave out the benchmarks, skip the slow tests (the demo's
# training runs among them: release only) and the `codegen` ones (whether
# -O3 -mfma changes the bits; chunk_topk's encode vectorized at -O3:
# release only), and build only the targets of
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
# ctest runs one test more than there are cores: several tests spend much of
# their time waiting (a peer's death detected by a timeout, processes
# starting, Gloo's rendezvous), and at -j$(nproc) the release stage's tests
# kept the two cores 172 % busy. Measured on one built tree (2026-11-30,
# /usr/bin/time ctest): release 434 -> 380 s (191 % busy), ASan 86 -> 65 s,
# TSan 38 -> 31 s, the same CPU time, every test passing.
ctest_jobs=$((jobs + 1))

# cmake's configure arguments for build tree $1: Ninja for a new tree, the
# tree's own generator for an existing one (cmake refuses to switch).
generator() {
  if [ -f "$1/CMakeCache.txt" ]; then return; fi
  echo "-G Ninja"
}

# Each stage's header says how long the run has taken so far (bash's
# SECONDS), so a log shows what each stage cost.
stage() { echo "== $1 ($((SECONDS / 60)) min $((SECONDS % 60)) s since the start)"; }

# GCC collects its garbage each time its heap grows by 30-100 % beyond about
# 128 MB: on these template-heavy files that is about a tenth of the compile
# (2026-11-30, two alternated pairs each: train_char_mlp.cpp at -O3 59-61 s
# against 67-68 s, test_checkpoint.cpp at -O0 33 s against 36-39 s), so the
# GCC builds here let the heap grow to 4 GB first (peak 2.4 and 2.0 GB
# against 1.5 and 1.6: two compiles at a time fit 24 GB). The parameters
# only schedule the collector; the code GCC emits is the same. nvcc passes
# them to its host compiler.
gcc_params="--param=ggc-min-expand=1000 --param=ggc-min-heapsize=4000000"

# The release tree compiles at -Og, not CMake's Release -O3: the tests
# compile at -O0 in any case (test/CMakeLists.txt) and test_demo and the
# codegen probes keep -O3 of their own, so this is the examples and the
# benchmarks, whose speed ./test.sh does not measure (their smoke runs take
# seconds) and whose bits the level does not change (no -ffast-math, no FMA
# in the baseline x86-64 target: the demo's and the GPT example's tests
# compare printed losses against the threads' runs and the documented
# tables); the CUDA files' host code keeps -O1. Compile time, 2026-11-30,
# two compiles side by side: train_char_mlp.cpp 73 s at -O3, 55 s at -O2,
# 37 s at -O1; train_gpt.cpp 124, 111, 86 s; sweep.cpp 92, 73, 55 s; the
# twelve C++ examples and benchmarks 397 CPU-s at -O1, 262 at -Og (-j2, the
# same machine, the same day), and the 71 tests that run them 90-94 CPU-s
# at -O1, 102-115 at -Og (two alternated runs): 115-125 CPU-s less in all.
# Measure speed in a tree of your own (CMake's Release), as
# docs/performance.md does.
release_flags="-Og -DNDEBUG"
cuda_release_flags="-O1 -DNDEBUG"
# The sanitizer stages' trees and tests; the two ASan trees are configured
# with the release tree, below, which needs their tests' names.
configure_asan() {
  cmake -S . -B build-asan $(generator build-asan) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDILOCO_WARNINGS_AS_ERRORS=ON \
    -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
    -DDILOCO_SANITIZE=address,undefined -DDILOCO_ENABLE_CUDA=OFF -DDILOCO_ENABLE_TORCH=OFF -DDILOCO_BUILD_BENCHMARKS=OFF
}
# Not the docs' and the README's programs (labels docs, readme): drivers of
# the library's public calls, which the unit tests here run; the release
# stage runs them as written. They were 71 of this build's 682 CPU seconds
# (2026-11-30).
asan_tests=(-L "unit|asan" -LE "slow|packaging|compile|codegen|demo|docs|readme")
# Clang 14 cannot compile libtorch 1.13's headers as C++20 (an incomplete
# c10::IValue in std::vector), so test_torch and test_external (inner::external
# driving torch::optim, the user's state in the checkpoint) run under g++'s
# sanitizers. Without the precompiled headers: the two files build side by
# side, and a shared header would be built first, alone, on their path.
configure_torch_asan() {
  cmake -S . -B build-asan-torch $(generator build-asan-torch) -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="$gcc_params" \
    -DDILOCO_WARNINGS_AS_ERRORS=ON -DDILOCO_SANITIZE=address,undefined -DDILOCO_ENABLE_CUDA=OFF -DDILOCO_ENABLE_TORCH=ON \
    -DDILOCO_BUILD_BENCHMARKS=OFF -DDILOCO_BUILD_EXAMPLES=OFF -DDILOCO_TEST_PCH=OFF
}
torch_tests=(-R "^(test_torch|test_external)$")

stage "release build, all tests"
release_config=(-DCMAKE_BUILD_TYPE=Release -DDILOCO_WARNINGS_AS_ERRORS=ON
  -DCMAKE_CXX_FLAGS="$gcc_params" -DCMAKE_CUDA_FLAGS="-Xcompiler=${gcc_params// /,}"
  -DCMAKE_CXX_FLAGS_RELEASE="$release_flags" -DCMAKE_CUDA_FLAGS_RELEASE="$cuda_release_flags")
cmake -S . -B build $(generator build) "${release_config[@]}"
# The unit tests that the ASan + UBSan stages build and run (the Clang tree's,
# and the g++ tree's two libtorch tests) are compiled here by g++ with
# -fsyntax-only, not built and run twice: every file still goes through g++'s
# front end with -Werror (its diagnostics, every template the test
# instantiates), and code generation, about three quarters of g++'s time on
# them, is left to the sanitizer trees (scripts/compile-only.py,
# test/CMakeLists.txt's DILOCO_COMPILE_ONLY_TARGETS; 41 programs, 46 tests on
# this machine, 2026-11-30). g++ still builds and runs, besides everything
# else, the tests of code that compilers translate differently: the host
# codec passes' vector paths and checksum (fast paths, SIMD, wire format,
# small formats, codecs, decode-apply) and exec::host (libgomp, not Clang's
# runtime).
gcc_run_tests='^(test_exec_host|test_host_simd|test_codec_fast_paths|test_wire_format|test_compress_codecs|test_small_formats|test_decode_apply)$'
configure_asan > /dev/null
configure_torch_asan > /dev/null
{ read -r compile_only_targets; read -r compile_only_tests; } < <(scripts/compile-only.py build "$gcc_run_tests" \
  build-asan "${asan_tests[@]}" -- build-asan-torch "${torch_tests[@]}")
cmake -S . -B build "${release_config[@]}" -DDILOCO_COMPILE_ONLY_TARGETS="$compile_only_targets" \
  -DDILOCO_COMPILE_ONLY_TESTS="$compile_only_tests" > /dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$ctest_jobs"

stage "Python package: pip install . and pytest"
# A virtual environment from Debian's python3 with its system packages
# (python3-torch, python3-numpy), in a build folder; scikit-build-core keeps
# its CMake tree in build-python/cmake, so a run rebuilds only what changed.
# The extension compiles at -Og here ($release_flags, for the release
# tree's reasons; a user's `pip install .` gets CMake's Release -O3): 59
# against 106 CPU-s of compile, 34 against 57 s of pip (2026-11-30, the same
# machine), pytest's 27 tests 9 s either way.
py=build-python/venv/bin/python
[ -x "$py" ] || /usr/bin/python3 -m venv --system-site-packages build-python/venv
"$py" -c "import nanobind, scikit_build_core, pytest" 2>/dev/null ||
  "$py" -m pip install -q nanobind scikit-build-core pytest
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$py" -m pip install -q --no-build-isolation . \
  --config-settings=build-dir=build-python/cmake --config-settings=cmake.define.DILOCO_WARNINGS_AS_ERRORS=ON \
  --config-settings=cmake.define.CMAKE_CXX_FLAGS="$gcc_params" \
  --config-settings=cmake.define.CMAKE_CXX_FLAGS_RELEASE="$release_flags"
(cd python/tests && "../../$py" -m pytest -q -p no:cacheprovider)

stage "ASan + UBSan"
configure_asan
scripts/build-tested.py build-asan "$jobs" "${asan_tests[@]}"
ctest --test-dir build-asan --output-on-failure -j"$ctest_jobs" "${asan_tests[@]}"

stage "ASan + UBSan (g++): the libtorch adapter and wrapper mode"
configure_torch_asan
scripts/build-tested.py build-asan-torch "$jobs" "${torch_tests[@]}"
ctest --test-dir build-asan-torch --output-on-failure "${torch_tests[@]}" --no-tests=error

stage "TSan (threads communicator, Gloo, threaded engine tests)"
# OpenMP is off here: its runtime is not instrumented and would report its own
# synchronization as races.
cmake -S . -B build-tsan $(generator build-tsan) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDILOCO_WARNINGS_AS_ERRORS=ON \
  -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
  -DDILOCO_SANITIZE=thread -DDILOCO_ENABLE_CUDA=OFF -DDILOCO_ENABLE_OPENMP=OFF -DDILOCO_ENABLE_TORCH=OFF \
  -DDILOCO_BUILD_BENCHMARKS=OFF
# Not the docs' and the README's programs, as in the ASan stage (the unit
# tests here run the same calls with threads): 33 CPU seconds of this build
# and 11 of its test time (2026-11-30).
tsan_tests=(-L "threads|tsan" -LE "slow|codegen|replay|docs|readme")
scripts/build-tested.py build-tsan "$jobs" "${tsan_tests[@]}"
ctest --test-dir build-tsan --output-on-failure -j"$ctest_jobs" "${tsan_tests[@]}"

stage "all test suites passed"
