"""``SandboxPool(SandboxSpec(backend="ray"))``: one warm pool spread over a Ray cluster.

Each host actor (``deployment/ray.py``) keeps a warm share of the pool, proportional to
its node's CPUs; this driver-side object hands sandboxes out and re-splits the shares
when a host is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from ..deployment.ray import STATS_TIMEOUT_S, HostRef, cluster, local_spec, model_token
from ..errors import SandboxError, SandboxLost, SpecError
from ..pool import AsyncPool
from ..spec import SandboxSpec
from .ray import RaySandbox


def _split(size: int, weights: list[float]) -> list[int]:
    """``size`` in integer shares proportional to ``weights`` (largest remainder)."""
    total = sum(weights)
    exact = [size * w / total for w in weights]
    shares = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - shares[i], reverse=True)[:size - sum(shares)]:
        shares[i] += 1
    return shares


class AsyncRaySandboxPool(AsyncPool):
    """``AsyncSandboxPool`` over the cluster: each host keeps a warm share of ``size``
    (proportional to its CPUs). A background task watches the hosts; when one is lost
    its sandboxes raise ``SandboxLost`` and its share is re-split over the others."""

    def __init__(self, spec: SandboxSpec | None = None, size: int = 4, *, health_interval_s: float = 5.0,
                 snapshot: Any = None):
        if not isinstance(size, int) or size < 0:
            raise SpecError("size", "must be a non-negative integer")
        if snapshot is not None:  # the host actors' pools start from the image only
            raise SpecError("snapshot", "a Ray pool starts sandboxes from the image; restore() after acquire()")
        self.spec, self.size, self.health_interval_s = spec or SandboxSpec(backend="ray"), size, health_interval_s
        self.pool_id = "pool-" + uuid.uuid4().hex[:10]
        self._model_token = model_token(self.spec)  # as of now, like a local pool
        self._busy: set[RaySandbox] = set()
        self._shares: dict[str, int] = {}  # node id -> warm sandboxes it was asked to keep
        self._stats: dict[str, dict] = {}  # node id -> last pool stats from its host
        self._lost_replaced = 0
        self._closed = False
        self._task: asyncio.Task | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self, *, wait: bool = True) -> "AsyncRaySandboxPool":
        await self._rebalance(wait=wait)
        self._task = asyncio.create_task(self._maintain())
        return self

    @property
    def idle(self) -> int:
        hosts = cluster().hosts  # a lost host's last numbers are no longer true
        return sum(s["idle"] for node_id, s in self._stats.items() if node_id in hosts)

    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def replaced(self) -> int:
        return self._lost_replaced + sum(s["replaced"] for s in self._stats.values())

    async def _rebalance(self, *, wait: bool = False) -> None:
        """Give every host its share; a host that fails here is dropped and we retry."""
        hosts_view = cluster()
        while not self._closed:
            hosts = sorted(await hosts_view.refresh(force=True), key=lambda h: h.node_id)
            if not hosts:
                raise SandboxError("no sandbox host is available in the Ray cluster")
            shares = dict(zip((h.node_id for h in hosts), _split(self.size, [h.cpus for h in hosts])))
            results = await asyncio.gather(*(
                h.invoke("pool_resize", self.pool_id, local_spec(self.spec), shares[h.node_id],
                         self.health_interval_s, wait, self._model_token) for h in hosts), return_exceptions=True)
            if not any(isinstance(r, SandboxLost) for r in results):
                self._shares = shares
                await self._poll(hosts)
                return

    async def _poll(self, hosts: list[HostRef]) -> bool:
        """Refresh the cached pool stats; True if every host answered. A lost host's
        whole share counts as replaced: it is re-created on the other hosts."""
        answers = await asyncio.gather(*(h.raw("stats", timeout=STATS_TIMEOUT_S) for h in hosts),
                                       return_exceptions=True)
        for h, s in zip(hosts, answers):
            if not isinstance(s, BaseException) and self.pool_id in s["pools"]:
                self._stats[h.node_id] = s["pools"][self.pool_id]
        live = {h.node_id for h in hosts if not h.lost}
        for node_id in set(self._stats) - live:
            gone = self._stats.pop(node_id)
            self._lost_replaced += self._shares.get(node_id, 0) + gone["replaced"]
        return not any(isinstance(s, BaseException) for s in answers)

    async def _maintain(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.health_interval_s)
            try:
                hosts = await cluster().refresh()
                ok = await self._poll(hosts)
                if not ok or {h.node_id for h in hosts} != set(self._shares):
                    await self._rebalance()
            except (SandboxError, asyncio.TimeoutError):
                continue  # no host right now: try again next round

    async def acquire(self) -> RaySandbox:
        """A warm sandbox from the host with the most idle ones (created on demand
        where none is idle); a host lost on the way is skipped."""
        if self._closed:
            raise SandboxError("pool is closed")
        hosts_view = cluster()
        for _ in range(3):
            hosts = await hosts_view.refresh()
            hosts.sort(key=lambda h: -self._stats.get(h.node_id, {}).get("idle", 0))
            for host in hosts:
                try:
                    sid = await host.invoke("pool_acquire", self.pool_id)
                except SandboxLost:
                    continue
                except SandboxError:
                    continue  # this host has no share of the pool (yet)
                stats = self._stats.get(host.node_id)
                if stats and stats["idle"]:
                    stats["idle"] -= 1
                sb = RaySandbox(self.spec, sid, host, on_close=self._busy.discard)
                self._busy.add(sb)
                return sb
            await self._rebalance()
        raise SandboxError("no sandbox host could hand out a sandbox")

    async def release(self, sb: RaySandbox) -> None:
        """Give a sandbox back: its host resets it into the pool (or closes it)."""
        await sb.close()

    async def close(self) -> None:
        self._closed = True
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(sb.close() for sb in list(self._busy)), return_exceptions=True)
        hosts = [h for h in cluster().hosts.values() if h.node_id in self._shares and not h.lost]
        await asyncio.gather(*(h.raw("pool_close", self.pool_id) for h in hosts), return_exceptions=True)
        self._stats.clear()
