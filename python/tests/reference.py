# SPDX-License-Identifier: Apache-2.0
"""A pure-PyTorch DiLoCo, written from the algorithm's definition, to check
the wrapper against: M replicas in one process, the user's inner optimizer
on each, torch.optim.SGD(nesterov=True) as the outer optimizer on the mean
pseudo-gradient. Also the small model and data the tests train."""

import torch

FEATURES, HIDDEN, OUT = 6, 8, 3


def make_model(seed):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def batch(rank, step):
    """Worker `rank`'s data at inner step `step` (deterministic)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, FEATURES, generator=g)
    y = torch.sin(x[:, :OUT] * 1.5) + 0.1 * rank
    return x, y


def inner_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    raise ValueError(kind)


def inner_step(model, opt, rank, step):
    x, y = batch(rank, step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def reference(workers, steps, inner_steps, sync="blocking", inner="sgd", lr=0.7, momentum=0.9, seed=0):
    """The final replicas (list per worker of tensors) and theta_global."""
    # Every replica starts from rank 0's parameters (the library broadcasts them).
    models = [make_model(seed) for _ in range(workers)]
    opts = [inner_optimizer(inner, m.parameters()) for m in models]
    glob = [p.detach().clone() for p in models[0].parameters()]
    outer = torch.optim.SGD(glob, lr=lr, momentum=momentum, nesterov=True)
    start = [[p.detach().clone() for p in m.parameters()] for m in models]  # one_step_delay's s
    pending = None  # one_step_delay: the mean reduced last round, applied this round

    def outer_step(mean):
        for g, d in zip(glob, mean):
            g.grad = d.clone()
        outer.step()

    for t in range(1, steps + 1):
        for r, (m, o) in enumerate(zip(models, opts)):
            inner_step(m, o, r, t)
        if t % inner_steps:
            continue
        with torch.no_grad():
            if sync == "blocking":
                deltas = [[g - p for g, p in zip(glob, m.parameters())] for m in models]
                mean = [sum(ds[k] for ds in deltas) / workers for k in range(len(glob))]
                outer_step(mean)
                for m in models:
                    for p, g in zip(m.parameters(), glob):
                        p.copy_(g)
            else:  # one_step_delay
                deltas = [[s - p for s, p in zip(start[r], m.parameters())] for r, m in enumerate(models)]
                if pending is not None:
                    outer_step(pending)
                    for r, m in enumerate(models):
                        for p, g, d in zip(m.parameters(), glob, deltas[r]):
                            p.copy_(g - d)
                for r, m in enumerate(models):
                    start[r] = [p.detach().clone() for p in m.parameters()]
                pending = [sum(ds[k] for ds in deltas) / workers for k in range(len(glob))]
    if sync == "one_step_delay" and pending is not None:  # finish()
        with torch.no_grad():
            deltas = [[s - p for s, p in zip(start[r], m.parameters())] for r, m in enumerate(models)]
            outer_step(pending)
            for r, m in enumerate(models):
                for p, g, d in zip(m.parameters(), glob, deltas[r]):
                    p.copy_(g - d)
    return [[p.detach().clone() for p in m.parameters()] for m in models], [g.clone() for g in glob]


def close(a, b, rel=1e-6):
    """||a - b|| <= rel * ||b|| (per tensor, 2-norm): fp32 rounding of the
    same operations in a different order stays far below it; one element
    off by a step of the algorithm does not."""
    return float((a - b).norm()) <= rel * float(b.norm())
