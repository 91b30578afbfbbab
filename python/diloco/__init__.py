# SPDX-License-Identifier: Apache-2.0
"""DiLoCo (low-communication distributed training) around your own PyTorch
(or NumPy) training loop, on diloco's C++ core.

Your optimizer takes the inner steps on the model's tensors; ``DiLoCo.step()``
counts each one and, when the schedule says so, forms the pseudo-gradient,
averages it across the workers (compressed if asked), takes the outer step
and writes the result back into the same tensors::

    outer = diloco.DiLoCo(model.parameters(), inner_steps=100,
                          outer=diloco.Nesterov(lr=0.7, momentum=0.9),
                          compress="int8+ef", sync="one_step_delay",
                          comm=diloco.gloo.from_env())
    for batch in data:
        loss(model, batch).backward(); opt.step(); opt.zero_grad()
        outer.step()
    outer.finish()

docs/python.md has the whole story and the compiled grid of policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional

from . import _core
from . import gloo
from ._core import (
    Comm,
    CommError,
    ConfigError,
    Error,
    FormatError,
    NumericError,
    StateError,
)

__version__: str = _core.__version__

__all__ = [
    "DiLoCo",
    "Nesterov",
    "SGD",
    "Comm",
    "threads",
    "local",
    "gloo",
    "compiled",
    "Error",
    "ConfigError",
    "CommError",
    "FormatError",
    "NumericError",
    "StateError",
    "__version__",
]


@dataclass(frozen=True)
class Nesterov:
    """The outer optimizer of the DiLoCo paper: SGD with Nesterov momentum,
    exactly torch.optim.SGD(nesterov=True, dampening=0) applied to the
    averaged pseudo-gradient."""

    lr: float = 0.7
    momentum: float = 0.9


@dataclass(frozen=True)
class SGD:
    """Outer SGD as torch.optim.SGD (lr 1 and no momentum: model averaging)."""

    lr: float = 1.0
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False


def compiled(dtype: str = "float32") -> List[Dict[str, str]]:
    """The policy sets this build holds for parameters of ``dtype``
    ("float32", or "bfloat16" / "float16": a low-precision replica, whose
    grid is smaller): [{'outer', 'compress', 'sync'}, ...]."""
    grids = {"float32": _core.compiled, "bfloat16": _core.compiled_bfloat16, "float16": _core.compiled_float16}
    if dtype not in grids:
        raise ValueError(f"diloco: dtype must be one of {', '.join(map(repr, grids))}, got {dtype!r}")
    out = []
    for key in grids[dtype]:
        o, c, s = key.split("|")
        out.append({"outer": o, "compress": c, "sync": s})
    return out


def local() -> Comm:
    """A world of one worker (no communication): DiLoCo on its own trajectory."""
    return _core.local()


class threads:
    """M workers as threads of this process (comm::threads), for experiments
    and tests: ``diloco.threads(4).run(fn)`` calls ``fn(comm)`` on 4 threads
    and returns their results in rank order. If a worker raises, the others'
    collectives fail with CommError and the first exception is raised here.
    The communicator lives while ``fn`` runs."""

    def __init__(self, size: int, timeout: float = 300.0):
        if int(size) < 1:
            raise ValueError(f"diloco.threads: size must be at least 1, got {size}")
        self.size = int(size)
        self.timeout = float(timeout)

    def run(self, fn: Callable[[Comm], Any]) -> List[Any]:
        return _core.threads_run(self.size, fn, self.timeout)


def _tensor_list(params: Any) -> List[Any]:
    if hasattr(params, "__dlpack__") or hasattr(params, "__array_interface__"):
        params = [params]
    out = []
    for p in params:
        # torch.nn.Parameter / tensors that require grad refuse __dlpack__;
        # detach() shares their storage, so the views stay the model's.
        detach = getattr(p, "detach", None)
        if callable(detach) and getattr(p, "requires_grad", False):
            p = detach()
        out.append(p)
    return out


def _framework(tensors: List[Any]) -> str:
    mod = type(tensors[0]).__module__ if tensors else ""
    return "torch" if mod.startswith("torch") else "numpy"


_SYNCS = ("blocking", "one_step_delay", "streaming")


class DiLoCo:
    """DiLoCo around the user's optimizer (the library's wrapper mode).

    ``params``: the replica's fp32 CPU tensors (``model.parameters()``,
    torch tensors, NumPy arrays, anything with ``__dlpack__``), contiguous;
    diloco keeps pointers into them, so keep training these same tensors.

    ``inner_steps``: H, the inner steps between outer rounds.
    ``outer``: ``diloco.Nesterov(lr, momentum)`` (default) or ``diloco.SGD(...)``.
    ``compress``: how a pseudo-gradient travels ("none", "int8+ef", "int4+ef").
    ``sync``: "blocking", "one_step_delay" or "streaming" (with
    ``fragments``, ``delay``, ``alpha``).
    ``comm``: ``diloco.gloo.from_env()``, a ``diloco.threads`` worker's
    communicator, or None for a world of one.
    ``on_event``: called with a dict per round applied or rejected.

    Construction, ``step()``, ``finish()``, ``state_dict()`` and
    ``load_state_dict()`` are collective: every worker calls them. The GIL
    is released while they run. ``diloco.compiled()`` lists the policy sets
    this build holds; any other raises ValueError naming the allowed values.
    """

    def __init__(
        self,
        params: Iterable[Any],
        *,
        inner_steps: int,
        outer: Any = None,
        compress: str = "none",
        sync: str = "blocking",
        comm: Optional[Comm] = None,
        fragments: int = 1,
        delay: int = 0,
        alpha: float = 0.0,
        seed: int = 0,
        broadcast_initial: bool = True,
        host_threads: int = 0,
        on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
    ):
        if outer is None:
            outer = Nesterov()
        if isinstance(outer, Nesterov):
            kind, lr, momentum, dampening, wd, nesterov = "nesterov", outer.lr, outer.momentum, 0.0, 0.0, False
        elif isinstance(outer, SGD):
            kind, lr, momentum = "sgd", outer.lr, outer.momentum
            dampening, wd, nesterov = outer.dampening, outer.weight_decay, outer.nesterov
        else:
            raise ValueError(f"diloco: outer must be diloco.Nesterov(...) or diloco.SGD(...), got {outer!r}")
        if not isinstance(compress, str):
            raise ValueError(f"diloco: compress is a name ({self._allowed('compress')}), got {compress!r}")
        if sync not in _SYNCS:
            raise ValueError(f"diloco: sync must be one of {', '.join(map(repr, _SYNCS))}, got {sync!r}")
        if sync != "streaming" and (fragments != 1 or delay != 0 or alpha != 0.0):
            raise ValueError("diloco: fragments, delay and alpha are options of sync='streaming'")
        if isinstance(inner_steps, bool) or int(inner_steps) != inner_steps or inner_steps < 0:
            raise ValueError(f"diloco: inner_steps must be a positive integer, got {inner_steps!r}")
        if on_event is not None and not callable(on_event):
            raise TypeError("diloco: on_event must be callable")
        if comm is not None and not isinstance(comm, Comm):
            raise TypeError(f"diloco: comm must be a diloco communicator (diloco.gloo.from_env(), a "
                            f"diloco.threads worker's, diloco.local()), got {type(comm).__name__}")
        self._tensors = _tensor_list(params)
        if not self._tensors:
            raise ValueError("diloco: the parameter list is empty; nothing to train")
        self._framework = _framework(self._tensors)
        self._shapes = [tuple(getattr(t, "shape", ())) for t in self._tensors]
        self._comm = comm
        self._core = _core.Trainer(
            self._tensors, comm, outer=kind, outer_lr=float(lr), outer_momentum=float(momentum),
            outer_dampening=float(dampening), outer_weight_decay=float(wd), outer_nesterov=bool(nesterov),
            compress=compress, sync=sync, inner_steps=int(inner_steps), fragments=int(fragments),
            delay=int(delay), alpha=float(alpha), seed=int(seed), broadcast_initial=bool(broadcast_initial),
            host_threads=int(host_threads), on_event=on_event)

    @staticmethod
    def _allowed(axis: str) -> str:
        return ", ".join(sorted({repr(c[axis]) for c in compiled()}))

    def step(self) -> bool:
        """Counts one inner step of your optimizer (call it after ``opt.step()``)
        and runs what the schedule asks for. True when an outer step was applied
        (the tensors now hold the merged parameters)."""
        return self._core.step()

    def finish(self) -> None:
        """Completes and applies every reduction in flight (collective): before
        evaluating ``global_parameters()``, saving, and at the end of training."""
        self._core.finish()

    def close(self) -> None:
        """Releases the C++ state now (later calls raise StateError)."""
        self._core.close()

    def stats(self) -> Dict[str, Any]:
        """Steps, rounds, bytes and times so far, as a dict."""
        return self._core.stats()

    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def world_size(self) -> int:
        return self._core.world_size

    @property
    def steps_in_round(self) -> int:
        return self._core.steps_in_round

    @property
    def policies(self) -> str:
        """The compiled policy set in use (outer, compressor, schedule), as the checkpoint names them."""
        return self._core.policies

    def global_parameters(self) -> List[Any]:
        """theta_global, one read-only view per parameter tensor with its shape
        (torch tensors for torch parameters, NumPy arrays otherwise). The views
        follow theta_global as rounds are applied; copy them to keep a value.
        Call ``finish()`` first under an overlapping schedule."""
        whole = self._core.global_flat(self._framework)
        out = []
        for k, shape in enumerate(self._shapes):
            n = 1
            for d in shape:
                n *= int(d)
            start = self._core.global_offset(k)
            out.append(whole[start:start + n].reshape(shape))
        return out

    def state_dict(self) -> Dict[str, Any]:
        """The library's checkpoint of this worker (collective): theta_global,
        the outer optimizer's state, residuals, the schedule's clock and the
        replica. Your optimizer's state is yours to save beside it."""
        return {"format": "diloco-checkpoint", "version": __version__, "checkpoint": self._core.save()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores ``state_dict()`` of the same rank (collective); the replica's
        tensors are written. A corrupt or mismatched checkpoint raises
        FormatError with the state unchanged."""
        if isinstance(state, (bytes, bytearray)):
            data = bytes(state)
        else:
            if not isinstance(state, dict) or "checkpoint" not in state:
                raise ValueError("diloco: load_state_dict takes what state_dict() returned "
                                 "(a dict with 'checkpoint' bytes)")
            data = state["checkpoint"]
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("diloco: the 'checkpoint' entry must be bytes")
        self._core.load(bytes(data))
