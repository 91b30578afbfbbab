# SPDX-License-Identifier: Apache-2.0
"""bf16 / fp16 parameters (a low-precision replica, docs/algorithms.md section
6a) through the Python wrapper: a bf16 torch model trained by
torch.optim.SGD on two workers follows a pure-PyTorch DiLoCo written here
from the rules (theta_global fp32; an fp32 mirror S per worker read from the
bf16 tensors at the round as S + (T - RNE(S)), nudged one fp32 ulp toward T
on a tie; merged values rounded to nearest even by torch's own conversion);
a round without inner progress leaves everything as it was; NumPy float16
arrays work; the grid of compiled policy sets per dtype is listed and
anything else is a ValueError naming it."""

import numpy as np
import pytest
import torch

import diloco
from reference import batch, make_model

torch.set_num_threads(1)

H, STEPS, WORKERS = 3, 9, 2
OUTER_LR, OUTER_MU = 0.7, 0.9


def bf16_model(seed):
    return make_model(seed).to(torch.bfloat16)


def bf16_step(model, opt, rank, step):
    x, y = batch(rank, step)
    loss = torch.nn.functional.mse_loss(model(x.to(torch.bfloat16)).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def pull(s, t):
    """The mirror's read (docs/algorithms.md 6a), written with torch ops."""
    written = s.to(torch.bfloat16)
    target = t.float()
    c = target + (s - written.float())
    toward = torch.nextafter(c, target)
    moved = torch.where(c.to(torch.bfloat16) == t, c, torch.where(toward.to(torch.bfloat16) == t, toward, target))
    return torch.where(t == written, s, moved)


def reference():
    """M workers in one process: their bf16 replicas and inner SGD, the fp32
    mirrors, theta_global with torch.optim.SGD(nesterov=True) outside."""
    models = [bf16_model(17) for _ in range(WORKERS)]  # the broadcast makes every start rank 0's
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    theta = [p.detach().float().clone().requires_grad_(True) for p in models[0].parameters()]
    outer = torch.optim.SGD(theta, lr=OUTER_LR, momentum=OUTER_MU, nesterov=True)
    mirrors = [[p.detach().float().clone() for p in m.parameters()] for m in models]
    for t in range(1, STEPS + 1):
        for r in range(WORKERS):
            bf16_step(models[r], opts[r], r, t)
        if t % H:
            continue
        with torch.no_grad():
            for r in range(WORKERS):
                for k, p in enumerate(models[r].parameters()):
                    mirrors[r][k] = pull(mirrors[r][k], p.detach())
            for k, g in enumerate(theta):
                g.grad = sum(g.detach() - mirrors[r][k] for r in range(WORKERS)) / WORKERS
        outer.step()
        with torch.no_grad():
            for r in range(WORKERS):
                for k, p in enumerate(models[r].parameters()):
                    mirrors[r][k] = theta[k].detach().clone()
                    p.copy_(theta[k].detach().to(torch.bfloat16))
    return [[p.detach().clone() for p in m.parameters()] for m in models], [g.detach().clone() for g in theta]


def wrapped():
    def worker(comm):
        model = bf16_model(comm.rank + 17)  # differs per rank: the broadcast makes them equal
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        t = diloco.DiLoCo(model.parameters(), inner_steps=H, outer=diloco.Nesterov(lr=OUTER_LR, momentum=OUTER_MU),
                          comm=comm)
        assert "bf16 replica" in t.policies
        rounds = 0
        for step in range(1, STEPS + 1):
            bf16_step(model, opt, comm.rank, step)
            rounds += t.step()
        return [p.detach().clone() for p in model.parameters()], [g.clone() for g in t.global_parameters()], rounds

    return diloco.threads(WORKERS).run(worker)


def test_bf16_torch_model_follows_a_pytorch_reference_of_the_rules():
    ref_replicas, ref_global = reference()
    got = wrapped()
    for r in range(WORKERS):
        replica, glob, rounds = got[r]
        assert rounds == STEPS // H
        for a, b in zip(glob, ref_global):
            assert a.dtype == torch.float32
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), (a - b).abs().max()
        for a, b in zip(replica, ref_replicas[r]):
            assert a.dtype == torch.bfloat16
            # the same bits but where the fp32 theta_global's last ulp (Nesterov
            # in torch and fused in diloco) falls on a bf16 rounding boundary
            assert (a == b).float().mean() > 0.99
            assert torch.allclose(a.float(), b.float(), rtol=2 ** -7, atol=0)
        # the merge reached the tensors: every element is RNE(theta_global)
        for a, g in zip(replica, glob):
            assert torch.equal(a, g.reshape(a.shape).to(torch.bfloat16))
    assert not torch.equal(got[0][1][0], bf16_model(17)[0].weight.detach().float().reshape(-1))  # it trained


def test_round_without_progress_changes_nothing_numpy_float16():
    w = (np.linspace(0.5, 1.5, 37)).astype(np.float16)
    t = diloco.DiLoCo([w], inner_steps=2, outer=diloco.SGD(lr=0.3))
    w -= np.float16(0.01) * np.arange(37, dtype=np.float16)  # one phase of progress
    t.step()
    assert t.step()
    g1, w1 = t.global_parameters()[0].copy(), w.copy()
    assert np.any(g1.astype(np.float16).astype(np.float32) != g1)  # theta_global is off fp16's grid
    for _ in range(6):  # no progress: Delta = 0 exactly
        t.step()
    assert np.array_equal(t.global_parameters()[0], g1)
    assert np.array_equal(w, w1)


def test_grid_per_dtype_and_errors():
    assert {"outer": "nesterov", "compress": "none", "sync": "blocking"} in diloco.compiled("bfloat16")
    assert {"outer": "sgd", "compress": "none", "sync": "blocking"} in diloco.compiled("float16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        diloco.compiled("float64")
    with pytest.raises(ValueError, match="with bf16 parameters; allowed with them: 'none'"):
        diloco.DiLoCo([torch.ones(8, dtype=torch.bfloat16)], inner_steps=2, compress="int8+ef")
    with pytest.raises(ValueError, match="sync 'one_step_delay' is not compiled in with fp16 parameters"):
        diloco.DiLoCo([torch.ones(8, dtype=torch.float16)], inner_steps=2, sync="one_step_delay")
    with pytest.raises(TypeError, match="parameter 1 is bfloat16 but parameter 0 is float16"):
        diloco.DiLoCo([torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.bfloat16)], inner_steps=1)
