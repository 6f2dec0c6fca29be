"""rockroll.sandbox: isolated, disposable Linux sandboxes driven with bash.

    from rockroll.sandbox import SandboxSpec, open_sandbox
    with open_sandbox(SandboxSpec()) as sb:
        print(sb.run("echo hi").stdout)
"""

from .client import AsyncSandbox, open_async_sandbox
from .errors import (AgentDied, CapacityError, IsolationUnavailable, SandboxClosed, SandboxError,
                     SandboxFileError, SandboxLost, SandboxNotFound, SandboxStartError, SessionError,
                     SnapshotError, SpecError, UnsafeArchiveError)
from .spec import CommandResult, SandboxSpec, Snapshot
from .sync import Sandbox, open_sandbox

__all__ = [
    "AgentDied", "AsyncSandbox", "CapacityError", "CommandResult", "IsolationUnavailable",
    "Sandbox", "SandboxClosed", "SandboxError", "SandboxFileError", "SandboxLost",
    "SandboxNotFound", "SandboxSpec", "SandboxStartError", "SessionError", "Snapshot",
    "SnapshotError", "SpecError", "UnsafeArchiveError", "open_async_sandbox", "open_sandbox",
]
