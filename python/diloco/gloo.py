# SPDX-License-Identifier: Apache-2.0
"""Gloo (TCP) communicators: one process per worker, on one machine or many.

``from_env()`` reads the variables torchrun and diloco's launcher set:
RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun's names; the
launcher's DILOCO_RANK / DILOCO_WORLD_SIZE / DILOCO_LOCAL_WORLD_SIZE when
those are unset) and DILOCO_STORE, the meeting point of the processes
(``file:///shared/dir`` or ``redis://host:port``), with the optional
DILOCO_RUN_ID, DILOCO_HOSTNAME, DILOCO_IFACE and DILOCO_TIMEOUT_MS.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from . import _core

__all__ = ["available", "connect", "from_env"]


def available() -> bool:
    """Whether this build of diloco._core has Gloo."""
    return bool(_core.has_gloo)


def connect(rank: int, world_size: int, store: str, *, run_id: str = "diloco", hostname: str = "127.0.0.1",
            iface: str = "", timeout: float = 30.0, local_world_size: int = 0, local_rank: int = 0) -> "_core.Comm":
    """Joins a Gloo group of ``world_size`` processes (collective: every
    process calls it with the same store, run id and size). ``timeout`` (s)
    bounds every wait; a peer that does not come raises CommError."""
    if not available():
        raise RuntimeError("diloco: this build of diloco._core has no Gloo (libgloo was not found when it was built)")
    return _core.gloo(rank=int(rank), size=int(world_size), store=str(store), run_id=str(run_id),
                      hostname=str(hostname), iface=str(iface), timeout=float(timeout),
                      local_world_size=int(local_world_size), local_rank=int(local_rank))


def _integer(env: Mapping[str, str], names, meaning: str, default: Optional[int] = None) -> int:
    for name in names:
        value = env.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"diloco.gloo.from_env: {name} is {value!r}; expected an integer ({meaning})") \
                    from None
    if default is not None:
        return default
    raise ValueError(f"diloco.gloo.from_env: {' or '.join(names)} is not set; it must hold {meaning} "
                     f"(torchrun and diloco's launcher set it)")


def from_env(env: Optional[Mapping[str, str]] = None) -> "_core.Comm":
    """Joins the group the environment describes (see the module's doc)."""
    env = os.environ if env is None else env
    world = _integer(env, ("WORLD_SIZE", "DILOCO_WORLD_SIZE"), "the number of processes")
    rank = _integer(env, ("RANK", "DILOCO_RANK"), "this process's rank")
    local_rank = _integer(env, ("LOCAL_RANK",), "this process's rank on its host", 0)
    local_world = _integer(env, ("LOCAL_WORLD_SIZE", "DILOCO_LOCAL_WORLD_SIZE"), "processes on this host", 0)
    store = env.get("DILOCO_STORE")
    if not store:
        raise ValueError("diloco.gloo.from_env: DILOCO_STORE is not set; it must hold file:///shared/dir or "
                         "redis://host:port (diloco's launcher sets it)")
    timeout = 30.0
    if env.get("DILOCO_TIMEOUT_MS"):
        timeout = _integer(env, ("DILOCO_TIMEOUT_MS",), "milliseconds") / 1000.0
    return connect(rank, world, store, run_id=env.get("DILOCO_RUN_ID") or "diloco",
                   hostname=env.get("DILOCO_HOSTNAME") or "127.0.0.1", iface=env.get("DILOCO_IFACE") or "",
                   timeout=timeout, local_world_size=local_world, local_rank=local_rank)
