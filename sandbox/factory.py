"""The backend factory: the only place that maps ``spec.backend`` to classes.

Each backend names its runtime (the ``AsyncSandbox`` subclass that talks to the sandbox),
the deployment that places it where the runtime needs one, and its pool where the generic
``AsyncSandboxPool`` does not fit. Classes are named as ``module:Class`` and imported on
first use (as Gymnasium's registry does with entry points): a backend's optional extras
(docker, httpx, ray) load only when that backend is asked for, and no runtime imports
another. It imports nothing of the classes it names: ``base.py`` (the contract) builds on
it, not the other way round.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from .errors import IsolationUnavailable
from .spec import SandboxSpec


@dataclass(frozen=True)
class Backend:
    runtime: str                   # "module:Class" of its AsyncSandbox subclass
    deployment: str | None = None  # where the runtime's guest runs, for runtimes that take one
    pool: str | None = None        # its pool class, when not the generic AsyncSandboxPool
    reap: str | None = None        # "module:function" that removes what a dead run left
                                   # (``reap(runs, keep=run_id)``), called by ``deployment/reaper.py``


_GUEST = ".runtime.guest:GuestSandbox"
BACKEND_CLASSES: dict[str, Backend] = {  # keys: spec.BACKENDS
    "local": Backend(_GUEST, deployment=".deployment.local:LocalDeployment"),
    "docker": Backend(_GUEST, deployment=".deployment.docker:DockerDeployment",
                      reap=".deployment.docker:reap_containers"),
    "remote": Backend(".runtime.remote:RemoteSandbox"),
    "ray": Backend(".runtime.ray:RaySandbox", pool=".runtime.ray_pool:AsyncRaySandboxPool"),
}


def _load(ref: str) -> type:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module, __package__), name)


def backend(name: str) -> Backend:
    try:
        return BACKEND_CLASSES[name]
    except KeyError:
        raise IsolationUnavailable(f"backend {name!r} is not available in this build") from None


async def open_backend(spec: SandboxSpec, snapshot: Any = None) -> Any:
    """A new sandbox of ``spec`` on its backend, an ``AsyncSandbox`` (the contract is
    ``AsyncSandbox.create``; this table sits below the contract and names its classes only
    as strings, so it imports none of them)."""
    entry = backend(spec.backend)
    options = {"deployment": _load(entry.deployment)} if entry.deployment else {}
    return await _load(entry.runtime).open(spec, snapshot=snapshot, **options)


def pool_class(spec: SandboxSpec) -> type | None:
    """The backend's own pool class, or None where the generic ``AsyncSandboxPool`` serves."""
    ref = backend(spec.backend).pool
    return _load(ref) if ref else None


def reap_hooks() -> list[Callable[..., None]]:
    """Every backend's reap hook (``Backend.reap``), imported now: a gc reaps a dead run's
    docker containers even if this process never opened one. A hook whose import fails (an
    optional extra missing) is left out: what it would reap, no run of this install made."""
    hooks = []
    for entry in BACKEND_CLASSES.values():
        if entry.reap:
            try:
                hooks.append(_load(entry.reap))
            except ImportError:
                continue
    return hooks
