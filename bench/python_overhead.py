#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the Python wrapper adds (issue 42 item 6), as `name: value` lines.

1. The outer round of a world of one (blocking, outer Nesterov, fp32 mean)
   over 2^log2 parameters in `tensors` equal NumPy arrays, timed around the
   `DiLoCo.step()` that runs it, against the same round in a C++ process
   (bench_outer_step --processes 1 --replica vector: the median of its
   rounds; the replica in plain heap memory, as NumPy's is). The C++
   figure is taken before and after the Python one and averaged, since this
   machine's speed drifts; python_vs_cxx is the ratio (target <= 1.02).
   In the same process, each round's time around `step()` is also compared
   with the engine's own time for that round (the growth of `stats()`'s
   `outer_seconds`, taken in C++ around the round's passes, its
   collectives and the apply pass):
   python_vs_engine is the median of those ratios, the same round in the
   same pages, so neither the machine's drift nor where a process's pages
   landed (docs/performance.md, "Page size and the outer round") enters
   it; what it shows is the wrapper's own cost plus the C++ step's
   bookkeeping outside the round's passes.
2. `DiLoCo.step()` on a step that runs no round (the call, the GIL release,
   the count): microseconds per call over many calls (target < 5).

Run from the repository root after ./test.sh (build/ and build-python/):
  build-python/venv/bin/python bench/python_overhead.py
"""

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

import diloco


def value_of(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return float(line.split(":", 1)[1])
    raise RuntimeError(f"{name} not in the output:\n{text}")


def cxx_round(binary: str, log2: int, tensors: int, reps: int) -> float:
    out = subprocess.run(
        [binary, "--processes", "1", "--round-log2", str(log2), "--round-tensors", str(tensors), "--reps", str(reps),
         "--replica", "vector"],
        capture_output=True, text=True, check=True).stdout
    return value_of(out, "outer_round.process_median_seconds")


def python_round(log2: int, tensors: int, reps: int, inner_steps: int) -> tuple[float, float]:
    """The median round time around step(), and the median of its ratios to
    the engine's own time for the same round."""
    n = 1 << log2
    params = [np.full(n // tensors, 0.5, dtype=np.float32) for _ in range(tensors)]
    outer = diloco.DiLoCo(params, inner_steps=inner_steps, comm=diloco.local())
    times, ratios = [], []
    for r in range(reps + 1):  # round 0 warms up
        for _ in range(inner_steps - 1):
            if outer.step():
                raise RuntimeError("a round ran before its step")
        params[0][0] -= 1e-3  # the user's optimizer moved something
        engine0 = outer.stats()["outer_seconds"]
        t0 = time.perf_counter()
        applied = outer.step()
        t1 = time.perf_counter()
        if not applied:
            raise RuntimeError("the H-th step ran no round")
        if r > 0:
            times.append(t1 - t0)
            ratios.append((t1 - t0) / (outer.stats()["outer_seconds"] - engine0))
    return statistics.median(times), statistics.median(ratios)


def step_call(calls: int) -> float:
    params = [np.zeros(1024, dtype=np.float32)]
    outer = diloco.DiLoCo(params, inner_steps=calls + 10, comm=diloco.local())
    outer.step()  # warm up
    t0 = time.perf_counter()
    for _ in range(calls):
        outer.step()
    return (time.perf_counter() - t0) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cxx", default="build/bench/bench_outer_step", help="the C++ benchmark's binary")
    ap.add_argument("--log2", type=int, default=24, help="parameters, log2")
    ap.add_argument("--tensors", type=int, default=64, help="equal tensors they are split into")
    ap.add_argument("--reps", type=int, default=7, help="timed rounds (the median is reported)")
    ap.add_argument("--inner-steps", type=int, default=4, help="H of the Python run")
    ap.add_argument("--calls", type=int, default=200000, help="step() calls timed for the per-call cost")
    a = ap.parse_args()
    before = cxx_round(a.cxx, a.log2, a.tensors, a.reps)
    py, vs_engine = python_round(a.log2, a.tensors, a.reps, a.inner_steps)
    after = cxx_round(a.cxx, a.log2, a.tensors, a.reps)
    cxx = 0.5 * (before + after)
    tag = f"[2^{a.log2}, {a.tensors} tensors]"
    print(f"cxx_round_seconds{tag}: {cxx:.6g}")
    print(f"cxx_round_seconds.before_after_spread{tag}: {max(before, after) / min(before, after):.4g}")
    print(f"python_round_seconds{tag}: {py:.6g}")
    print(f"python_vs_cxx{tag}: {py / cxx:.4g}")
    print(f"python_vs_engine{tag}: {vs_engine:.4g}")
    print(f"python_step_call_us: {step_call(a.calls) * 1e6:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
