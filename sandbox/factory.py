"""The backend factory: the only place that maps ``spec.backend`` to classes.

Each backend names its runtime (the ``AsyncSandbox`` subclass that talks to the sandbox),
the deployment that places it where the runtime needs one, and its pool where the generic
``AsyncSandboxPool`` does not fit. Classes are named as ``module:Class`` and imported on
first use (as Gymnasium's registry does with entry points): a backend's optional extras
(docker, httpx, ray) load only when that backend is asked for, and no runtime imports
another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import IsolationUnavailable
from .spec import SandboxSpec

if TYPE_CHECKING:
    from .base import AsyncSandbox


@dataclass(frozen=True)
class Backend:
    runtime: str                   # "module:Class" of its AsyncSandbox subclass
    deployment: str | None = None  # where the runtime's agent runs, for runtimes that take one
    pool: str | None = None        # its pool class, when not the generic AsyncSandboxPool


_AGENT = ".runtime.agent:AgentSandbox"
BACKEND_CLASSES: dict[str, Backend] = {  # keys: spec.BACKENDS
    "local": Backend(_AGENT, deployment=".deployment.local:LocalDeployment"),
    "docker": Backend(_AGENT, deployment=".deployment.docker:DockerDeployment"),
    "remote": Backend(".runtime.remote:RemoteSandbox"),
    "ray": Backend(".runtime.ray:RaySandbox", pool=".deployment.ray_pool:AsyncRaySandboxPool"),
}


def _load(ref: str) -> type:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module, __package__), name)


def backend(name: str) -> Backend:
    try:
        return BACKEND_CLASSES[name]
    except KeyError:
        raise IsolationUnavailable(f"backend {name!r} is not available in this build") from None


async def open_backend(spec: SandboxSpec, snapshot: Any = None) -> AsyncSandbox:
    """A new sandbox of ``spec`` on its backend (the contract is ``AsyncSandbox.create``)."""
    entry = backend(spec.backend)
    options = {"deployment": _load(entry.deployment)} if entry.deployment else {}
    return await _load(entry.runtime).open(spec, snapshot=snapshot, **options)


def pool_class(spec: SandboxSpec) -> type | None:
    """The backend's own pool class, or None where the generic ``AsyncSandboxPool`` serves."""
    ref = backend(spec.backend).pool
    return _load(ref) if ref else None


class open_async_sandbox:
    """``async with open_async_sandbox(spec) as sb:`` (or ``sb = await open_async_sandbox(spec)``).

    ``snapshot`` (a ``Snapshot``, a digest or a tarball path) starts it from a saved state."""

    def __init__(self, spec: SandboxSpec | None = None, *, snapshot: Any = None):
        self._args = (spec or SandboxSpec(), snapshot)
        self._sb: AsyncSandbox | None = None

    def __await__(self):
        return open_backend(*self._args).__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sb = await open_backend(*self._args)
        return self._sb

    async def __aexit__(self, *exc) -> None:
        if self._sb:
            await self._sb.close()
