"""rockroll.sandbox: isolated, disposable Linux sandboxes driven with bash.

    from rockroll.sandbox import SandboxSpec, open_sandbox
    with open_sandbox(SandboxSpec()) as sb:
        print(sb.run("echo hi").stdout)

Layout, lowest floor first (no module imports a higher floor, ``tests/test_imports.py``):
``errors.py``, ``lifecycle.py``, ``home.py`` and ``protocol/`` (the host <-> guest frames
and config, the HTTP wire models, the model token) are the ground floor; ``egress.py``; ``spec.py``;
``guest/`` is pid 1 of a sandbox (standard library only); ``storage/`` layers and
snapshots; ``factory.py`` maps a backend name to its classes; ``base.py`` is the contract
every backend implements; ``sync.py``, ``pool.py``; ``modelservice/``; ``deployment/``
where sandboxes run (local namespaces, docker, Ray hosts, crash reaping); ``runtime/`` the
clients that talk to one sandbox and ``server/`` the HTTP service.
"""

from .base import AsyncSandbox, open_async_sandbox
from .errors import (CapacityError, GuestDied, IsolationUnavailable, SandboxClosed, SandboxError,
                     SandboxFileError, SandboxFileNotFound, SandboxLost, SandboxNotFound, SandboxStartError,
                     ServiceUnreachable, SessionError, SnapshotError, SpecError, StorageFullError,
                     StorageLimitError, UnsafeArchiveError)
from .egress import EgressPolicy, HttpRule, SecretRef
from .spec import CommandResult, SandboxSpec, Snapshot
from .sync import Sandbox, open_sandbox


def configure(url: str | None = None, token: str | None = None) -> None:
    """Point ``backend="remote"`` sandboxes at a ``rockroll serve`` service (url and bearer
    token); overrides ``ROCKROLL_URL`` / ``ROCKROLL_TOKEN``. Needs the ``service`` extra."""
    from .runtime.remote import configure as configure_remote  # httpx: the service extra

    configure_remote(url, token)


__all__ = [
    "AsyncSandbox", "CapacityError", "CommandResult", "EgressPolicy", "GuestDied", "HttpRule", "IsolationUnavailable",
    "Sandbox", "SandboxClosed", "SandboxError", "SandboxFileError", "SandboxFileNotFound", "SandboxLost",
    "SandboxNotFound", "SandboxSpec", "SandboxStartError", "SecretRef", "ServiceUnreachable", "SessionError",
    "Snapshot",
    "SnapshotError", "SpecError", "StorageFullError", "StorageLimitError", "UnsafeArchiveError",
    "configure", "open_async_sandbox", "open_sandbox",
]
