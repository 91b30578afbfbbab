# SPDX-License-Identifier: Apache-2.0
"""The Python wrapper against values derived independently: a pure-PyTorch
DiLoCo (reference.py), NumPy arithmetic by hand, and the library's own
errors and checkpoints."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import diloco
from reference import close, inner_optimizer, inner_step, make_model, reference

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))


def test_version_and_grid():
    assert diloco.__version__.count(".") == 2
    grid = diloco.compiled()
    assert {"outer": "nesterov", "compress": "none", "sync": "blocking"} in grid
    assert {"outer": "nesterov", "compress": "int8+ef", "sync": "one_step_delay"} in grid


def wrapped_run(workers, steps, inner_steps, sync, inner, **kwargs):
    def worker(comm):
        model = make_model(seed=comm.rank + 17)  # differs per rank: the broadcast makes them equal
        opt = inner_optimizer(inner, model.parameters())
        outer = diloco.DiLoCo(model.parameters(), inner_steps=inner_steps, outer=diloco.Nesterov(lr=0.7, momentum=0.9),
                              sync=sync, comm=comm, **kwargs)
        for t in range(1, steps + 1):
            inner_step(model, opt, comm.rank, t)
            outer.step()
        outer.finish()
        return [p.detach().clone() for p in model.parameters()], [g.clone() for g in outer.global_parameters()]

    return diloco.threads(workers).run(worker)


@pytest.mark.parametrize("sync,inner", [("blocking", "sgd"), ("blocking", "adamw"), ("one_step_delay", "sgd"),
                                        ("one_step_delay", "adamw")])
def test_trajectory_equals_pytorch_diloco(sync, inner):
    workers, steps, h = 2, 13, 3
    ref_replicas, ref_global = reference(workers, steps, h, sync=sync, inner=inner, seed=17)
    got = wrapped_run(workers, steps, h, sync, inner)
    for r in range(workers):
        replica, glob = got[r]
        for a, b in zip(replica, ref_replicas[r]):
            assert close(a, b), (sync, inner, r, (a - b).abs().max())
        for a, b in zip(glob, ref_global):
            assert close(a, b), (sync, inner, r, (a - b).abs().max())


def test_compressed_run_trains_and_counts_bytes():
    got = wrapped_run(2, 8, 4, "blocking", "sgd", compress="int8+ef")
    ref_replicas, _ = reference(2, 8, 4, seed=17)
    for a, b in zip(got[0][0], ref_replicas[0]):  # close to the uncompressed run, not equal
        assert not torch.equal(a, b) and torch.allclose(a, b, atol=5e-2)


def test_numpy_arrays_world_of_one():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(4, dtype=np.float32)
    # outer SGD with lr 1 and no momentum: theta_global follows the replica
    t = diloco.DiLoCo([w, b], inner_steps=2, outer=diloco.SGD(lr=0.5))
    w0, b0 = w.copy(), b.copy()
    w -= 1.0
    b *= 3.0
    assert t.step() is False
    assert t.step() is True  # round: theta = theta0 - 0.5 * (theta0 - local)
    np.testing.assert_array_equal(w, w0 - 0.5)
    np.testing.assert_array_equal(b, b0 * 2.0)
    gw, gb = t.global_parameters()
    assert isinstance(gw, np.ndarray) and gw.shape == (2, 3) and not gw.flags.writeable
    np.testing.assert_array_equal(gw, w)
    np.testing.assert_array_equal(gb, b)
    s = t.stats()
    assert s["rounds"] == 1 and s["inner_steps"] == 2 and s["workers"] == 1


def test_threads_results_and_worker_exception():
    assert diloco.threads(3).run(lambda comm: (comm.rank, comm.size, comm.kind)) == [
        (0, 3, "threads"), (1, 3, "threads"), (2, 3, "threads")]

    class Boom(Exception):
        pass

    def worker(comm):
        x = np.zeros(8, dtype=np.float32)
        t = diloco.DiLoCo([x], inner_steps=1, comm=comm)
        if comm.rank == 1:
            raise Boom("rank 1 gives up")
        t.step()  # rank 0 waits in a collective until rank 1's failure breaks the group

    with pytest.raises(Boom, match="rank 1 gives up"):
        diloco.threads(2, timeout=20).run(worker)


def test_gil_is_released_during_a_round():
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.005)

    def worker(comm):
        x = np.ones(1000, dtype=np.float32)
        t = diloco.DiLoCo([x], inner_steps=1, comm=comm)
        if comm.rank == 1:
            time.sleep(0.5)  # rank 0 sits in the round's collective meanwhile
        before = len(ticks)
        t.step()
        return len(ticks) - before

    th = threading.Thread(target=ticker)
    th.start()
    try:
        counts = diloco.threads(2).run(worker)
    finally:
        stop.set()
        th.join()
    assert counts[0] > 20  # the ticker ran while rank 0 waited inside step()


def test_streaming_fragments_over_threads():
    def worker(comm):
        model = make_model(seed=3)
        opt = inner_optimizer("sgd", model.parameters())
        outer = diloco.DiLoCo(model.parameters(), inner_steps=4, sync="streaming", fragments=2, comm=comm)
        applied = 0
        for t in range(1, 13):
            inner_step(model, opt, comm.rank, t)
            applied += outer.step()
        outer.finish()
        return applied, outer.stats(), outer.policies

    for applied, stats, policies in diloco.threads(2).run(worker):
        assert applied == 6 and stats["rounds"] == 6  # 2 fragments, each every 4 steps
        assert len(stats["fragment_bytes_sent"]) == 2 and all(b > 0 for b in stats["fragment_bytes_sent"])
        assert "streaming" in policies


def test_event_hook_is_a_python_callable():
    events = []
    x = np.ones(8, dtype=np.float32)
    t = diloco.DiLoCo([x], inner_steps=2, on_event=events.append)
    for _ in range(4):
        x -= 0.25
        t.step()
    assert [e["kind"] for e in events] == ["round", "round"]
    assert [e["round"] for e in events] == [1, 2] and [e["inner_step"] for e in events] == [2, 4]
    assert events[0]["pseudo_gradient_norm"] == pytest.approx(0.5 * np.sqrt(8), rel=1e-6)


def test_type_stubs_are_installed():
    stub = os.path.join(os.path.dirname(diloco.__file__), "_core.pyi")
    with open(stub) as f:
        text = f.read()
    assert "class Trainer" in text and "class Comm" in text and "def threads_run" in text
    assert os.path.exists(os.path.join(os.path.dirname(diloco.__file__), "py.typed"))


# ---------------------------------------------------------------- errors
def test_config_error_with_the_library_message():
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(diloco.ConfigError, match=r"^diloco: inner_steps \(H\) must be at least 1, got 0$"):
        diloco.DiLoCo([x], inner_steps=0)
    assert issubclass(diloco.ConfigError, diloco.Error) and issubclass(diloco.ConfigError, ValueError)
    with pytest.raises(diloco.ConfigError, match="outer"):
        diloco.DiLoCo([x], inner_steps=1, outer=diloco.Nesterov(lr=-1.0))


def test_unsupported_combination_is_value_error_naming_the_allowed_values():
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match="allowed with them: 'int4\\+ef', 'int8\\+ef', 'none'"):
        diloco.DiLoCo([x], inner_steps=1, compress="topk")
    with pytest.raises(ValueError, match="'blocking', 'one_step_delay', 'streaming'"):
        diloco.DiLoCo([x], inner_steps=1, sync="eager")
    with pytest.raises(ValueError, match="Nesterov"):
        diloco.DiLoCo([x], inner_steps=1, outer="adam")


def test_numeric_error_rejects_the_round():
    x = np.ones(4, dtype=np.float32)
    t = diloco.DiLoCo([x], inner_steps=1)
    x[2] = np.nan
    with pytest.raises(diloco.NumericError, match="not finite|non-finite|nan"):
        t.step()
    assert t.stats()["rejected_rounds"] == 1
    np.testing.assert_array_equal(x, np.ones(4, dtype=np.float32))  # reset to theta_global


def test_format_error_for_corrupt_state():
    x = np.ones(16, dtype=np.float32)
    t = diloco.DiLoCo([x], inner_steps=2)
    sd = t.state_dict()
    bad = bytearray(sd["checkpoint"])
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(diloco.FormatError, match="^diloco: "):
        t.load_state_dict({"checkpoint": bytes(bad)})
    with pytest.raises(diloco.FormatError):
        t.load_state_dict({"checkpoint": sd["checkpoint"][:40]})


def test_state_error_while_a_reduction_is_in_flight():
    x = np.ones(16, dtype=np.float32)
    t = diloco.DiLoCo([x], inner_steps=1, sync="one_step_delay")
    sd = t.state_dict()
    x -= 0.5
    t.step()  # round 1 begins its reduction and keeps it in flight
    with pytest.raises(diloco.StateError, match="^diloco: load: a reduction is in flight"):
        t.load_state_dict(sd)


def test_comm_error_when_a_peer_is_gone():
    seen = []

    def worker(comm):
        if comm.rank == 1:
            return "left"
        x = np.ones(4, dtype=np.float32)
        try:
            diloco.DiLoCo([x], inner_steps=1, comm=comm)
        except diloco.CommError as e:
            seen.append(str(e))
            raise

    # The worker sees the library's message, and so does the caller of run().
    message = r"^diloco: threads all_gather on rank 0: rank 1 has left the group \(its worker function returned\)"
    with pytest.raises(diloco.CommError, match=message):
        diloco.threads(2, timeout=5).run(worker)
    assert len(seen) == 1 and seen[0].startswith("diloco: threads all_gather on rank 0: rank 1 has left"), seen


# ------------------------------------------------------------- tensors
def test_wrong_dtype_device_layout_are_type_or_value_errors():
    with pytest.raises(TypeError, match="parameter 0 has dtype float64"):
        diloco.DiLoCo([np.ones(3)], inner_steps=1)
    with pytest.raises(TypeError, match="parameter 1 is bfloat16 but parameter 0 is float32"):
        diloco.DiLoCo([torch.ones(3), torch.ones(3, dtype=torch.bfloat16)], inner_steps=1)
    with pytest.raises(TypeError, match="parameter 0 has dtype a signed integer type"):
        diloco.DiLoCo([torch.ones(3, dtype=torch.int32)], inner_steps=1)
    with pytest.raises(ValueError, match="not contiguous"):
        diloco.DiLoCo([torch.ones(4, 3).t()], inner_steps=1)
    with pytest.raises(ValueError, match="not contiguous"):
        diloco.DiLoCo([np.ones((4, 6), dtype=np.float32)[:, ::2]], inner_steps=1)
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="not a writable tensor"):
        diloco.DiLoCo([ro], inner_steps=1)
    with pytest.raises(TypeError, match="not a writable tensor"):
        diloco.DiLoCo([[1.0, 2.0]], inner_steps=1)
    with pytest.raises((TypeError, ValueError)):
        diloco.DiLoCo([torch.ones(3, device="meta")], inner_steps=1)
    with pytest.raises(ValueError, match="empty"):
        diloco.DiLoCo([], inner_steps=1)


# ---------------------------------------------------------- checkpoints
def run_with_save(save_at, load_from=None, steps=10, h=3):
    model = make_model(seed=5)
    opt = inner_optimizer("sgd", model.parameters())
    outer = diloco.DiLoCo(model.parameters(), inner_steps=h, sync="one_step_delay", compress="int8+ef")
    saved = None
    first = 1
    if load_from is not None:
        sd, opt_sd, first = load_from
        outer.load_state_dict(sd)
        opt.load_state_dict(opt_sd)
    for t in range(first, steps + 1):
        inner_step(model, opt, 0, t)
        outer.step()
        if t == save_at:
            saved = (outer.state_dict(), {k: v for k, v in opt.state_dict().items()}, t + 1)
            import copy
            saved = copy.deepcopy(saved)
    outer.finish()
    return [p.detach().clone() for p in model.parameters()], saved


def test_state_dict_round_trip_is_bitwise():
    full, saved = run_with_save(save_at=4)
    resumed, _ = run_with_save(save_at=None, load_from=saved)
    for a, b in zip(full, resumed):
        assert torch.equal(a, b)
    assert saved[0]["checkpoint"][:4] != b"" and isinstance(saved[0]["checkpoint"], bytes)


# ----------------------------------------------------------------- gloo
@pytest.mark.skipif(not diloco.gloo.available(), reason="built without Gloo")
def test_gloo_two_processes_match_pytorch_diloco(tmp_path):
    env = dict(os.environ)
    env.update(WORLD_SIZE="2", DILOCO_STORE=f"file://{tmp_path}/store", DILOCO_TIMEOUT_MS="30000",
               PYTHONPATH=HERE + os.pathsep + env.get("PYTHONPATH", ""))
    procs = []
    for r in range(2):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "gloo_worker.py"), str(tmp_path / f"out{r}.pt")],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()
    ref_replicas, ref_global = reference(2, 9, 3, sync="one_step_delay", inner="adamw", seed=17)
    for r in range(2):
        replica, glob, rank, kind = torch.load(tmp_path / f"out{r}.pt")
        assert rank == r and kind == "gloo"
        for a, b in zip(replica, ref_replicas[r]):
            assert close(a, b), (a - b).abs().max()
        for a, b in zip(glob, ref_global):
            assert close(a, b)


@pytest.mark.skipif(not diloco.gloo.available(), reason="built without Gloo")
def test_launch_starts_workers_like_the_cpp_launcher(tmp_path):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DILOCO_STORE"):
        env.pop(k, None)
    script = tmp_path / "w.py"
    script.write_text("import diloco, numpy as np\n"
                      "c = diloco.gloo.from_env()\n"
                      "x = np.full(4, float(c.rank), dtype=np.float32)\n"
                      "t = diloco.DiLoCo([x], inner_steps=1, outer=diloco.SGD(), comm=c)\n"
                      "x += c.rank\n"
                      "t.step()\n"
                      "print('done', c.rank, c.size, c.local_rank, x[0])\n")
    r = subprocess.run([sys.executable, "-m", "diloco.launch", "--nproc", "2", str(script)], env=env,
                       capture_output=True, timeout=120)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    # rank 0's x (0) is broadcast; the replicas move to 0 and 1; model averaging gives 0.5 on both
    assert "[rank 0] done 0 2 0 0.5" in out and "[rank 1] done 1 2 1 0.5" in out, out
    bad = tmp_path / "bad.py"
    bad.write_text("import sys, time\nimport os\nsys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    r = subprocess.run([sys.executable, "-m", "diloco.launch", "--nproc", "2", str(bad)], env=env,
                       capture_output=True, timeout=60)
    assert r.returncode == 3 and b"rank 1 exited with status 3" in r.stderr


def test_gloo_from_env_names_the_missing_variable():
    with pytest.raises(ValueError, match="WORLD_SIZE or DILOCO_WORLD_SIZE is not set"):
        diloco.gloo.from_env({})
    with pytest.raises(ValueError, match="DILOCO_STORE is not set"):
        diloco.gloo.from_env({"RANK": "0", "WORLD_SIZE": "1"})
    if diloco.gloo.available():
        with pytest.raises(diloco.ConfigError, match="file:///absolute/directory"):
            diloco.gloo.from_env({"RANK": "0", "WORLD_SIZE": "1", "DILOCO_STORE": "nfs://x"})
