#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The slow-link benchmark's results (one file per run, written by
bench/wan/run.sh) as a table, plots and checks.

    bench/wan/report.py DIR                 the Markdown table of docs/performance.md
    bench/wan/report.py DIR --plot OUTDIR   also wan_utilisation.png and wan_loss_100mbit.png (matplotlib)
    bench/wan/report.py DIR --check         checks the runs (what CTest's smoke run does):
        every figure is there and finite; no worker sent faster than its link
        (wall time >= bytes sent / rate, less the token bucket's burst), so
        the shaping was in force; data parallel's loss curve is the same at
        every rate (the same math on the same data: only time differs).
"""
import argparse
import glob
import math
import os
import re
import sys

METHOD_ORDER = ["ddp", "diloco_fp32", "diloco_int4", "streaming_int4", "delay_int4", "eager_int4"]
METHOD_NAMES = {
    "ddp": "data parallel (fp32 gradients every step)",
    "diloco_fp32": "DiLoCo blocking, fp32",
    "diloco_int4": "DiLoCo blocking, int4+EF",
    "streaming_int4": "streaming DiLoCo, int4+EF",
    "delay_int4": "DiLoCo one-step delay, int4+EF",
    "eager_int4": "DiLoCo eager, int4+EF",
}
NUMERIC = ["wall_seconds", "inner_seconds", "compute_utilisation", "compute_utilisation_quiet",
           "compute_utilisation_workers", "bytes_per_worker",
           "final_loss", "target_loss", "time_to_target_seconds", "wall_ms_per_step", "steps", "steps_planned",
           "other_threads_cpu_seconds"]


def rate_bits(rate):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
    if not m:
        raise ValueError(f"not a tc rate: {rate}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def pretty_rate(rate):
    bits = rate_bits(rate)
    return f"{bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:g} Mbit/s"


def tbf_burst_bytes(rate):
    # bench/wan/run.sh's bucket: 2 ms at the rate, at least 16 KiB.
    return max(16384, int(rate_bits(rate) / 8 * 0.002))


def read_run(path):
    run = {"curve": []}
    with open(path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition(": ")
            if key == "loss_curve":
                step, seconds, loss = value.split()
                run["curve"].append((int(step), float(seconds), float(loss)))
            elif key in NUMERIC:
                run[key] = float(value)
            else:
                run[key] = value
    name = run.get("run", os.path.basename(path)[:-4])
    run["rate"], _, run["key"] = name.partition("-")
    return run


def read_runs(directory):
    runs = [read_run(p) for p in sorted(glob.glob(os.path.join(directory, "*.txt")))]
    if not runs:
        sys.exit(f"report.py: no runs (*.txt) in {directory}")
    return runs


def rates_of(runs):
    return sorted({r["rate"] for r in runs}, key=rate_bits, reverse=True)


def reference_ddp(runs):
    """The uncapped data-parallel run: its curve says at which step the target is reached."""
    full = [r for r in runs if r["key"] == "ddp" and r["steps"] == r["steps_planned"]]
    return max(full, key=lambda r: rate_bits(r["rate"])) if full else None


def ddp_time_to_target(run, ref):
    """Data parallel's time to the target at this run's rate: measured, or
    for a capped run that stopped before it, the reference's step at the
    target times this run's time per step (marked estimated)."""
    if not math.isnan(run["time_to_target_seconds"]):
        return run["time_to_target_seconds"], False
    if ref is None:
        return math.nan, False
    steps = [s for s, _, loss in ref["curve"] if loss <= run["target_loss"]]
    if not steps:
        return math.nan, False
    return steps[0] * run["wall_ms_per_step"] / 1e3, True


def table(runs):
    ref = reference_ddp(runs)
    out = []
    workers = {r.get("workers") for r in runs}
    over = any(r.get("oversubscribed") == "1" for r in runs)
    out.append(f"Workers: {', '.join(sorted(workers))}" + (" (OVERSUBSCRIBED: reference only)" if over else "")
               + f"; target loss {runs[0]['target_loss']:.4f} (1.02 x data parallel's final loss).")
    out.append("")
    out.append("| link | method | wall s | compute util. | util., workers' mean | comm. threads' CPU "
               "| MB sent per worker | final loss | time to target s | data parallel's time / this |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for rate in rates_of(runs):
        at_rate = {r["key"]: r for r in runs if r["rate"] == rate}
        ddp = at_rate.get("ddp")
        ddp_t, ddp_est = ddp_time_to_target(ddp, ref) if ddp else (math.nan, False)
        for key in METHOD_ORDER:
            r = at_rate.get(key)
            if r is None:
                continue
            capped = r["steps"] < r["steps_planned"]
            wall = f"{r['wall_seconds']:.1f}" + (f" (capped: {int(r['steps'])} of {int(r['steps_planned'])} steps)"
                                                 if capped else "")
            t = r["time_to_target_seconds"]
            if key == "ddp":
                t_text = (f"~{ddp_t:.0f} (est.)" if ddp_est else f"{t:.1f}") if not math.isnan(ddp_t) else "not reached"
            else:
                t_text = f"{t:.1f}" if not math.isnan(t) else "not reached"
            ratio = ""
            if not math.isnan(t) and not math.isnan(ddp_t) and t > 0:
                ratio = f"{ddp_t / t:.1f}" + (" (est.)" if ddp_est else "")
            # Older outputs have no thread CPU times.
            other = r.get("other_threads_cpu_seconds", math.nan)
            other_text = f"{100 * other / r['wall_seconds']:.1f} %" if math.isfinite(other) else ""
            # Older outputs have rank 0's figure only.
            mean = r.get("compute_utilisation_workers", math.nan)
            mean_text = f"{100 * mean:.1f} %" if math.isfinite(mean) else ""
            out.append(f"| {pretty_rate(rate)} | {METHOD_NAMES[key]} | {wall} | {100 * r['compute_utilisation']:.1f} % "
                       f"| {mean_text} | {other_text} | {r['bytes_per_worker'] / 1e6:.2f} "
                       f"| {r['final_loss']:.4f}{' (at the cap)' if capped else ''} | {t_text} | {ratio} |")
    return "\n".join(out)


def check(runs):
    problems = []
    for r in runs:
        name = f"{r['rate']}-{r['key']}"
        for key in ["wall_seconds", "inner_seconds", "compute_utilisation", "bytes_per_worker", "final_loss"]:
            if key not in r or not math.isfinite(r[key]):
                problems.append(f"{name}: {key} missing or not finite")
        if problems:
            continue
        for key in ["compute_utilisation", "compute_utilisation_workers"]:
            if key in r and not 0.0 < r[key] <= 1.0:
                problems.append(f"{name}: {key} {r[key]} is not in (0, 1]")
        # A worker cannot send faster than its link: the shaping is in force.
        floor = max(0.0, r["bytes_per_worker"] - tbf_burst_bytes(r["rate"])) * 8 / rate_bits(r["rate"])
        if r["wall_seconds"] < floor:
            problems.append(f"{name}: sent {r['bytes_per_worker']:.0f} bytes in {r['wall_seconds']} s, faster than "
                            f"the {r['rate']} link allows (at least {floor:.3f} s): the link was not shaped")
        if len(r["curve"]) < 2 or r["curve"][-1][2] != r["final_loss"]:
            problems.append(f"{name}: the loss curve is missing or does not end at the final loss")
    # Data parallel: the same losses at the same steps at every rate.
    ddp = [r for r in runs if r["key"] == "ddp"]
    for r in ddp[1:]:
        a = {s: loss for s, _, loss in ddp[0]["curve"]}
        for s, _, loss in r["curve"]:
            if s in a and a[s] != loss:
                problems.append(f"data parallel at {r['rate']} has loss {loss} at step {s}, at {ddp[0]['rate']} "
                                f"{a[s]}: the same training gave different models")
                break
    for p in problems:
        print("report.py: CHECK FAILED: " + p, file=sys.stderr)
    if not problems:
        print(f"report.py: {len(runs)} runs checked: figures finite, no worker faster than its link, "
              f"data parallel's losses equal at every rate ({len(ddp)} runs)")
    return not problems


def plot(runs, outdir):
    try:
        import matplotlib
    except ImportError:
        sys.exit("report.py: --plot needs matplotlib (Debian: python3-matplotlib; or pip install matplotlib in a "
                 "virtual environment, as bench/reproduce.sh does)")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    rates = rates_of(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for key in METHOD_ORDER:
        pts = [(rate_bits(r["rate"]) / 1e6, 100 * r.get("compute_utilisation_workers", r["compute_utilisation"]))
               for r in runs if r["key"] == key]
        if pts:
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=METHOD_NAMES[key])
    ax.set_xscale("log")
    ax.set_xlabel("link rate per worker (Mbit/s)")
    ax.set_ylabel("compute utilisation, workers' mean (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Compute utilisation against link rate")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "wan_utilisation.png"))

    rate = "100mbit" if "100mbit" in rates else rates[len(rates) // 2]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    target = None
    for key in METHOD_ORDER:
        r = next((r for r in runs if r["key"] == key and r["rate"] == rate), None)
        if r is None:
            continue
        target = r["target_loss"]
        ax.plot([c[1] for c in r["curve"]], [c[2] for c in r["curve"]], "-", label=METHOD_NAMES[key])
    if target is not None:
        ax.axhline(target, color="gray", linestyle=":", label="1.02 x data parallel's final loss")
    ax.set_xscale("log")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title(f"Held-out loss against training wall time at {pretty_rate(rate)}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, f"wan_loss_{rate}.png"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory")
    p.add_argument("--plot", metavar="OUTDIR")
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    runs = read_runs(a.directory)
    if a.check:
        sys.exit(0 if check(runs) else 1)
    print(table(runs))
    if a.plot:
        plot(runs, a.plot)


if __name__ == "__main__":
    main()
