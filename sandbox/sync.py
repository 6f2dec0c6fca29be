"""The sync twin of ``AsyncSandbox``: the same names, blocking calls, over any backend.

Each call runs the async method on one private event-loop thread shared by every sync
sandbox of the process, so there is a single implementation of the protocol and a sync
user pays only a thread hand-off per call.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

from .base import AsyncSandbox
from .lifecycle import install_exit_handlers
from .spec import CommandResult, SandboxSpec, Snapshot
from .terminal import AsyncTerminal, ExpectMatch

T = TypeVar("T")
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process's sandbox event loop, started on first use (a daemon thread)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=main, name="rockroll-sandbox-loop", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the background loop and wait for it; Ctrl-C cancels it."""
    loop = background_loop()
    try:
        if asyncio.get_running_loop() is loop:
            coro.close()
            raise RuntimeError("sync sandbox API called from its own event loop; use AsyncSandbox")
    except RuntimeError as e:
        if "sync sandbox API" in str(e):
            raise
    fut: Future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result()
    except BaseException:
        fut.cancel()
        raise


class Sandbox:
    """An isolated Linux sandbox driven with bash: the blocking twin of ``AsyncSandbox``,
    with the same methods, arguments, errors and contracts (each method's docstring is its
    async original's). Use as a context manager."""

    def __init__(self, inner: AsyncSandbox):
        self._inner = inner

    @classmethod
    def create(cls, spec: SandboxSpec | None = None, *, snapshot: Any = None) -> "Sandbox":
        install_exit_handlers()
        return cls(run_sync(AsyncSandbox.create(spec, snapshot=snapshot)))

    @property
    def id(self) -> str:
        """The sandbox's id; every error about it carries it."""
        return self._inner.id

    @property
    def spec(self) -> SandboxSpec:
        """The ``SandboxSpec`` the sandbox was created with."""
        return self._inner.spec

    @property
    def alive(self) -> bool:
        return self._inner.alive

    @property
    def aio(self) -> AsyncSandbox:
        """The async sandbox behind this one (bound to the background loop)."""
        return self._inner

    def run(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        return run_sync(self._inner.run(cmd, timeout=timeout, session=session, env=env, cwd=cwd))

    def run_stream(self, cmd: str, **kwargs):
        """Like ``AsyncSandbox.run_stream``: yields ``(stream, text)`` chunks, then the result."""
        agen = self._inner.run_stream(cmd, **kwargs)
        try:
            while True:
                try:
                    yield run_sync(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            run_sync(agen.aclose())

    def open_terminal(self, cmd=None, *, rows: int = 24, cols: int = 80, env: dict[str, str] | None = None,
                      cwd: str | None = None, idle_timeout: float | None = 600.0) -> "Terminal":
        return Terminal(run_sync(self._inner.open_terminal(cmd, rows=rows, cols=cols, env=env, cwd=cwd,
                                                           idle_timeout=idle_timeout)))

    def sessions(self) -> list[str]:
        return run_sync(self._inner.sessions())

    def close_session(self, name: str) -> None:
        run_sync(self._inner.close_session(name))

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        run_sync(self._inner.write_file(path, data, mode=mode))

    def read_file(self, path: str) -> bytes:
        return run_sync(self._inner.read_file(path))

    def exists(self, path: str) -> bool:
        return run_sync(self._inner.exists(path))

    def stat(self, path: str) -> str | None:
        return run_sync(self._inner.stat(path))

    def upload(self, local, remote: str) -> None:
        run_sync(self._inner.upload(local, remote))

    def download(self, remote: str, local) -> None:
        run_sync(self._inner.download(remote, local))

    def snapshot(self) -> Snapshot:
        return run_sync(self._inner.snapshot())

    def restore(self, snapshot) -> None:
        run_sync(self._inner.restore(snapshot))

    def fork(self, n: int = 1) -> list["Sandbox"]:
        return [Sandbox(s) for s in run_sync(self._inner.fork(n))]

    def reset(self) -> None:
        run_sync(self._inner.reset())

    def ping(self) -> bool:
        return run_sync(self._inner.ping())

    def network_stats(self) -> dict | None:
        return self._inner.network_stats()

    def egress_log(self, since: int | None = None) -> list[dict]:
        return run_sync(self._inner.egress_log(since))

    def expose(self, port: int) -> tuple[str, int]:
        return run_sync(self._inner.expose(port))

    def close(self) -> None:
        run_sync(self._inner.close())

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sandbox of {self._inner!r}>"


def _share_contracts(cls: type, async_cls: type = AsyncSandbox) -> type:
    """Give each public method and property of the sync twin that has no docstring of its
    own its ``async_cls`` original's: each contract is written once, in ``base.py`` (and
    ``terminal.py``), and ``help(sb.run)`` shows it."""
    for name, attr in list(vars(cls).items()):
        original = getattr(async_cls, name, None)
        if name.startswith("_") or original is None:
            continue
        if isinstance(attr, property) and not attr.__doc__:
            setattr(cls, name, property(attr.fget, doc=original.__doc__))
        elif isinstance(attr, classmethod) and not attr.__func__.__doc__:
            attr.__func__.__doc__ = original.__doc__
        elif callable(attr) and not attr.__doc__:
            attr.__doc__ = original.__doc__
    return cls


_share_contracts(Sandbox)


class Terminal:
    """The blocking twin of ``AsyncTerminal`` (``terminal.py``): the same methods and
    contracts. Use as a context manager."""

    def __init__(self, inner: AsyncTerminal):
        self._inner = inner

    @property
    def aio(self) -> AsyncTerminal:
        return self._inner

    @property
    def exit_code(self) -> int | None:
        return self._inner.exit_code

    @property
    def exited(self) -> bool:
        return self._inner.exited

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def write(self, data: str | bytes) -> None:
        run_sync(self._inner.write(data))

    def read(self, timeout: float | None = None) -> str:
        return run_sync(self._inner.read(timeout))

    def expect(self, patterns, timeout: float = 30.0) -> ExpectMatch:
        return run_sync(self._inner.expect(patterns, timeout))

    def wait(self, timeout: float | None = None) -> int | None:
        return run_sync(self._inner.wait(timeout))

    def resize(self, rows: int, cols: int) -> None:
        run_sync(self._inner.resize(rows, cols))

    def signal(self, sig: int = 2) -> None:
        run_sync(self._inner.signal(sig))

    def close(self) -> None:
        run_sync(self._inner.close())

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_share_contracts(Terminal, AsyncTerminal)


def open_sandbox(spec: SandboxSpec | None = None, *, snapshot: Any = None) -> Sandbox:
    """Create a sandbox (a context manager): ``with open_sandbox(SandboxSpec()) as sb: ...``.

    ``snapshot`` (a ``Snapshot``, a digest or a tarball path) starts it from a saved state.
    """
    return Sandbox.create(spec, snapshot=snapshot)
