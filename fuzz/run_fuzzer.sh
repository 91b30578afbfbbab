#!/usr/bin/env bash
# Builds the wire-decoder fuzzer with clang (libFuzzer + ASan + UBSan) and
# runs it for a bounded number of inputs (default 10^6, about 6 s), starting
# from seeds for every codec (a well-formed segment and a bare payload each,
# written by fuzz/make_seeds.cpp and checked to pass validation).
# Usage: run_fuzzer.sh SRC_DIR BUILD_DIR [RUNS]
set -euo pipefail
src=$1; out=$2; runs=${3:-1000000}
clangxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$clangxx" ]; then echo "clang++ not found: install clang (scripts/install-deps.sh does)"; exit 1; fi
mkdir -p "$out/corpus" "$out/seeds"
"$clangxx" -std=c++20 -O0 -I"$src/include" "$src/fuzz/make_seeds.cpp" -o "$out/make_seeds" &
"$clangxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$src/include" "$src/fuzz/wire_decode_fuzzer.cpp" -o "$out/wire_decode_fuzzer"
wait $!
"$out/make_seeds" "$out/seeds"
seeds=$(find "$out/seeds" -type f | wc -l)
[ "$seeds" -ge 10 ] || { echo "run_fuzzer.sh: expected 2 seeds for each of 5 codecs, found $seeds"; exit 1; }
# New inputs go to the first directory; the seeds are read only.
"$out/wire_decode_fuzzer" -runs="$runs" -seed=1 -max_len=2048 "$out/corpus" "$out/seeds"
