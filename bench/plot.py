#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plots effective bandwidth against parameter count for the fused outer
step, the unfused passes and STREAM triad (and copy) from the output of
bench_outer_step.

    python3 bench/plot.py docs/perf/outer_step.txt docs/perf/outer_step.png
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    series = {}
    pattern = re.compile(r"^(\w+)\[2\^(\d+)\]: ([0-9.eE+-]+)$")
    with open(path) as f:
        for line in f:
            m = pattern.match(line.strip())
            if m:
                series.setdefault(m.group(1), {})[int(m.group(2))] = float(m.group(3))
    return series


def main(src, dst):
    s = read(src)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    styles = [("fused_gbps", "fused (36 B/param)", "-o"), ("unfused_gbps", "unfused, one pass per op (72 B/param)", "-s"),
              ("triad_gbps", "STREAM triad", "--"), ("copy_gbps", "STREAM copy", ":")]
    for key, label, style in styles:
        if key in s:
            ks = sorted(s[key])
            ax.plot([2 ** k for k in ks], [s[key][k] for k in ks], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("parameters")
    ax.set_ylabel("effective bandwidth (GB/s)")
    ax.set_title("DiLoCo outer step on the host: fused vs unfused vs memory bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
