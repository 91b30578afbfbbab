# SPDX-License-Identifier: Apache-2.0
"""A small character-level GPT in PyTorch on Debian's fortunes, trained by
synchronous data parallel (torch.distributed, Gloo) and by DiLoCo (diloco,
Gloo), each with --workers processes on this machine; prints the held-out
loss, the bytes each worker sent and the wall time of each method.

    python examples/python/train_gpt.py                      # both, 4 workers
    python examples/python/train_gpt.py --method diloco --inner-steps 25

Both methods see the same data: worker r draws --batch windows of --context
characters per step from the training text with a generator seeded by
(--seed, r), for --steps steps, so they train on the same tokens; the model
starts from the same initialisation (seeded by --seed) on every worker; the
inner optimizer is torch.optim.AdamW with a linear warmup and a cosine decay
of its learning rate in both.

- ddp: after each backward, the gradients (flattened into one buffer) are
  all-reduced with torch.distributed's gloo backend and divided by the world
  size; then AdamW steps. Its bytes are counted here, not measured: a ring
  all-reduce of B bytes sends 2 (M - 1) / M x B bytes from each of the M
  workers, and B = 4 x parameters (fp32), once per step.
- diloco: each worker's AdamW steps on its own replica; ``outer.step()``
  after each one runs a round every --inner-steps steps (blocking sync,
  Nesterov outer optimizer, --compress); its bytes are the library's
  ``stats()["bytes_sent"]`` of rank 0.

The held-out loss is the mean cross-entropy (nats per character) of the
final model (DiLoCo: theta_global) on fixed windows of the held-out text
(the last 10 % of every fortunes topic file), evaluated by rank 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

FORTUNES_DIR = "/usr/share/games/fortunes"


# ----------------------------------------------------------------- data
def clean_fortune_text(raw: bytes) -> str:
    """One fortune file as plain text, as examples/char_mlp/corpus.hpp does:
    the '%' separator lines become blank lines, a backspace removes the
    character before it on the line (nroff's overstrike keeps the last one),
    tabs become spaces, other control bytes and non-ASCII bytes are dropped."""
    out: List[str] = []
    line_start = 0
    for c in raw:
        if c == 10:
            if len(out) == line_start + 1 and out[line_start] == "%":
                out.pop()
            out.append("\n")
            line_start = len(out)
        elif c == 8:
            if len(out) > line_start:
                out.pop()
        elif c == 9:
            out.append(" ")
        elif 32 <= c < 127:
            out.append(chr(c))
    return "".join(out)


def fortune_files(directory: str) -> List[str]:
    """The topic files: regular files that are not .dat indexes, by name."""
    names = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not name.endswith(".dat") and os.path.isfile(path) and not os.path.islink(path):
            names.append(path)
    return names


def load_fortunes(directory: str, held_out_fraction: float = 0.1) -> Tuple[str, str]:
    """(train, held_out): the last `held_out_fraction` of every topic file,
    from the next line start, is held out (the split of examples/char_mlp)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"train_gpt: {directory} not found; install Debian's `fortunes` package "
                                f"or pass --fortunes-dir DIR")
    train, held = [], []
    for path in fortune_files(directory):
        with open(path, "rb") as f:
            text = clean_fortune_text(f.read())
        tail = int(len(text) * held_out_fraction)
        eol = text.find("\n", len(text) - tail)
        cut = len(text) if eol < 0 else eol + 1
        train.append(text[:cut])
        held.append(text[cut:])
    train_text, held_text = "".join(train), "".join(held)
    if len(train_text) < 10000 or len(held_text) < 1000:
        raise ValueError(f"train_gpt: {directory} holds too little text ({len(train_text)} training and "
                         f"{len(held_text)} held-out characters; expected at least 10000 and 1000)")
    return train_text, held_text


def encode(train_text: str, held_text: str) -> Tuple[torch.Tensor, torch.Tensor, int]:
    alphabet = sorted(set(train_text) | set(held_text))
    ids = {c: i for i, c in enumerate(alphabet)}
    as_tensor = lambda s: torch.tensor([ids[c] for c in s], dtype=torch.uint8)  # noqa: E731
    return as_tensor(train_text), as_tensor(held_text), len(alphabet)


def batch(train: torch.Tensor, gen: torch.Generator, count: int, context: int) -> Tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, train.numel() - context - 1, (count,), generator=gen)
    idx = starts[:, None] + torch.arange(context + 1)[None, :]
    w = train[idx].long()
    return w[:, :-1], w[:, 1:]


# ----------------------------------------------------------------- model
class Block(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP (GPT-2's layout)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(future[:t, :t], float("-inf"))
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A decoder-only transformer over characters (examples/gpt/model.hpp's
    layout and GPT-2's initialisation: normal(0, 0.02), the residual output
    projections at 0.02 / sqrt(2 layers), zero biases, unit LayerNorms)."""

    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int, seed: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"train_gpt: --width ({width}) must be a multiple of --heads ({heads})")
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("future", torch.ones(context, context, dtype=torch.bool).triu(1))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln" in name or name.startswith("ln."):
                    p.fill_(1.0) if name.endswith("weight") else p.zero_()
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                    p.normal_(0.0, std, generator=gen)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.future)
        return self.head(self.ln(x))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def held_out_loss(model: nn.Module, held: torch.Tensor, context: int, windows: int) -> float:
    """Mean cross-entropy over `windows` evenly spaced windows of the held-out text."""
    model.eval()
    starts = torch.linspace(0, held.numel() - context - 2, windows).long()
    idx = starts[:, None] + torch.arange(context + 1)[None, :]
    w = held[idx].long()
    total = 0.0
    for i in range(0, windows, 64):
        total += loss_of(model, w[i:i + 64, :-1], w[i:i + 64, 1:]).item() * w[i:i + 64].shape[0]
    model.train()
    return total / windows


def lr_at(step: int, a: argparse.Namespace) -> float:
    """Linear warmup over --warmup steps, then a cosine to 10 % of --lr."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    progress = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------- workers
def ring_allreduce_bytes_sent(buffer_bytes: int, world: int) -> float:
    """Bytes one worker sends in a ring all-reduce (reduce-scatter then
    all-gather) of a buffer of `buffer_bytes` bytes over `world` workers."""
    return 2.0 * (world - 1) / world * buffer_bytes


def worker(rank: int, method: str, a: argparse.Namespace, store_dir: str, result_path: str) -> None:
    torch.set_num_threads(1)
    train_text, held_text = load_fortunes(a.fortunes_dir)
    train, held, vocab = encode(train_text, held_text)
    model = GPT(vocab, a.context, a.width, a.layers, a.heads, a.seed)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(a.seed * 1000003 + rank)

    outer = None
    if method == "ddp":
        dist.init_process_group("gloo", init_method="file://" + os.path.join(store_dir, "ddp"), rank=rank,
                                world_size=a.workers)
        flat = torch.zeros(n_params)
        barrier = dist.barrier
    else:
        import diloco
        comm = diloco.gloo.connect(rank, a.workers, "file://" + os.path.join(store_dir, "diloco"), timeout=300.0)
        outer = diloco.DiLoCo(params, inner_steps=a.inner_steps,
                              outer=diloco.Nesterov(lr=a.outer_lr, momentum=a.outer_momentum),
                              compress=a.compress, sync="blocking", comm=comm)
        # Construction broadcast rank 0's parameters (a collective): the
        # workers start together, and finish() below ends on a round.
        barrier = lambda: None  # noqa: E731
    barrier()
    start = time.perf_counter()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x, y = batch(train, gen, a.batch, a.context)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if method == "ddp":
            offset = 0
            for p in params:  # one bucket: the whole gradient
                flat[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                offset += p.numel()
            dist.all_reduce(flat)
            flat /= a.workers
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        opt.step()
        if outer is not None:
            outer.step()
        if rank == 0 and a.log_every and (step + 1) % a.log_every == 0:
            print(f"  {method} step {step + 1}/{a.steps}: train loss {loss.item():.4f}", flush=True)
    if outer is not None:
        outer.finish()
    barrier()
    seconds = time.perf_counter() - start
    if method == "ddp":
        bytes_sent = a.steps * ring_allreduce_bytes_sent(4 * n_params, a.workers)
        rounds = a.steps
    else:
        stats = outer.stats()
        bytes_sent = float(stats["bytes_sent"])
        rounds = int(stats["rounds"])
        with torch.no_grad():  # evaluate theta_global
            for p, g in zip(params, outer.global_parameters()):
                p.copy_(g)
    if rank == 0:
        result = {"held_out_loss": held_out_loss(model, held, a.context, a.eval_windows),
                  "bytes_sent_per_worker": bytes_sent, "wall_seconds": seconds, "exchanges": rounds}
        with open(result_path, "w") as f:
            json.dump(result, f)
    if method == "ddp":
        dist.destroy_process_group()
    elif outer is not None:
        outer.close()


def run_method(method: str, a: argparse.Namespace) -> Dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"train_gpt_{method}_") as d:
        os.makedirs(os.path.join(d, "diloco"))
        result_path = os.path.join(d, "result.json")
        mp.spawn(worker, args=(method, a, d, result_path), nprocs=a.workers, join=True)
        with open(result_path) as f:
            return json.load(f)


def parse(argv: List[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("ddp", "diloco", "both"), default="both")
    ap.add_argument("--workers", type=int, default=4, help="processes per method")
    ap.add_argument("--steps", type=int, default=500, help="optimizer steps per worker")
    ap.add_argument("--batch", type=int, default=16, help="windows per worker and step")
    ap.add_argument("--context", type=int, default=64, help="characters per window")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3, help="AdamW's peak learning rate")
    ap.add_argument("--warmup", type=int, default=30, help="steps of linear lr warmup")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--inner-steps", type=int, default=50, help="DiLoCo's H")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--compress", choices=("none", "int8+ef", "int4+ef"), default="none",
                    help="DiLoCo's pseudo-gradient codec")
    ap.add_argument("--eval-windows", type=int, default=512, help="held-out windows evaluated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=0, help="print rank 0's training loss every N steps")
    ap.add_argument("--fortunes-dir", default=FORTUNES_DIR)
    a = ap.parse_args(argv)
    for name in ("workers", "steps", "batch", "context", "width", "layers", "heads", "inner_steps",
                 "eval_windows", "warmup"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if a.steps % a.inner_steps:
        ap.error(f"--steps ({a.steps}) must be a multiple of --inner-steps ({a.inner_steps}), so that the "
                 f"last step ends a DiLoCo round")
    return a


def main(argv: List[str]) -> int:
    a = parse(argv)
    methods = ("ddp", "diloco") if a.method == "both" else (a.method,)
    if "diloco" in methods:
        try:
            import diloco
        except ImportError as e:
            raise SystemExit(f"train_gpt: --method {a.method} needs the diloco package ({e}); install it with "
                             f"`pip install .` from the repository root (docs/python.md)") from None
        if not diloco.gloo.available():
            raise SystemExit("train_gpt: this build of diloco has no Gloo (libgloo-dev was not found when it "
                             "was built); --method ddp still runs")
    train_text, held_text = load_fortunes(a.fortunes_dir)
    train, held, vocab = encode(train_text, held_text)
    model = GPT(vocab, a.context, a.width, a.layers, a.heads, a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    torch.set_num_threads(1)
    print(f"data: {a.fortunes_dir}, {train.numel()} training and {held.numel()} held-out characters")
    print(f"vocab: {vocab}")
    print(f"parameters: {n_params}")
    print(f"workers: {a.workers}")
    print(f"tokens_per_method: {a.workers * a.steps * a.batch * a.context}")
    print(f"initial.held_out_loss: {held_out_loss(model, held, a.context, a.eval_windows):.4f}", flush=True)
    results = {}
    for m in methods:
        r = run_method(m, a)
        results[m] = r
        print(f"{m}.held_out_loss: {r['held_out_loss']:.4f}")
        print(f"{m}.bytes_sent_per_worker: {r['bytes_sent_per_worker']:.0f}")
        print(f"{m}.exchanges: {r['exchanges']}")
        print(f"{m}.wall_seconds: {r['wall_seconds']:.2f}", flush=True)
    print()
    print("| method | held-out loss | bytes sent per worker | exchanges | wall s |")
    print("|---|---|---|---|---|")
    for m, r in results.items():
        name = m if m == "ddp" else f"diloco (H={a.inner_steps}, {a.compress})"
        print(f"| {name} | {r['held_out_loss']:.4f} | {r['bytes_sent_per_worker'] / 1e6:.2f} MB | "
              f"{r['exchanges']} | {r['wall_seconds']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
