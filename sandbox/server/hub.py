"""The sandboxes a ``rockroll serve`` service holds: capacity, idle reaping, bookkeeping.

The service owns its sandboxes (``SandboxHub``): creation is capped (429 + Retry-After),
an idle reaper closes sandboxes unused for ``spec.ttl_s`` (else ``idle_ttl``), shutdown
closes all of them, and start-up reaps what a previous, killed server left behind.
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
from ..errors import CapacityError, SandboxClosed, SandboxNotFound
from .metrics import Metrics
from .wire import CommandOut, SandboxOut, StatsOut

log = logging.getLogger("rockroll.serve")
RECENT_COMMANDS = 20          # per sandbox, for the dashboard
TOMBSTONES = 10_000           # closed ids remembered, so late callers get SandboxClosed, not 404


class Entry:
    """The service's bookkeeping for one sandbox: activity, in-flight calls, recent commands."""

    def __init__(self, sb: AsyncSandbox):
        self.sb = sb
        self.created = self.last_used = time.time()
        self.busy = 0
        self.commands_run = 0
        self.recent: collections.deque[CommandOut] = collections.deque(maxlen=RECENT_COMMANDS)
        self.closed = asyncio.Event()   # set on close: in-flight calls fail fast instead of hanging
        self.close_reason = "sandbox is closed"

    @property
    def state(self) -> str:
        return "alive" if self.sb.alive else "dead"

    def stats(self) -> StatsOut:
        """CPU and memory, where the backend can tell (cheap file reads)."""
        return StatsOut(**(self.sb.usage() or {}))

    def describe(self, detail: bool) -> SandboxOut:
        out = SandboxOut(id=self.sb.id, state=self.state, spec=self.sb.spec.to_dict(), created=self.created,
                         last_used=self.last_used, commands_run=self.commands_run)
        if detail:
            out.stats, out.recent = self.stats(), list(self.recent)
        return out


class SandboxHub:
    """Every sandbox the service holds, with the capacity cap and the idle reaper."""

    def __init__(self, *, backend: str = "local", max_sandboxes: int = 256, idle_ttl: float | None = 3600.0,
                 reap_interval: float = 1.0):
        self.backend, self.max_sandboxes = backend, max_sandboxes
        self.idle_ttl, self.reap_interval = idle_ttl, reap_interval
        self.entries: dict[str, Entry] = {}
        self.tombstones: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.creating = 0
        self.metrics = Metrics()
        self._reaper: asyncio.Task | None = None

    # lifecycle of the service
    async def start(self) -> None:
        # A previous server killed with -9 left a dead run: reap it now, not at first use.
        run = current_run()
        await asyncio.to_thread(reap_dead_runs, run.home, keep=run.run_id)
        await asyncio.to_thread(run.ensure)
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self.close(sid, "shutdown") for sid in list(self.entries)),
                             return_exceptions=True)
        # uvicorn re-raises SIGTERM once shut down, so atexit never runs: remove the run dir now.
        await asyncio.to_thread(current_run().close_all)

    # sandboxes
    def reserve(self, n: int) -> None:
        if len(self.entries) + self.creating + n > self.max_sandboxes:
            raise CapacityError(f"the service holds its maximum of {self.max_sandboxes} sandboxes; "
                                "close some or retry later", retry_after=1.0)

    async def create(self, spec, snapshot: str | None) -> Entry:
        self.reserve(1)
        self.creating += 1
        try:
            sb = await AsyncSandbox.create(spec, snapshot=snapshot)
        finally:
            self.creating -= 1
        return self.adopt(sb)

    def adopt(self, sb: AsyncSandbox) -> Entry:
        entry = self.entries[sb.id] = Entry(sb)
        self.metrics.created += 1
        return entry

    def get(self, sandbox_id: str) -> Entry:
        entry = self.entries.get(sandbox_id)
        if entry is not None:
            return entry
        if sandbox_id in self.tombstones:
            raise SandboxClosed(self.tombstones[sandbox_id], sandbox_id=sandbox_id)
        raise SandboxNotFound("no such sandbox", sandbox_id=sandbox_id)

    async def close(self, sandbox_id: str, reason: str) -> None:
        entry = self.entries.pop(sandbox_id, None)
        if entry is None:
            return
        why = {"client": "sandbox is closed", "shutdown": "sandbox closed: the service shut down"}.get(
            reason, f"sandbox closed by the service's idle reaper ({reason})")
        self.tombstones[sandbox_id] = entry.close_reason = why
        while len(self.tombstones) > TOMBSTONES:
            self.tombstones.popitem(last=False)
        entry.closed.set()
        self.metrics.closed["ttl" if reason.startswith("idle") else reason] += 1
        await entry.sb.close()

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
                raise SandboxClosed(entry.close_reason, sandbox_id=entry.sb.id)
            return task.result()

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
            self.metrics.observe(took)
