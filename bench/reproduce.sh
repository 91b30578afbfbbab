#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Rebuilds the benchmarks in Release and regenerates the figures of
# docs/performance.md: raw `name: value` outputs in docs/perf/*.txt and the
# plot docs/perf/outer_step.png. Run it on a quiet machine; every ratio it
# reports is measured within one run.
#   bench/reproduce.sh            (full sizes, a few minutes)
#   QUICK=1 bench/reproduce.sh    (small sizes, seconds)
#   WAN=1 bench/reproduce.sh      (also the slow-link benchmark, bench/wan/run.sh:
#                                  as root, about 25 minutes; docs/perf/wan/ and its plots)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDILOCO_BUILD_TESTS=OFF -DDILOCO_BUILD_EXAMPLES=OFF \
  -DDILOCO_ENABLE_CUDA=OFF >/dev/null
cmake --build build-bench -j"$(nproc)"
out=docs/perf
mkdir -p "$out"
max=26; log=24; reps=7
if [ "${QUICK:-0}" = 1 ]; then max=18; log=18; reps=3; fi
b=build-bench/bench
mpirun_cmd=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ echo "# $(date -u +%F) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; "$b/bench_outer_step" --max-log2 "$max" --reps "$reps"; } | tee "$out/outer_step.txt"
"$b/bench_compress_step" --log2 "$log" --reps "$reps" | tee "$out/compress_step.txt"
"$b/bench_memory" --log2 22 | tee "$out/memory.txt"
"$b/bench_allreduce_threads" --max-log2 "$log" --reps "$reps" | tee "$out/allreduce_threads.txt"
for np in 2 4; do
  OMP_NUM_THREADS=1 "${mpirun_cmd[@]}" -np "$np" "$b/bench_allreduce_mpi" --max-log2 "$log" --reps "$reps" | tee "$out/allreduce_mpi_np$np.txt"
done
if [ -x "$b/bench_allreduce_gloo" ]; then
  for np in 2 4; do
    # Unbound, as scripts/launch_gloo.sh starts ranks: bound to one core,
    # Gloo's event-loop thread and the caller share it and every
    # collective waits milliseconds for the hand-over.
    OMP_NUM_THREADS=1 "${mpirun_cmd[@]}" --bind-to none -np "$np" "$b/bench_allreduce_gloo" --max-log2 "$log" --reps "$reps" | tee "$out/allreduce_gloo_np$np.txt"
  done
fi
# The plot needs matplotlib: from a private virtual environment if missing.
py=python3
if ! python3 -c "import matplotlib" 2>/dev/null; then
  python3 -m venv build-bench/venv
  build-bench/venv/bin/pip install -q matplotlib
  py=build-bench/venv/bin/python
fi
"$py" bench/plot.py "$out/outer_step.txt" "$out/outer_step.png"
if [ "${WAN:-0}" = 1 ]; then
  rm -rf "$out/wan"
  { echo "# $(date -u +%F) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; uptime; } >"$out/wan.txt"
  bench/wan/run.sh --worker build-bench/bench/wan/wan_worker --out "$out/wan" | tee -a "$out/wan.txt"
  "$py" bench/wan/report.py "$out/wan" --plot "$out" | tee -a "$out/wan.txt"
fi
echo "wrote $out/"
