#!/usr/bin/env bash
# Builds the wire-decoder fuzzer with clang (libFuzzer + ASan + UBSan) and
# runs it for a bounded number of inputs. Usage: run_fuzzer.sh SRC_DIR BUILD_DIR [RUNS]
set -euo pipefail
src=$1; out=$2; runs=${3:-200000}
clangxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$clangxx" ]; then echo "clang++ not found: install clang (scripts/install-deps.sh does)"; exit 1; fi
mkdir -p "$out/corpus"
"$clangxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$src/include" "$src/fuzz/wire_decode_fuzzer.cpp" -o "$out/wire_decode_fuzzer"
"$out/wire_decode_fuzzer" -runs="$runs" -seed=1 -max_len=2048 "$out/corpus"
