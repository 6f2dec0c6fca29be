"""The sandbox contract: what you can do in a sandbox, the same for every backend.

``AsyncSandbox`` is the one abstract class every backend's client (``runtime/``) subclasses;
each method's docstring is its contract, errors included. What does not depend on how a
backend reaches its sandbox lives here once: file upload and the atomic download (both
over the streaming file primitives), ``write_file``, ``exists``, the context manager and
the repr. The sync ``Sandbox`` (``sync.py``) wraps any of them.

Errors every method may raise: ``SandboxClosed`` after ``close()``; ``GuestDied`` when the
sandbox's guest crashed (``reset()`` recovers); ``SandboxLost`` when the backend holding
it is gone (a service, a Ray node); ``SandboxError`` for anything else typed.
"""

from __future__ import annotations

import abc
import asyncio
import io
import os
import tarfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterable, AsyncIterator, Sequence

from .errors import SandboxClosed, SpecError, TerminalError
from .factory import open_backend
from .spec import CommandResult, SandboxSpec, Snapshot

if TYPE_CHECKING:
    from .terminal import AsyncTerminal

CHUNK = 4 << 20  # file transfers move in chunks of this size: bounded memory either way


class AsyncSandbox(abc.ABC):
    """An isolated Linux sandbox driven with bash (async API; ``Sandbox`` is the sync twin).

    Create with ``await AsyncSandbox.create(spec)`` or ``async with open_async_sandbox(spec)``;
    ``spec.backend`` picks the class (``factory.py``). Commands run in named, persistent bash
    sessions (``session=None``: "default"), where cwd and exported variables survive between
    calls. Relative paths in file operations are relative to ``spec.workdir``. ``close()`` is
    idempotent; after it every call raises ``SandboxClosed``.

    ``id`` is the sandbox's id (every error about it carries it) and ``spec`` the
    ``SandboxSpec`` it was created with.
    """

    spec: SandboxSpec
    id: str

    def __init__(self, spec: SandboxSpec, sandbox_id: str):
        self.spec, self.id = spec, sandbox_id
        self._closed = False

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def create(cls, spec: SandboxSpec | None = None, *, snapshot: Any = None) -> "AsyncSandbox":
        """A new sandbox of ``spec`` (default ``SandboxSpec()``) on ``spec.backend``, started
        from ``snapshot`` (a ``Snapshot``, a ``sha256:`` digest, a tarball path, or a
        registered ref such as ``hub:<name>@<version>#<snapshot>``) if given.

        Raises ``SpecError`` for a bad spec, ``IsolationUnavailable`` where the backend cannot
        run here, ``SandboxStartError`` if it does not start, ``SnapshotError`` for a snapshot
        of another image or one that cannot be found. A cancelled create leaks nothing."""
        return await open_backend(spec or SandboxSpec(), snapshot)

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """True while open and, as far as this client knows, its guest runs (no I/O)."""

    @abc.abstractmethod
    async def ping(self) -> bool:
        """Health check: True if the sandbox answers; never raises."""

    @abc.abstractmethod
    async def reset(self) -> None:
        """Back to the image: files, sessions and processes all fresh (also after a crash)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Tear the sandbox down, leaving nothing behind. Idempotent; never raises for a
        sandbox already gone."""

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _ensure_open(self) -> None:
        if self._closed:
            raise SandboxClosed("sandbox is closed", sandbox_id=self.id)

    def usage(self) -> dict[str, float] | None:
        """``{"cpu_seconds", "memory_bytes"}`` used so far, where the backend can read it
        cheaply on this host (blocking file reads: call it off the event loop); else None."""
        return None

    def network_stats(self) -> dict | None:
        """A sandbox with ``network=True``: ``{"bytes_in", "bytes_out", "bytes_spliced" (of
        both, those forwarded in the kernel), "connections", "dns_queries", "denied": {reason:
        count}}`` since it was created (``denied`` reasons:
        ``egress.py``, ``deployment/gateway.py``, ``deployment/network.py``). None without a
        network, or where the backend does not count. ``"log"``: the audit log's ``records``
        and ``bytes`` kept, its ``max_bytes`` and how many of the oldest were ``dropped``."""
        return None

    async def egress_log(self, since: int | None = None) -> list[dict]:
        """The egress audit log of a sandbox with ``network=True``: one record per HTTP
        request, TLS or other connection, DNS query and refused attempt, written by its
        gateway outside the sandbox (fields: ``deployment/egresslog.py``), oldest first;
        ``since``: only those whose ``seq`` is above it. Bounded: the oldest are dropped
        past ``network_stats()["log"]["max_bytes"]``, counted there. [] without a network."""
        return []

    async def expose(self, port: int) -> tuple[str, int]:
        """Make the sandbox's TCP ``port`` reachable from the host: returns
        ``("127.0.0.1", host_port)``. Until then nothing outside the sandbox can open a
        connection to it. Needs ``network=True``."""
        from .errors import SandboxError

        raise SandboxError(f"expose() is not supported by the {self.spec.backend} backend", sandbox_id=self.id)

    # ----------------------------------------------------------------- commands
    @abc.abstractmethod
    async def run(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                  env: dict[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        """Run ``cmd`` with bash in a session; stdout and stderr come back separately.

        A timeout (default ``spec.timeout_s``) kills the command's process group
        (``timed_out=True``), not the session. With ``env`` or ``cwd`` the command runs in a
        throwaway subshell, so its own ``cd``/``export`` do not persist. A memory-limit kill
        is ``exit_code=137, oom_killed=True``. Raises ``SpecError`` for non-identifier env
        names, ``SessionError`` for a broken session."""

    @abc.abstractmethod
    def run_stream(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                   env: dict[str, str] | None = None, cwd: str | None = None
                   ) -> AsyncIterator[tuple[str, str] | CommandResult]:
        """Like ``run``, as an async iterator: yields ``("stdout" | "stderr", text)`` chunks
        while the command runs, then the final ``CommandResult`` as its last item."""

    async def open_terminal(self, cmd: str | Sequence[str] | None = None, *, rows: int = 24, cols: int = 80,
                            env: dict[str, str] | None = None, cwd: str | None = None,
                            idle_timeout: float | None = 600.0) -> "AsyncTerminal":
        """Start ``cmd`` (an argv list, or a string run by ``bash -c``; default: an
        interactive ``bash``) on a pseudo-terminal of ``rows`` x ``cols`` in the sandbox,
        with ``TERM=xterm-256color``, in ``cwd`` (default ``spec.workdir``): an
        ``AsyncTerminal`` (``terminal.py``) to type into, read, ``expect``, resize, signal
        and close. It runs like any sandbox process (same namespaces, cgroup, syscall
        filter) and ends with the sandbox; one nobody touches for ``idle_timeout`` seconds
        is closed (None: never). Raises ``TerminalError`` past the sandbox's limit of
        terminals (``MAX_TERMINALS``), ``SpecError`` for a bad size or env name."""
        raise TerminalError(f"{type(self).__name__} has no terminals", sandbox_id=self.id)

    @abc.abstractmethod
    async def sessions(self) -> list[str]:
        """The names of the open sessions."""

    @abc.abstractmethod
    async def close_session(self, name: str) -> None:
        """Close a session (its shell and what runs in it); unknown names are ignored."""

    # ----------------------------------------------------------------- files
    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """The whole content of a file, always as ``bytes`` (also when ``write_file`` was given
        a ``str``: ``.decode()`` it). Raises ``SandboxFileNotFound`` (a ``SandboxFileError``
        and a ``FileNotFoundError``) if it is missing, ``SandboxFileError`` if it is
        unreadable, ``StorageLimitError`` if it is larger than ``max_layer_bytes``
        (``StorageLimits``)."""

    @abc.abstractmethod
    async def stat(self, path: str) -> str | None:
        """What is at ``path``: ``"file"``, ``"dir"`` or ``"other"``; None if nothing."""

    @abc.abstractmethod
    async def read_stream(self, path: str) -> tuple[str, AsyncIterator[bytes]]:
        """``("file", chunks)`` of a file or ``("dir", chunks of a tar of it)``, in bounded
        memory. A missing or unreadable path raises ``SandboxFileError`` here, before any
        chunk, so a caller can still answer with an error instead of a cut stream."""

    @abc.abstractmethod
    async def write_stream(self, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644,
                           tar: bool = False) -> int:
        """Write ``chunks`` into a file (created or truncated, parents made) as they come,
        in bounded memory; with ``tar``, the chunks are a tar unpacked into directory
        ``path``. Returns the bytes received. Raises ``SandboxFileError``."""

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write ``data`` to a file (created with ``mode``, parents made), replacing it. A
        ``str`` is written as UTF-8; ``read_file`` gives ``bytes`` back either way. Raises
        ``SandboxFileError``."""
        data = data.encode() if isinstance(data, str) else bytes(data)
        await self.write_stream(path, once(data), mode=mode)

    async def exists(self, path: str) -> bool:
        """True if anything is at ``path``."""
        return await self.stat(path) is not None

    async def upload(self, local: str | os.PathLike, remote: str) -> None:
        """Copy a local file (streamed, keeping its permission bits) or directory (as a tar)
        to ``remote`` in the sandbox, replacing what is there. Raises ``SandboxFileError``;
        ``FileNotFoundError`` if ``local`` does not exist."""
        self._ensure_open()
        local = Path(local)
        if local.is_dir():
            data = await asyncio.to_thread(tar_dir, local)
            await self.write_stream(remote, once(data), tar=True)
            return
        await self.write_stream(remote, file_chunks(local), mode=local.stat().st_mode & 0o777)

    async def download(self, remote: str, local: str | os.PathLike) -> None:
        """Copy a sandbox file or directory to the host. A file lands whole or not at all
        (a temp file renamed); a directory arrives as a tar unpacked with the safe layer
        rules: links inside it are never followed. Raises ``SandboxFileError``; past
        ``max_layer_bytes`` or the free-space reserve (``StorageLimits``),
        ``StorageLimitError`` with nothing left behind."""
        from .storage.layers import unpack_plain_tar  # noqa: PLC0415 - zstandard, only for folders
        from .storage.limits import StorageLimits  # noqa: PLC0415

        self._ensure_open()
        local = Path(local)
        limits = StorageLimits.from_env()
        kind, chunks = await self.read_stream(remote)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:6]}.part")
        try:
            with open(tmp, "w+b") as f:
                meter = limits.meter(local.parent, what=f"download of {remote}")
                async for chunk in chunks:
                    meter.charge(len(chunk))
                    f.write(chunk)
                if kind == "dir":
                    f.seek(0)
                    meter = limits.meter(local.parent, what=f"download of {remote}")
                    await asyncio.to_thread(unpack_plain_tar, f, local, meter=meter)
                    return
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    # ----------------------------------------------------------------- snapshots
    @abc.abstractmethod
    async def snapshot(self) -> Snapshot:
        """Save files and session state (cwd, exported variables) as a content-addressed
        layer on top of the current chain, and return it; the sandbox runs on, unchanged
        (processes are not saved). The same state twice gives the same digest. Raises
        ``SnapshotError``; ``StorageFullError`` below the free-space reserve."""

    @abc.abstractmethod
    async def restore(self, snapshot: Snapshot | str | Path) -> None:
        """Return this sandbox, in place, to a snapshot's files and sessions (a ``Snapshot``,
        a ``sha256:`` digest, a tarball path or a registered ref); running processes end.
        Raises ``SnapshotError`` naming the snapshot when it cannot be found (or is not
        written in one of those forms) or was taken on another image."""

    @abc.abstractmethod
    async def fork(self, n: int = 1) -> list["AsyncSandbox"]:
        """``n`` new sandboxes that start from this one's CURRENT state (its files and
        sessions as they are at this call, through a fresh snapshot; not from any snapshot
        taken earlier), sharing it copy-on-write; each child, and this sandbox, then goes
        on independently. Close the children yourself (they are not closed with this one).
        Raises ``SpecError`` unless ``n`` is a positive integer; on failure none is left open."""

    def _describe(self) -> str:
        """What the repr shows after the id and image (a backend adds where it runs)."""
        return "closed" if self._closed else "alive" if self.alive else "dead"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} image={self.spec.image!r} {self._describe()}>"


def terminal_request(cmd: str | Sequence[str] | None, rows: int, cols: int, env: dict[str, str] | None,
                     cwd: str | None, idle_timeout: float | None) -> dict[str, Any]:
    """``open_terminal``'s arguments checked, as the guest's ``pty_open`` takes them (and
    the service's terminal route: one check for every backend)."""
    for name, value in (("rows", rows), ("cols", cols)):
        if not isinstance(value, int) or not 1 <= value <= 1000:
            raise SpecError(name, "must be an integer from 1 to 1000")
    if env and not all(isinstance(k, str) and k.isidentifier() for k in env):
        raise SpecError("env", "variable names must be identifiers")
    if idle_timeout is not None and not idle_timeout > 0:
        raise SpecError("idle_timeout", "must be positive (or None: never)")
    argv = None if cmd is None or isinstance(cmd, str) else [str(a) for a in cmd]
    if argv is not None and not argv or cmd == "":
        raise SpecError("cmd", "an empty command")
    return {"argv": argv, "command": cmd if isinstance(cmd, str) else None, "rows": rows, "cols": cols, "env": dict(env or {}), "cwd": cwd,
            "idle_timeout": idle_timeout}


def tar_dir(path: Path) -> bytes:
    """A directory as an uncompressed tar of ``.`` and ``./...`` (what ``unpack_plain_tar``
    and the guest's ``tar_in`` take)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        tar.add(path, arcname=".")
    return buf.getvalue()


async def file_chunks(path: Path) -> AsyncIterator[bytes]:
    """A file, ``CHUNK`` bytes at a time, read off the event loop."""
    with open(path, "rb") as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk


async def once(data: bytes) -> AsyncIterator[bytes]:
    yield data


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
