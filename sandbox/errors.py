"""Typed errors of the sandbox engine.

Every error carries the id of the sandbox it concerns (``None`` when there is no
sandbox yet), so a trainer juggling hundreds of sandboxes knows which one failed.
The hierarchy mirrors httpx's: catch ``SandboxError`` for everything, or a subclass
for one kind of failure.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every sandbox failure."""

    def __init__(self, message: str, *, sandbox_id: str | None = None):
        super().__init__(message)
        self.sandbox_id = sandbox_id

    def __str__(self) -> str:
        msg = super().__str__()
        return f"[{self.sandbox_id}] {msg}" if self.sandbox_id else msg


class SpecError(SandboxError, ValueError):
    """A ``SandboxSpec`` field (or another argument) has a bad value; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class IsolationUnavailable(SandboxError):
    """The host cannot give the isolation a backend needs (namespaces, overlayfs, a daemon).

    Raised instead of ever running a command without isolation.
    """


class SandboxStartError(SandboxError):
    """The sandbox could not be created or (re)started."""


class SandboxClosed(SandboxError):
    """An operation was attempted on a closed sandbox."""


class SandboxNotFound(SandboxError):
    """No sandbox with that id exists (or it was reaped)."""


class GuestDied(SandboxError):
    """The sandbox's guest (its pid 1) crashed or was killed; ``reset()`` brings the sandbox back."""


class SandboxLost(GuestDied):
    """The sandbox's host (a node, a container, a server) is gone."""


class ServiceUnreachable(SandboxLost):
    """No connection to the ``rockroll serve`` service could be made (nothing was sent): it
    is not running, or the SDK points elsewhere. The message names the URL, where it came
    from and how to set it (``ROCKROLL_URL``, ``configure()``). A ``SandboxLost``, so code
    that handles a lost sandbox's host handles this too."""


class SessionError(SandboxError):
    """A session cannot be created or used."""


class TerminalError(SandboxError):
    """A terminal cannot be opened (the sandbox's limit of terminals, no pty device) or used
    (it exited or was closed: closed for idleness too)."""


class ExpectTimeout(TerminalError, TimeoutError):
    """``expect`` saw none of its patterns in time; ``before`` holds the output it searched."""

    def __init__(self, message: str, before: str = "", *, sandbox_id: str | None = None):
        super().__init__(message, sandbox_id=sandbox_id)
        self.before = before


class SandboxFileError(SandboxError, OSError):
    """A file operation inside the sandbox failed (missing file, not a directory, ...)."""


class SandboxFileNotFound(SandboxFileError, FileNotFoundError):
    """The path does not exist in the sandbox (the service answers 404). Also a
    ``FileNotFoundError``, as a missing file is in Python."""


class SnapshotError(SandboxError):
    """A snapshot cannot be taken, found or restored."""


class UnsafeArchiveError(SnapshotError):
    """An archive member would escape its root or create something forbidden.

    ``member`` is the offending member name and ``reason`` says what is wrong with it.
    """

    def __init__(self, member: str, reason: str, *, sandbox_id: str | None = None):
        super().__init__(f"unsafe archive member {member!r}: {reason}", sandbox_id=sandbox_id)
        self.member = member
        self.reason = reason


class StorageLimitError(SnapshotError):
    """Storing or unpacking would pass a storage limit; ``limit`` names it (the setting an
    operator raises: ``max_layer_bytes``, ``max_chain_bytes``, ...) and ``value`` is its bytes.
    What was partly written has been removed."""

    def __init__(self, limit: str, value: int, message: str, *, sandbox_id: str | None = None):
        super().__init__(f"{message} (limit {limit}={value})", sandbox_id=sandbox_id)
        self.limit = limit
        self.value = value


class StorageFullError(StorageLimitError):
    """The space to store into is used up: the host's free-space reserve (``min_free_bytes``)
    or the caller's storage quota (``token_storage_quota``)."""


class CapacityError(SandboxError):
    """No capacity left (pool or service full); retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0, sandbox_id: str | None = None):
        super().__init__(message, sandbox_id=sandbox_id)
        self.retry_after = retry_after
