# SPDX-License-Identifier: Apache-2.0
"""Starts local Gloo workers as the C++ launcher (scripts/launch_gloo.sh) does:

    python -m diloco.launch --nproc 4 train.py [its arguments]

Each worker is ``python train.py ...`` with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE (torchrun's names), the launcher's DILOCO_RANK,
DILOCO_WORLD_SIZE, DILOCO_LOCAL_WORLD_SIZE, DILOCO_STORE (a fresh file
store unless --store is given) and DILOCO_RUN_ID set, so
``diloco.gloo.from_env()`` joins the group. Output lines are prefixed with
the rank. When a worker fails, the others are stopped and the launcher
exits with the failed worker's status (128 + N for a death by signal N).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional


def _pump(rank: int, stream, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(f"[rank {rank}] ".encode() + line)
        out.flush()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m diloco.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, required=True, help="workers to start on this machine")
    ap.add_argument("--store", default="", help="file:///shared/dir or redis://host:port (default: a fresh directory)")
    ap.add_argument("--run-id", default="diloco", help="DILOCO_RUN_ID")
    ap.add_argument("--timeout-ms", type=int, default=0, help="DILOCO_TIMEOUT_MS (default: the library's)")
    ap.add_argument("script", help="the Python program each worker runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    if a.nproc < 1:
        ap.error(f"--nproc must be at least 1, got {a.nproc}")
    work = None
    store = a.store
    if not store:
        work = tempfile.mkdtemp(prefix="diloco-launch-")
        store = "file://" + os.path.join(work, "store")
    procs, pumps = [], []
    out = sys.stdout.buffer
    try:
        for rank in range(a.nproc):
            env = dict(os.environ)
            env.update(RANK=str(rank), WORLD_SIZE=str(a.nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(a.nproc),
                       DILOCO_RANK=str(rank), DILOCO_WORLD_SIZE=str(a.nproc), DILOCO_LOCAL_WORLD_SIZE=str(a.nproc),
                       DILOCO_STORE=store, DILOCO_RUN_ID=a.run_id)
            if a.timeout_ms:
                env["DILOCO_TIMEOUT_MS"] = str(a.timeout_ms)
            p = subprocess.Popen([sys.executable, a.script, *a.args], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(rank, p.stdout, out), daemon=True)
            t.start()
            pumps.append(t)
        status = 0
        running = set(range(a.nproc))
        while running:
            for rank in sorted(running):
                rc = procs[rank].poll()
                if rc is None:
                    continue
                running.discard(rank)
                if rc != 0 and status == 0:
                    status = 128 - rc if rc < 0 else rc
                    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
                    sys.stderr.write(f"diloco.launch: rank {rank} {how}; stopping the others\n")
                    for other in running:
                        procs[other].terminate()
            time.sleep(0.02)
        for t in pumps:
            t.join(timeout=5)
        return status
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
