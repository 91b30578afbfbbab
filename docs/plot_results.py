#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws docs/results.md's figures from the CSV files the sweep
(examples/sweep.cpp) and the GPT example (examples/gpt/train_gpt.cpp) write.

    python3 docs/plot_results.py docs/results

reads  DIR/sweep.csv, DIR/sweep_curves.csv      (sweep --out DIR)
       DIR/gpt-*/gpt.csv, DIR/gpt-*/gpt_curves.csv (train_gpt --out DIR/gpt-NAME)
writes DIR/*.png
"""
import csv
import glob
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(row, key):
    return float(row[key])


def pick(rows, **where):
    return [r for r in rows if all(str(r.get(k)) == str(v) for k, v in where.items())]


def one(rows, **where):
    found = pick(rows, **where)
    return found[0] if found else None


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print("wrote", path)


def scale_figures(rows, out):
    """Held-out loss against H for every M, relative to data parallel at the
    same budget; and DiLoCo against one worker with the same per-worker
    compute."""
    scale = pick(rows, grid="scale")
    if not scale:
        return
    ms = sorted({int(r["workers"]) for r in scale})
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for m in ms:
        pts = []
        for r in pick(scale, workers=m, kind="diloco"):
            ddp = one(scale, workers=m, kind="data_parallel", batch=r["batch"])
            if ddp:
                pts.append((int(r["inner_steps"]), num(r, "final_loss") / num(ddp, "final_loss")))
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=f"M = {m}")
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="data parallel")
    ax.axhline(1.02, color="grey", lw=0.8, ls=":", label="+2%")
    ax.set_xscale("log")
    ax.set_xlabel("H (inner steps per round)")
    ax.set_ylabel("held-out loss / data parallel's")
    ax.set_title("char MLP, fortunes, one pass: DiLoCo vs data parallel")
    ax.legend()
    save(fig, out, "scale_h.png")

    # Bytes: loss against bytes sent per worker, every M and H.
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for m in ms:
        if m == 1:
            continue
        d = sorted(pick(scale, workers=m, kind="diloco"), key=lambda r: int(r["inner_steps"]))
        ax.plot([num(r, "bytes_sent") for r in d], [num(r, "final_loss") for r in d], "-o", label=f"DiLoCo M = {m}")
        for r in d:
            ax.annotate(f"H={r['inner_steps']}", (num(r, "bytes_sent"), num(r, "final_loss")), fontsize=6)
        for ddp in pick(scale, workers=m, kind="data_parallel"):
            ax.plot([num(ddp, "bytes_sent")], [num(ddp, "final_loss")], "k^")
    ax.plot([], [], "k^", label="data parallel")
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per worker")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title("char MLP: loss against traffic")
    ax.legend(fontsize=8)
    save(fig, out, "scale_bytes.png")

    # Same per-worker compute: one worker with worker 0's data.
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    hs = sorted({int(r["inner_steps"]) for r in pick(scale, kind="diloco")})
    h_ref = 100 if 100 in hs else hs[-1]
    labels, single, dl, ddp = [], [], [], []
    for m in ms:
        d = one(scale, workers=m, kind="diloco", inner_steps=h_ref)
        if not d:
            continue
        s = one(scale, workers=m, kind="single_worker", batch=d["batch"])
        p = one(scale, workers=m, kind="data_parallel", batch=d["batch"])
        labels.append(f"M = {m}")
        single.append(num(s, "final_loss") if s else math.nan)
        dl.append(num(d, "final_loss"))
        ddp.append(num(p, "final_loss") if p else math.nan)
    x = range(len(labels))
    ax.bar([i - 0.27 for i in x], single, 0.27, label="one worker, same per-worker compute")
    ax.bar(list(x), dl, 0.27, label=f"DiLoCo H = {h_ref}")
    ax.bar([i + 0.27 for i in x], ddp, 0.27, label="data parallel")
    ax.set_xticks(list(x), labels)
    lo = min(v for v in single + dl + ddp if not math.isnan(v))
    ax.set_ylim(lo * 0.97, max(v for v in single + dl + ddp if not math.isnan(v)) * 1.01)
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title("char MLP: DiLoCo against one worker with the same per-worker compute")
    ax.legend(fontsize=8)
    save(fig, out, "single_worker.png")


def bars(rows, out, grid, name, title):
    g = pick(rows, grid=grid)
    if not g:
        return
    base = one(g, variant="diloco")
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for r in g:
        ax.plot(num(r, "bytes_sent"), num(r, "final_loss") / num(base, "final_loss"), "o")
        ax.annotate(r["variant"].replace("diloco", "").strip("+ ") or "fp32", (num(r, "bytes_sent"),
                    num(r, "final_loss") / num(base, "final_loss")), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.axhline(1.01, color="grey", lw=0.8, ls=":", label="+1%")
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per worker")
    ax.set_ylabel("held-out loss / fp32 blocking DiLoCo's")
    ax.set_title(title + f" (M = {base['workers']}, H = {base['inner_steps']})")
    ax.legend(fontsize=8)
    save(fig, out, name)


def shards_figure(rows, out):
    g = pick(rows, grid="shards")
    if not g:
        return
    ms = sorted({int(r["workers"]) for r in g})
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    width = 0.2
    for k, (kind, shards) in enumerate([("data_parallel", "iid"), ("data_parallel", "by-file"), ("diloco", "iid"),
                                        ("diloco", "by-file")]):
        ys = [num(one(g, workers=m, kind=kind, shards=shards), "final_loss") for m in ms]
        ax.bar([i + (k - 1.5) * width for i in range(len(ms))], ys, width,
               label=f"{kind.replace('_', ' ')}, {shards}")
    ax.set_xticks(range(len(ms)), [f"M = {m}" for m in ms])
    allv = [num(r, "final_loss") for r in g]
    ax.set_ylim(min(allv) * 0.98, max(allv) * 1.01)
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title(f"char MLP: iid vs by-file shards (H = {g[0]['inner_steps'] if g[0]['inner_steps'] != '0' else g[1]['inner_steps']})")
    ax.legend(fontsize=8)
    save(fig, out, "shards.png")


def curves_figure(curves, out, name, title, filt=None):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    series = {}
    for r in curves:
        if filt and not filt(r):
            continue
        key = r["variant"] + (f" ({r['shards']})" if r.get("shards") not in (None, "iid") else "")
        series.setdefault(key, []).append((int(r["step"]), float(r["held_out_loss"])))
    for key, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    if series:
        last = [pts[-1][1] for pts in series.values()]
        ax.set_ylim(min(last) * 0.97, max(max(p[1] for p in pts) for pts in series.values()) * 0.75 + min(last) * 0.25)
    save(fig, out, name)


def main(d):
    if os.path.exists(os.path.join(d, "sweep.csv")):
        rows = read(os.path.join(d, "sweep.csv"))
        scale_figures(rows, d)
        shards_figure(rows, d)
        bars(rows, d, "compressors", "compressors.png", "char MLP: every compressor")
        bars(rows, d, "schedules", "schedules.png", "char MLP: every schedule")
        curves = read(os.path.join(d, "sweep_curves.csv"))
        curves_figure(curves, d, "schedule_curves.png", "char MLP: held-out loss during training, every schedule",
                      lambda r: r["grid"] == "schedules")
    gpt_rows = []
    for path in sorted(glob.glob(os.path.join(d, "gpt-*", "gpt_curves.csv"))):
        gpt_rows += read(path)
    if gpt_rows:
        curves_figure(gpt_rows, d, "gpt_curves.png", "GPT example, fortunes, one pass: held-out loss")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results")
