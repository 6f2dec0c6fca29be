"""rockroll.sandbox: isolated, disposable Linux sandboxes driven with bash.

    from rockroll.sandbox import SandboxSpec, open_sandbox
    with open_sandbox(SandboxSpec()) as sb:
        print(sb.run("echo hi").stdout)

Layout: ``base.py`` is the contract every backend implements, ``factory.py`` maps a
backend name to its classes; ``runtime/`` holds the clients that talk to one sandbox,
``deployment/`` where sandboxes run (local namespaces, docker, Ray hosts, crash reaping),
``server/`` the HTTP service and ``storage/`` layers and snapshots.
"""

from .base import AsyncSandbox
from .errors import (AgentDied, CapacityError, IsolationUnavailable, SandboxClosed, SandboxError,
                     SandboxFileError, SandboxFileNotFound, SandboxLost, SandboxNotFound, SandboxStartError,
                     ServiceUnreachable, SessionError, SnapshotError, SpecError, StorageFullError,
                     StorageLimitError, UnsafeArchiveError)
from .factory import open_async_sandbox
from .spec import CommandResult, SandboxSpec, Snapshot
from .sync import Sandbox, open_sandbox


def configure(url: str | None = None, token: str | None = None) -> None:
    """Point ``backend="remote"`` sandboxes at a ``rockroll serve`` service (url and bearer
    token); overrides ``ROCKROLL_URL`` / ``ROCKROLL_TOKEN``. Needs the ``service`` extra."""
    from .runtime.remote import configure as configure_remote  # httpx: the service extra

    configure_remote(url, token)


__all__ = [
    "AgentDied", "AsyncSandbox", "CapacityError", "CommandResult", "IsolationUnavailable",
    "Sandbox", "SandboxClosed", "SandboxError", "SandboxFileError", "SandboxFileNotFound", "SandboxLost",
    "SandboxNotFound", "SandboxSpec", "SandboxStartError", "ServiceUnreachable", "SessionError", "Snapshot",
    "SnapshotError", "SpecError", "StorageFullError", "StorageLimitError", "UnsafeArchiveError",
    "configure", "open_async_sandbox", "open_sandbox",
]
