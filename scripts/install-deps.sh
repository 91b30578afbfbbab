#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages diloco's build, tests and demo need, if any
# are missing. Safe to run again: it installs nothing when all are present.
set -euo pipefail

# libtorch-dev: the diloco::torch component and the GPT example (libtorch
# 1.13, CPU). libopenblas0-openmp: Debian's libtorch calls the system BLAS
# (libblas.so.3); with only the reference BLAS installed its matrix products
# run ~17x slower (6 vs 100 GFLOP/s on one core here); OpenBLAS, the OpenMP
# build to match libtorch's OpenMP threads, takes over that alternative.
# nlohmann-json3-dev: diloco::json and the experiment harness's JSON files.
# python3-matplotlib: docs/plot_results.py draws docs/results.md's figures.
# iproute2: ip and tc, with which bench/wan/run.sh makes its namespaces and shaped links.
# doxygen: the API reference (target docs) and its test api_reference_doxygen.
# clang, libclang-rt-dev, libomp-dev: ./test.sh's sanitizer builds (Clang
# compiles them in less than half GCC's time) and the libFuzzer test.
# ninja-build: ./test.sh's generator (a Makefile build of several named
# targets builds them one after another).
# python3-venv, python3-torch, python3-numpy: the Python package's tests
# (./test.sh makes a virtual environment from Debian's python3 with its
# system packages, so PyTorch 1.13 and NumPy come from here; nanobind,
# scikit-build-core and pytest come from PyPI into that environment).
packages=(cmake g++ make python3 python3-venv doctest-dev libcli11-dev fortunes libopenmpi-dev openmpi-bin libgloo-dev libhiredis-dev
          redis-server clang libclang-rt-dev libtorch-dev libopenblas0-openmp nlohmann-json3-dev python3-matplotlib iproute2
          doxygen libomp-dev ninja-build python3-torch python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
