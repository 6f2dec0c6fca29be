"""The sandboxes a ``rockroll serve`` service holds: capacity, idle reaping, bookkeeping.

The service owns its sandboxes (``SandboxFleet``): creation is capped (429 + Retry-After),
an idle reaper closes sandboxes unused for ``spec.ttl_s`` (else ``idle_ttl``), shutdown
closes all of them, and start-up reaps what a previous, killed server left behind.
Creates of a pooled spec are served by its warm pool (``warm.py``); a pooled sandbox
given back (closed by its client or the reaper) returns to its pool.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import AsyncIterator

from ..base import AsyncSandbox
from ..deployment.reaper import current_run, reap_dead_runs
from ..errors import CapacityError, SandboxClosed, SandboxError, SandboxNotFound
from ..protocol.wire import CommandOut, PoolIn, SandboxOut, StatsOut
from ..spec import CommandResult, SandboxSpec
from ..storage.snapshots import SnapshotStore
from ..terminal import AsyncTerminal
from .metrics import Metrics, service_families
from .warm import WarmPool, pool_key

log = logging.getLogger("rockroll.serve")
RECENT_COMMANDS = 20          # per sandbox, for the dashboard
TOMBSTONES = 10_000           # closed ids remembered, so late callers get SandboxClosed, not 404


class Entry:
    """The service's bookkeeping for one sandbox: activity, in-flight calls, recent commands."""

    def __init__(self, sb: AsyncSandbox, sandbox_id: str | None = None, pool: WarmPool | None = None):
        self.sb, self.id, self.pool = sb, sandbox_id or sb.id, pool
        self.created = self.last_used = time.time()
        self.busy = 0
        self.commands_run = 0
        self.recent: collections.deque[CommandOut] = collections.deque(maxlen=RECENT_COMMANDS)
        self.closed = asyncio.Event()   # set on close: in-flight calls fail fast instead of hanging
        self.close_reason = "sandbox is closed"
        # Sessions opened by name through the ROCK / SWE-ReX routes (``compat.py``): theirs
        # must be created before use and fail if created twice; ours are made on first use.
        self.named_sessions: set[str] = set()
        self.exposed: dict[int, tuple[str, int]] = {}  # sandbox port -> its address on this host
        self.terminals: dict[str, AsyncTerminal] = {}  # their interactive commands' (compat.py)

    @property
    def state(self) -> str:
        return "alive" if self.sb.alive else "dead"

    def stats(self) -> StatsOut:
        """CPU and memory, where the backend can tell (cheap file reads); the network's counters."""
        return StatsOut(**(self.sb.usage() or {}), network=self.sb.network_stats())

    def describe(self, detail: bool) -> SandboxOut:
        out = SandboxOut(id=self.id, state=self.state, spec=self.sb.spec.to_dict(), created=self.created,
                         last_used=self.last_used, commands_run=self.commands_run,
                         pool=self.pool.id if self.pool else None)
        if detail:
            out.stats, out.recent = self.stats(), list(self.recent)
        return out

    def own(self, exc: SandboxError) -> SandboxError:
        """An error of the sandbox, naming it by the id its client knows (a pool lease's)."""
        if exc.sandbox_id == self.sb.id:
            exc.sandbox_id = self.id
        return exc


class SandboxFleet:
    """Every sandbox the service holds, with the capacity cap and the idle reaper."""

    def __init__(self, *, backend: str = "local", max_sandboxes: int = 256, idle_ttl: float | None = 3600.0,
                 reap_interval: float = 1.0):
        self.backend, self.max_sandboxes = backend, max_sandboxes
        self.idle_ttl, self.reap_interval = idle_ttl, reap_interval
        self.entries: dict[str, Entry] = {}
        self.tombstones: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.creating = 0
        self.metrics = Metrics()
        self.metrics.watch(lambda: service_families(self))
        self.pools: dict[str, WarmPool] = {}
        self._reaper: asyncio.Task | None = None
        self._fills: set[asyncio.Task] = set()

    # lifecycle of the service
    async def start(self, pools: list[PoolIn] = ()) -> None:
        # A previous server killed with -9 left a dead run: reap it now, not at first use.
        run = current_run()
        reaped = await asyncio.to_thread(reap_dead_runs, run.home, keep=run.run_id)
        swept = await asyncio.to_thread(SnapshotStore(run.home).sweep_temps)
        self.metrics.reaped.labels("runs").inc(len(reaped))
        self.metrics.reaped.labels("temps").inc(len(swept.removed))
        await asyncio.to_thread(run.ensure)
        self._reaper = asyncio.create_task(self._reap_forever())
        for body in pools:  # warmed in the background: the service answers meanwhile (as misses)
            await self.add_pool(body, wait=False)

    async def stop(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self.close(sid, "shutdown") for sid in list(self.entries)),
                             return_exceptions=True)
        await asyncio.gather(*(self.remove_pool(pid) for pid in list(self.pools)), return_exceptions=True)
        # uvicorn re-raises SIGTERM once shut down, so atexit never runs: remove the run dir now.
        await asyncio.to_thread(current_run().close_all)

    # warm pools
    async def add_pool(self, body: PoolIn, *, wait: bool = True) -> tuple[WarmPool, bool]:
        """Start a pool for ``body``'s spec, or resize the one there is; True if new.
        With ``wait``, return once it is warm (a pool that cannot create is removed and
        its error raised); else it fills in the background."""
        spec = body.to_spec(self.backend)
        warm = self.pools.get(pool_key(spec, body.snapshot))
        if warm is not None:
            self._check_room(body.size - warm.pool.size)
            warm.pool.resize(body.size)
            return warm, False
        self._check_room(body.size)
        warm = self.pools[pool_key(spec, body.snapshot)] = WarmPool(spec, body.snapshot, body.size)
        if wait:
            try:
                await warm.pool.start(wait=True)
            except BaseException:
                await self.remove_pool(warm.id)
                raise
        else:
            task = asyncio.create_task(self._fill(warm))
            self._fills.add(task)
            task.add_done_callback(self._fills.discard)
        return warm, True

    async def _fill(self, warm: WarmPool) -> None:
        try:
            await warm.pool.start(wait=True)
            warm.error = None
        except Exception as e:  # noqa: BLE001 - a pool that cannot fill is reported, not fatal
            warm.error = f"{type(e).__name__}: {e}"
            log.error("warm pool %s (%s) cannot fill: %s", warm.id, warm.spec.image, warm.error)

    def _check_room(self, more: int) -> None:
        total = sum(w.pool.size for w in self.pools.values()) + more
        if more > 0 and total > self.max_sandboxes:
            raise CapacityError(f"the pools would own {total} sandboxes, more than the service's "
                                f"maximum of {self.max_sandboxes}", retry_after=1.0)

    async def remove_pool(self, pool_id: str, reason: str = "sandbox closed: its pool was removed") -> None:
        """Close the pool and every sandbox it owns, those handed out included."""
        warm = self.pools.pop(pool_id, None)
        if warm is None:
            return
        for sid in [sid for sid, e in self.entries.items() if e.pool is warm]:
            self._forget(sid, reason, "pool")
        await warm.pool.close()

    # sandboxes
    def reserve(self, n: int) -> None:
        held = len(self.entries) + self.creating + sum(w.held for w in self.pools.values())
        if held + n > self.max_sandboxes:
            raise CapacityError(f"the service holds its maximum of {self.max_sandboxes} sandboxes; "
                                "close some or retry later", retry_after=1.0)

    async def create(self, spec: SandboxSpec, snapshot: str | None) -> Entry:
        started = time.monotonic()
        entry = await self._create(spec, snapshot)
        self.metrics.create_seconds.observe(time.monotonic() - started)
        return entry

    async def _create(self, spec: SandboxSpec, snapshot: str | None) -> Entry:
        warm = self.pools.get(pool_key(spec, snapshot))
        if warm is None:
            self.metrics.unpooled.inc()
        elif warm.pool.idle:  # a hit: acquire() hands out an idle one without awaiting a create
            warm.hits += 1
            sb = await warm.pool.acquire()
            return self.adopt(sb, warm)
        else:
            warm.misses += 1
        self.reserve(1)
        self.creating += 1
        try:
            sb = await (warm.pool.acquire() if warm else AsyncSandbox.create(spec, snapshot=snapshot))
        finally:
            self.creating -= 1
        return self.adopt(sb, warm)

    def adopt(self, sb: AsyncSandbox, warm: WarmPool | None = None) -> Entry:
        entry = Entry(sb, warm.lease_id(sb.id) if warm else None, warm)
        self.entries[entry.id] = entry
        self.metrics.created.inc()
        return entry

    def get(self, sandbox_id: str) -> Entry:
        entry = self.entries.get(sandbox_id)
        if entry is not None:
            return entry
        if sandbox_id in self.tombstones:
            raise SandboxClosed(self.tombstones[sandbox_id], sandbox_id=sandbox_id)
        raise SandboxNotFound("no such sandbox", sandbox_id=sandbox_id)

    async def close(self, sandbox_id: str, reason: str) -> None:
        why = {"client": "sandbox is closed", "shutdown": "sandbox closed: the service shut down"}.get(
            reason, f"sandbox closed by the service's idle reaper ({reason})")
        entry = self._forget(sandbox_id, why, "ttl" if reason.startswith("idle") else reason)
        if entry is None:
            return
        if entry.pool is not None and reason != "shutdown" and entry.pool.id in self.pools:
            await entry.pool.pool.release(entry.sb)  # reset in the background, then warm again
        else:
            await entry.sb.close()

    def _forget(self, sandbox_id: str, why: str, reason: str) -> Entry | None:
        """Drop an entry: later calls with its id get ``SandboxClosed`` saying ``why``."""
        entry = self.entries.pop(sandbox_id, None)
        if entry is None:
            return None
        self.tombstones[sandbox_id] = entry.close_reason = why
        while len(self.tombstones) > TOMBSTONES:
            self.tombstones.popitem(last=False)
        entry.closed.set()
        self.metrics.closed.labels(reason).inc()
        return entry

    @contextlib.asynccontextmanager
    async def using(self, entry: Entry) -> AsyncIterator[Entry]:
        """Mark a sandbox busy for a call (the reaper skips busy ones) and refresh its idle clock."""
        entry.busy += 1
        entry.last_used = time.time()
        try:
            yield entry
        finally:
            entry.busy -= 1
            entry.last_used = time.time()

    async def call(self, entry: Entry, aw):
        """Await a sandbox call, unless the sandbox is closed meanwhile (``AsyncSandbox.close``
        does not fail requests in flight, so without this they would wait forever)."""
        async with self.using(entry):
            task = asyncio.ensure_future(aw)
            closed = asyncio.ensure_future(entry.closed.wait())
            try:
                await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                closed.cancel()
                if not task.done():
                    task.cancel()
            if task.cancelled():
                raise SandboxClosed(entry.close_reason, sandbox_id=entry.id)
            try:
                return task.result()
            except SandboxError as e:
                raise entry.own(e)

    async def run(self, entry: Entry, cmd: str, **kwargs) -> CommandResult:
        """``entry.sb.run(cmd, **kwargs)`` through ``call``, recorded for the dashboard and metrics."""
        started = time.monotonic()
        try:
            result = await self.call(entry, entry.sb.run(cmd, **kwargs))
        except SandboxError as e:
            self.record(entry, cmd, started, error=e)
            raise
        self.record(entry, cmd, started, result)
        return result

    def ttl_of(self, entry: Entry) -> float | None:
        return entry.sb.spec.ttl_s if entry.sb.spec.ttl_s is not None else self.idle_ttl

    async def reap_idle(self) -> list[str]:
        now, idle = time.time(), []
        for sid, entry in list(self.entries.items()):
            ttl = self.ttl_of(entry)
            if ttl is not None and entry.busy == 0 and now - entry.last_used > ttl:
                idle.append(sid)
        await asyncio.gather(*(self.close(sid, f"idle for more than {self.ttl_of(self.entries[sid]):g}s")
                               for sid in idle), return_exceptions=True)
        return idle

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            try:
                await self.reap_idle()
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad close
                log.exception("idle reaper")

    def record(self, entry: Entry, cmd: str, started: float, result=None, error: BaseException | None = None):
        took = time.monotonic() - started
        entry.commands_run += 1
        entry.recent.append(CommandOut(cmd=cmd[:200], exit_code=result.exit_code if result else None,
                                       duration_s=round(took, 6), at=time.time(),
                                       error=type(error).__name__ if error else None))
        if result is not None:
            self.metrics.command_seconds.observe(took)
            if result.oom_killed:
                self.metrics.oom_kills.inc()
