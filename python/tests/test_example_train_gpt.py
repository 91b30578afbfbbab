# SPDX-License-Identifier: Apache-2.0
"""Smoke test of examples/python/train_gpt.py: both methods with 2 Gloo
processes each and tiny settings. Checks against values derived here, not
by the script: the initial held-out loss is close to ln(vocab) (a model
whose logits start near zero predicts uniformly), with the vocabulary
counted here from the fortunes; DiLoCo trains (its held-out loss ends well
below the initial one); and the bytes: DDP's are the ring all-reduce of
the fp32 gradient each step, 2 (M - 1) / M x 4 x parameters x steps, and
DiLoCo's (the library's count) the initial broadcast of the model and one
such all-reduce of the model (and M norm slots) per round: H times fewer
past the broadcast."""
import math
import os
import subprocess
import sys

import pytest

import diloco

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "examples", "python", "train_gpt.py")
FORTUNES = "/usr/share/games/fortunes"


def fortunes_vocab() -> int:
    """Distinct symbols of the cleaned fortunes: printable ASCII that occurs
    in the topic files (tabs become spaces) and the newline."""
    seen = set()
    for name in os.listdir(FORTUNES):
        path = os.path.join(FORTUNES, name)
        if name.endswith(".dat") or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            seen.update(f.read())
    symbols = {c for c in seen if 32 <= c < 127} | {10}
    if 9 in seen:
        symbols.add(32)
    return len(symbols)


@pytest.mark.skipif(not diloco.gloo.available(), reason="built without Gloo")
@pytest.mark.skipif(not os.path.isdir(FORTUNES), reason="Debian's fortunes package is not installed")
def test_train_gpt_example_runs_both_methods():
    workers, steps, inner_steps = 2, 40, 10
    cmd = [sys.executable, SCRIPT, "--method", "both", "--workers", str(workers), "--steps", str(steps),
           "--inner-steps", str(inner_steps), "--width", "32", "--layers", "1", "--heads", "4", "--context", "32",
           "--batch", "8", "--eval-windows", "128", "--warmup", "5", "--lr", "5e-3"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    values = {}
    for line in out.splitlines():
        key, sep, value = line.partition(": ")
        if sep and not key.startswith(("data", " ")):
            values[key] = float(value)

    vocab = fortunes_vocab()
    assert values["vocab"] == vocab
    params = values["parameters"]
    # d = 32, 1 layer, context 32: embeddings V d + 32 d, one block
    # (2 LayerNorms 4 d, qkv 3 d^2 + 3 d, proj d^2 + d, fc 4 d^2 + 4 d,
    # out 4 d^2 + d), the final LayerNorm 2 d and the head d V + V.
    d = 32
    assert params == vocab * d + 32 * d + (4 * d + 12 * d * d + 9 * d) + 2 * d + d * vocab + vocab

    initial = values["initial.held_out_loss"]
    assert abs(initial - math.log(vocab)) < 0.05, (initial, math.log(vocab))
    assert values["diloco.held_out_loss"] < initial - 0.8, out
    assert values["ddp.held_out_loss"] < initial - 0.8, out

    ring = 2.0 * (workers - 1) / workers * 4 * params
    assert values["ddp.bytes_sent_per_worker"] == pytest.approx(steps * ring, rel=1e-9)
    assert values["ddp.exchanges"] == steps
    rounds = steps // inner_steps
    assert values["diloco.exchanges"] == rounds
    # Rank 0's count (docs/getting-started.md): the initial broadcast of its
    # fp32 model, then per round a ring all-reduce of the pseudo-gradient
    # and one norm slot per worker.
    broadcast = 4 * params
    per_round = 2.0 * (workers - 1) / workers * 4 * (params + workers)
    assert values["diloco.bytes_sent_per_worker"] == pytest.approx(broadcast + rounds * per_round, rel=1e-9)
    # So, past the broadcast, H times fewer bytes than DDP (to the norm slots).
    ratio = values["ddp.bytes_sent_per_worker"] / (values["diloco.bytes_sent_per_worker"] - broadcast)
    assert inner_steps * 0.99 < ratio <= inner_steps, ratio
    for m in ("ddp", "diloco"):
        assert 0 < values[f"{m}.wall_seconds"] < 60
