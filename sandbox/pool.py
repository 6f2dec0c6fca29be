"""Warm pools: sandboxes created ahead of time, handed out in microseconds.

A pool owns ``size`` sandboxes, the way a connection pool does: ``acquire()`` hands out an
idle one, ``release()`` resets it back to its image (a remount, not a rebuild) and returns
it to the pool in the background, so the next ``acquire()`` reuses it instead of paying for
a create. A background task tops the pool up to ``size`` (idle + in use), checks the idle
ones' health every ``health_interval_s`` and replaces dead ones. Beyond ``size`` users at
once, ``acquire()`` creates on demand and ``release()`` closes the surplus.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
from typing import Any

from .base import AsyncSandbox
from .lifecycle import install_exit_handlers
from .protocol.tokens import admin_token, current_token
from .errors import SandboxError, SpecError
from .factory import pool_class
from .spec import SandboxSpec
from .sync import Sandbox, background_loop, run_sync


class AsyncPool(abc.ABC):
    """The warm-pool contract every pool class keeps (``AsyncSandboxPool``, and a backend's
    own, such as Ray's): ``acquire()`` never fails for lack of warm sandboxes,
    ``release(sb)`` hands one back, ``close()`` closes every sandbox the pool owns.
    ``async with`` starts the pool (filled) and closes it."""

    _task: asyncio.Task | None = None  # the background task that keeps the pool warm

    @abc.abstractmethod
    async def start(self, *, wait: bool = True) -> "AsyncPool":
        """Start keeping the pool warm; with ``wait``, return once it is filled."""

    @abc.abstractmethod
    async def acquire(self) -> AsyncSandbox:
        """A ready sandbox (made on demand where none is warm). ``SandboxError`` once closed."""

    @abc.abstractmethod
    async def release(self, sb: AsyncSandbox) -> None:
        """Give a sandbox back: reset into the pool in the background, or closed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close every sandbox of the pool and stop keeping it warm."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once ``close()`` was called."""

    async def __aenter__(self) -> "AsyncPool":
        if self._task is None:
            await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AsyncSandboxPool(AsyncPool):
    """A pool of ready sandboxes of one spec.

    ``acquire()`` returns an idle sandbox (creating one if none is ready, so it never
    fails for lack of warm ones); ``release(sb)`` resets it and puts it back for the next
    ``acquire()``, or closes it if the pool already owns ``size`` or is closed. ``close()``
    closes every sandbox it owns.

    With ``snapshot``, sandboxes start from that snapshot and are restored to it on release
    instead of reset to the image: an episode that begins at a saved state (a task's buggy
    repository, a branch point) then costs an acquire, not a restore.
    """

    def __new__(cls, spec: SandboxSpec | None = None, *args, **kwargs):
        own = pool_class(spec) if spec is not None else None
        if own is not None:  # a backend with its own pool (ray: spread over the cluster)
            return own(spec, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, spec: SandboxSpec | None = None, size: int = 4, *, health_interval_s: float = 5.0,
                 snapshot: Any = None):
        if not isinstance(size, int) or size < 0:
            raise SpecError("size", "must be a non-negative integer")
        self.spec, self.size, self.health_interval_s = spec or SandboxSpec(), size, health_interval_s
        self.snapshot = snapshot
        # the model service's admin token as of now (model_channel.py): sandboxes the pool
        # creates later, from its own tasks or another caller's acquire, use the same one
        self._model_token = current_token() if self.spec.model_endpoint else None
        self._idle: collections.deque[AsyncSandbox] = collections.deque()
        self._busy: set[AsyncSandbox] = set()
        self._creating = 0
        self._closed = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._resets: set[asyncio.Task] = set()
        self.replaced = 0  # dead sandboxes found and replaced, for metrics and tests

    async def start(self, *, wait: bool = True) -> "AsyncSandboxPool":
        """Start the refill task; with ``wait``, return once ``size`` sandboxes are ready."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._maintain())
        if wait:
            await self._fill()
        return self

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def closed(self) -> bool:
        return self._closed

    def resize(self, size: int) -> None:
        """Own ``size`` sandboxes from now on: the refill task tops the pool up; a surplus
        drains as sandboxes are released."""
        self.size = size
        self._kick()

    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def warming(self) -> int:
        """Sandboxes being created or reset: soon idle, already the pool's."""
        return self._creating

    async def acquire(self) -> AsyncSandbox:
        if self._closed:
            raise SandboxError("pool is closed")
        while self._idle:
            sb = self._idle.popleft()
            self._kick()
            if sb.alive:
                self._busy.add(sb)
                return sb
            await self._discard(sb)
        sb = await self._create()
        self._busy.add(sb)
        self._kick()
        return sb

    async def release(self, sb: AsyncSandbox) -> None:
        """Give a sandbox back: it is reset in the background and rejoins the pool."""
        self._busy.discard(sb)
        if self._closed or self._owned() >= self.size:
            await sb.close()
            return
        task = asyncio.create_task(self._recycle(sb))
        self._resets.add(task)
        task.add_done_callback(self._resets.discard)

    async def _recycle(self, sb: AsyncSandbox) -> None:
        self._creating += 1
        try:
            await (sb.restore(self.snapshot) if self.snapshot is not None else sb.reset())
            if self._closed:
                await sb.close()
            else:
                self._idle.append(sb)
        except SandboxError:
            self.replaced += 1
            await self._discard(sb)
            self._kick()
        except RuntimeError:
            pass  # the interpreter is shutting down: executors refuse new work, the exit reaper closes sb
        finally:
            self._creating -= 1

    async def _create(self) -> AsyncSandbox:
        with admin_token(self._model_token):
            return await AsyncSandbox.create(self.spec, snapshot=self.snapshot)

    def _owned(self) -> int:
        """Sandboxes the pool holds: idle, being created or reset, and handed out."""
        return len(self._idle) + self._creating + len(self._busy)

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _fill(self) -> None:
        missing = self.size - self._owned()
        if missing <= 0 or self._closed:
            return
        self._creating += missing
        try:
            results = await asyncio.gather(*(self._create() for _ in range(missing)),
                                           return_exceptions=True)
        finally:
            self._creating -= missing
        for r in results:
            if isinstance(r, AsyncSandbox):
                if self._closed:
                    await r.close()
                else:
                    self._idle.append(r)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and not any(isinstance(r, AsyncSandbox) for r in results):
            raise errors[0]

    async def _health_check(self) -> None:
        for sb in list(self._idle):
            if not await sb.ping():
                with contextlib.suppress(ValueError):
                    self._idle.remove(sb)
                self.replaced += 1
                await self._discard(sb)

    async def _maintain(self) -> None:
        while not self._closed:
            try:
                try:
                    await asyncio.wait_for(self._wake.wait(), self.health_interval_s)
                except asyncio.TimeoutError:
                    await self._health_check()
                self._wake.clear()
                await self._fill()
            except SandboxError:
                await asyncio.sleep(1.0)  # cannot create right now: retry, don't spin
            except RuntimeError:
                return  # the interpreter is shutting down: executors refuse new work

    async def _discard(self, sb: AsyncSandbox) -> None:
        # RuntimeError: the interpreter is shutting down (a recycle that failed at exit): the
        # executors refuse new work and the exit reaper closes sb; a task must not raise it
        with contextlib.suppress(SandboxError, RuntimeError):
            await sb.close()

    async def close(self) -> None:
        self._closed = True
        if self._task:
            # Woken, not cancelled: the fill under way finishes and closes what it made, so
            # nothing of this pool is still being built when close() returns.
            self._kick()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._task
        for task in list(self._resets):
            with contextlib.suppress(Exception):
                await task
        sandboxes = list(self._idle) + list(self._busy)
        self._idle.clear()
        self._busy.clear()
        await asyncio.gather(*(sb.close() for sb in sandboxes), return_exceptions=True)


class SandboxPool:
    """Sync twin of ``AsyncSandboxPool``: ``with SandboxPool(spec, size=8) as pool:``."""

    def __init__(self, spec: SandboxSpec | None = None, size: int = 4, *, health_interval_s: float = 5.0,
                 wait: bool = True, snapshot: Any = None):
        install_exit_handlers()
        self._inner = AsyncSandboxPool(spec, size, health_interval_s=health_interval_s, snapshot=snapshot)
        self._wrappers: dict[int, Sandbox] = {}
        background_loop()
        run_sync(self._inner.start(wait=wait))

    @property
    def aio(self) -> AsyncSandboxPool:
        return self._inner

    @property
    def idle(self) -> int:
        return self._inner.idle

    @property
    def busy(self) -> int:
        return self._inner.busy

    @property
    def replaced(self) -> int:
        return self._inner.replaced

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def acquire(self) -> Sandbox:
        inner = run_sync(self._inner.acquire())
        return self._wrappers.setdefault(id(inner), Sandbox(inner))

    def release(self, sb: Sandbox) -> None:
        self._wrappers.pop(id(sb.aio), None)
        run_sync(self._inner.release(sb.aio))

    def close(self) -> None:
        run_sync(self._inner.close())

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
