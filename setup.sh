#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command on a fresh machine: installs what is missing, builds, and runs
# the main demo (extra arguments go to the demo; try --help).
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target train_char_mlp
./build/examples/train_char_mlp "$@"
