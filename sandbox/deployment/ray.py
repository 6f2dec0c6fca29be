"""``backend="ray"``, the placement side: one host actor per node of a Ray cluster.

Deployment, not runtime (the SWE-ReX split): each node runs one ``SandboxHost`` actor
that drives ordinary local sandboxes (``backend="local"``) and warm pools on that node;
``runtime/ray.py``'s ``RaySandbox`` is the client, forwarding every call to its host,
and ``ray_pool.py`` spreads a warm pool over the hosts.

- Placement is by load, not by Ray resources: a sandbox is not a Ray task, so charging
  it ``num_cpus`` would only starve Ray's own scheduling. A new sandbox goes to the host
  with the fewest sandboxes (busy + warm) per CPU of its node: the hosts' counts from one
  round of stats a second, plus what was placed since, so a burst costs no stats call per create.
- A lost node (or host actor) turns every call on its sandboxes into ``SandboxLost``;
  their guests die with the host process (stdin EOF and PDEATHSIG), so nothing leaks.
- ``AsyncRaySandboxPool`` (``ray_pool.py``) splits its size over the hosts by CPU and re-splits it over
  the survivors when a host is lost; ``SandboxPool(SandboxSpec(backend="ray"))`` is one.

Connection: ``RAY_ADDRESS`` (else ``"auto"``). Ray replaces a loopback node address
with the machine's outward IP; for a loopback cluster address we keep loopback (see
``keep_loopback``). ``python -m rockroll.sandbox.deployment.ray start ...`` is Ray's own
``ray start`` with that rule, for a single-machine cluster on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import os
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from .. import errors
from ..base import AsyncSandbox, once
from ..errors import IsolationUnavailable, SandboxError, SandboxLost
from ..home import state_home
from ..pool import AsyncSandboxPool
from ..protocol.tokens import admin_token, current_token
from ..spec import SandboxSpec
from ..storage.snapshots import SnapshotStore
from .reaper import current_run

NAMESPACE = "rockroll"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
REVIVE_S = 30.0      # a node whose host was lost is not offered a new host for this long
REFRESH_S = 2.0      # how stale the node list may be before a placement re-reads it
STATS_TIMEOUT_S = 10.0
PLACE_STATS_S = 1.0  # how long one round of the hosts' stats serves the placements that follow
STARTS_PER_CPU = 8   # sandbox starts a host runs at once per CPU of its node; the rest queue


# ===================================================================== connection
def _ray():
    """Ray, imported lazily (an optional extra); absolute, so never this module."""
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise IsolationUnavailable("backend='ray' needs Ray: pip install 'rockroll[ray]'") from e


def keep_loopback() -> None:
    """Make Ray keep a loopback node/cluster address instead of swapping in the
    machine's outward IP (which Ray does so that other machines can reach the node).
    A cluster on 127.0.0.1 is one machine by construction, and on shared hosts loopback
    is the only address we may send traffic to. Affects only loopback host strings."""
    services = importlib.import_module("ray._private.services")
    original = services.resolve_ip_for_localhost
    if getattr(original, "_rockroll_loopback", False):
        return

    def resolve(host: str) -> str:
        return host if host in LOOPBACK else original(host)

    resolve._rockroll_loopback = True
    services.resolve_ip_for_localhost = resolve


def _is_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK


_connect_lock = threading.Lock()


def connect(address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (default ``$RAY_ADDRESS``, else ``"auto"``),
    unless this process already did. Blocking (seconds): call it off the event loop."""
    ray = _ray()
    with _connect_lock:
        if ray.is_initialized():
            return
        address = address or os.environ.get("RAY_ADDRESS") or "auto"
        extra = {}
        if _is_loopback(address):
            keep_loopback()
            extra["_node_ip_address"] = "127.0.0.1"
        ray.init(address=address, namespace=NAMESPACE, ignore_reinit_error=True,
                 log_to_driver=False, **extra)


# ===================================================================== wire format
def pack_error(e: SandboxError) -> tuple:
    """Errors cross the wire as (class name, args, attributes), not pickled: several
    of our exception classes take constructor arguments that differ from their args."""
    return type(e).__name__, e.args, dict(e.__dict__)


def unpack_error(packed: tuple) -> SandboxError:
    name, args, state = packed
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, SandboxError)):
        cls = SandboxError
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


def import_layers(store: SnapshotStore, blobs: dict[str, bytes]) -> None:
    """Add layer tarballs received from another node; each digest is recomputed."""
    for digest, data in blobs.items():
        if store.tarball(digest).exists():
            continue
        store.tar_root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=store.tar_root, suffix=".part", delete=False) as f:
            f.write(data)
        try:
            got = store.import_tarball(Path(f.name))
        finally:
            os.unlink(f.name)
        if got != digest:
            raise errors.SnapshotError(f"layer received as {digest} has digest {got}")


def missing_layers(store: SnapshotStore, digests) -> list[str]:
    return [d for d in digests if not store.tarball(d).exists()]


# ===================================================================== the actor
class SandboxHost:
    """One per node (a Ray async actor): that node's sandboxes by id, and warm pools by
    pool id. Every method returns ``("ok", value)`` or ``("err", packed error)``."""

    # ``expose`` answers a port on this node's 127.0.0.1 (``runtime/ray.py`` checks the node)
    _OPS = frozenset({"run", "read_file", "stat", "sessions", "close_session", "reset", "ping", "expose",
                      "egress_log"})

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.boxes: dict[str, AsyncSandbox] = {}
        self.owner: dict[str, str] = {}  # sandbox id -> pool id it was acquired from
        self.pools: dict[str, AsyncSandboxPool] = {}
        self.terminals: dict[str, Any] = {}  # "<sandbox id>/<n>" -> AsyncTerminal
        self.terminal_count = 0
        self.store = SnapshotStore(state_home())
        # Starts at once on this node: past it a create waits its turn here instead of starting
        # a guest that a saturated CPU cannot bring up within its handshake timeout (a burst of
        # 2,000 a node failed ~45 % that way; queued, the same creates succeed, later).
        self._starting = asyncio.Semaphore(STARTS_PER_CPU * len(os.sched_getaffinity(0)))

    def _box(self, sid: str) -> AsyncSandbox:
        sb = self.boxes.get(sid)
        if sb is None:
            raise errors.SandboxNotFound("no such sandbox on this node", sandbox_id=sid)
        return sb

    def _adopt(self, sb: AsyncSandbox, pool_id: str | None = None) -> str:
        self.boxes[sb.id] = sb
        if pool_id:
            self.owner[sb.id] = pool_id
        return sb.id

    async def _guard(self, fn, *args):
        try:
            return "ok", await fn(*args)
        except SandboxError as e:
            return "err", pack_error(e)

    # -- liveness and load
    async def stats(self) -> dict:
        return {"node": self.node_id, "pid": os.getpid(), "run_id": _run_id(),
                "sandboxes": len(self.boxes),
                "pools": {pid: {"idle": p.idle, "replaced": p.replaced} for pid, p in self.pools.items()}}

    # -- lifecycle
    async def create(self, spec: dict, digest: str | None, model_token: str | None = None):
        """``model_token``: the driver's admin token of ``spec.model_endpoint`` (a call
        argument, never part of the spec, never in this actor's environment)."""
        async def make():
            async with self._starting:
                with admin_token(model_token):
                    sb = await AsyncSandbox.create(SandboxSpec.from_dict(spec), snapshot=digest)
            return self._adopt(sb)
        return await self._guard(make)

    async def close(self, sid: str):
        async def close():
            sb, pool = self.boxes.pop(sid, None), self.pools.get(self.owner.pop(sid, ""))
            if sb is not None:
                await (pool.release(sb) if pool is not None else sb.close())
        return await self._guard(close)

    # -- the sandbox API, forwarded
    async def call(self, sid: str, op: str, args: tuple, kwargs: dict):
        if op not in self._OPS:
            return "err", pack_error(SandboxError(f"unknown operation {op!r}", sandbox_id=sid))
        return await self._guard(lambda: getattr(self._box(sid), op)(*args, **kwargs))

    async def network_stats(self, sid: str):
        """The sandbox's network counters (``AsyncSandbox.network_stats``), read off this
        actor's loop: the packet filter's counts are a subprocess away."""
        return await self._guard(lambda: asyncio.to_thread(self._box(sid).network_stats))

    # -- terminals: opened here, driven by the client's calls (``runtime/ray.py``)
    async def terminal_open(self, sid: str, kwargs: dict):
        async def open_():
            term = await self._box(sid).open_terminal(**kwargs)
            self.terminal_count += 1
            key = f"{sid}/{self.terminal_count}"
            self.terminals[key] = term
            return key
        return await self._guard(open_)

    def _terminal(self, key: str):
        term = self.terminals.get(key)
        if term is None:
            raise errors.TerminalError("no such terminal on this node (closed)", sandbox_id=key.split("/")[0])
        return term

    async def terminal_recv(self, key: str):
        """The next chunk of output, or ``(None, exit_code)`` at the end: one call a chunk,
        so the guest's window bounds what waits (a flood is not buffered here)."""
        async def recv():
            term = self._terminal(key)
            data = await term.read_bytes()
            return data if data is not None else (None, term.exit_code)
        return await self._guard(recv)

    async def terminal_call(self, key: str, op: str, args: tuple):
        async def call():
            term = self._terminal(key)
            if op == "close":
                self.terminals.pop(key, None)
                return await term.close()
            if op not in ("write", "resize", "signal"):
                raise SandboxError(f"unknown terminal operation {op!r}")
            return await getattr(term, op)(*args)
        return await self._guard(call)

    async def run_stream(self, sid: str, cmd: str, kwargs: dict):
        try:
            async for item in self._box(sid).run_stream(cmd, **kwargs):
                yield "ok", item
        except SandboxError as e:
            yield "err", pack_error(e)

    async def write_bytes(self, sid: str, path: str, data: bytes, mode: int, tar: bool):
        """The sandbox's own ``write_stream`` of bytes that came whole through Ray."""
        async def write():
            return await self._box(sid).write_stream(path, once(data), mode=mode, tar=tar)
        return await self._guard(write)

    async def read_bytes(self, sid: str, path: str):
        """``(kind, bytes)`` of the sandbox's own ``read_stream``, whole: Ray carries objects."""
        async def read():
            kind, chunks = await self._box(sid).read_stream(path)
            return kind, b"".join([chunk async for chunk in chunks])
        return await self._guard(read)

    # -- snapshots: tarballs live in each node's store; only missing layers travel
    async def snapshot(self, sid: str):
        async def snapshot():
            snap = await self._box(sid).snapshot()
            return dataclasses.replace(snap, path=None)
        return await self._guard(snapshot)

    async def missing_layers(self, digests: list[str]) -> list[str]:
        return missing_layers(self.store, digests)

    async def export_layers(self, digests: list[str]) -> dict[str, bytes]:
        return {d: self.store.tarball(d).read_bytes() for d in digests}

    async def import_layers(self, blobs: dict[str, bytes]):
        return await self._guard(lambda: asyncio.to_thread(import_layers, self.store, blobs))

    async def restore(self, sid: str, digest: str):
        return await self._guard(lambda: self._box(sid).restore(digest))

    async def fork(self, sid: str, n: int):
        async def fork():
            return [self._adopt(sb) for sb in await self._box(sid).fork(n)]
        return await self._guard(fork)

    # -- warm pools
    async def pool_resize(self, pool_id: str, spec: dict, size: int, health_interval_s: float, wait: bool,
                          model_token: str | None = None):
        """Open the pool (or change its share) and, with ``wait``, fill it. The pool keeps
        ``model_token`` (as ``create``) for every sandbox it makes."""
        async def resize():
            pool = self.pools.get(pool_id)
            if pool is None:
                with admin_token(model_token):
                    pool = AsyncSandboxPool(SandboxSpec.from_dict(spec), size, health_interval_s=health_interval_s)
                self.pools[pool_id] = pool
                await pool.start(wait=wait)
                return
            pool.resize(size)
        return await self._guard(resize)

    async def pool_acquire(self, pool_id: str):
        async def acquire():
            pool = self.pools.get(pool_id)
            if pool is None:
                raise SandboxError(f"no pool {pool_id} on this node")
            return self._adopt(await pool.acquire(), pool_id)
        return await self._guard(acquire)

    async def pool_close(self, pool_id: str):
        pool = self.pools.pop(pool_id, None)
        for sid in [s for s, p in self.owner.items() if p == pool_id]:
            self.owner.pop(sid)
        if pool is not None:
            await pool.close()
        return "ok", None


def _run_id() -> str:
    return current_run().run_id



# ===================================================================== client side
def _lost_errors() -> tuple[type, ...]:
    exc = _ray().exceptions
    names = ("RayActorError", "NodeDiedError", "WorkerCrashedError", "ObjectLostError",
             "LocalRayletDiedError")
    return tuple(getattr(exc, n) for n in names if hasattr(exc, n))


class HostRef:
    """The driver's handle on one host actor; turns Ray failures into sandbox errors."""

    def __init__(self, actor, node_id: str, cpus: float):
        self.actor, self.node_id, self.cpus = actor, node_id, max(cpus, 1.0)
        self.lost = False

    @contextlib.contextmanager
    def translating(self, sandbox_id: str | None):
        """Ray's failures as ours: a dead actor or node is ``SandboxLost``."""
        ray = _ray()
        try:
            yield
        except _lost_errors() as e:
            self.lost = True
            cluster().forget(self)
            raise SandboxLost(f"sandbox host on node {self.node_id[:8]} is gone ({type(e).__name__})",
                              sandbox_id=sandbox_id) from None
        except ray.exceptions.RayError as e:
            raise SandboxError(f"sandbox host failed: {e}", sandbox_id=sandbox_id) from e

    async def invoke(self, method: str, *args, sandbox_id: str | None = None):
        """Call an actor method that answers ``(status, value)``; raise what it raised."""
        self._ensure_alive(sandbox_id)
        with self.translating(sandbox_id):
            status, value = await getattr(self.actor, method).remote(*args)
        return _unpack(status, value)

    def invoke_blocking(self, method: str, *args, sandbox_id: str | None = None,
                        timeout: float = STATS_TIMEOUT_S):
        """``invoke`` for a synchronous caller (``RaySandbox.network_stats``): waits on Ray."""
        self._ensure_alive(sandbox_id)
        with self.translating(sandbox_id):
            status, value = _ray().get(getattr(self.actor, method).remote(*args), timeout=timeout)
        return _unpack(status, value)

    def _ensure_alive(self, sandbox_id: str | None) -> None:
        if self.lost:
            raise SandboxLost(f"sandbox host on node {self.node_id[:8]} is gone", sandbox_id=sandbox_id)

    async def raw(self, method: str, *args, timeout: float | None = None):
        """Call an actor method that returns plainly (stats, layer lists)."""
        with self.translating(None):
            return await asyncio.wait_for(_awaited(getattr(self.actor, method).remote(*args)), timeout)


def _unpack(status: str, value):
    if status == "err":
        raise unpack_error(value)
    return value


async def _awaited(ref):
    return await ref


def this_node() -> str:
    """The Ray node id of this process (the driver's, for the client)."""
    return _ray().get_runtime_context().get_node_id()


class RayCluster:
    """The driver's view of the hosts: one ``SandboxHost`` per alive node, created on
    first use and whenever a node appears; placement by load (see the module doc)."""

    def __init__(self):
        self.hosts: dict[str, HostRef] = {}
        self.banned: dict[str, float] = {}  # node id -> when its host was lost
        self.pending: dict[str, int] = {}   # creations in flight per node, so that a
        self.refreshed = 0.0                # burst of creates does not all pick one node
        self.job: str | None = None         # the Ray connection these hosts belong to
        # per event loop: the refresh's lock; placement stats, their lock and when they were taken
        self._locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._stats_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._stats_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def refresh(self, *, force: bool = False) -> list[HostRef]:
        if force or time.monotonic() - self.refreshed > REFRESH_S:
            # one refresh at a time: two at once would each start a host for a new node, and
            # the handle overwritten in ``hosts`` takes its actor down (out of scope) as it goes
            lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
            async with lock:
                if force or time.monotonic() - self.refreshed > REFRESH_S:  # not done meanwhile
                    await self._refresh()
        return [h for h in self.hosts.values() if not h.lost]

    async def _refresh(self) -> None:
        await asyncio.to_thread(connect)
        ctx = _ray().get_runtime_context()
        # a new connection (another cluster's job ids start over: its session tells them
        # apart): the old actor handles mean nothing
        job = f"{ctx.get_session_name()}/{ctx.get_job_id()}"
        if job != self.job:
            self.hosts, self.banned, self.job = {}, {}, job
        nodes = await asyncio.to_thread(_ray().nodes)
        await self._sync(nodes)
        self.refreshed = time.monotonic()

    async def _sync(self, nodes: list[dict]) -> None:
        alive = {n["NodeID"]: n for n in nodes if n.get("Alive")}
        for node_id in list(self.hosts):
            if node_id not in alive:
                self.hosts.pop(node_id).lost = True
        now = time.monotonic()
        new = [HostRef(_start_host(node_id), node_id, info.get("Resources", {}).get("CPU", 1.0))
               for node_id, info in alive.items()
               if node_id not in self.hosts and now - self.banned.get(node_id, -REVIVE_S) >= REVIVE_S]
        for host, ok in zip(new, await asyncio.gather(*(self._ready(h) for h in new))):
            if ok:
                self.hosts[host.node_id] = host

    async def _ready(self, host: HostRef) -> bool:
        try:
            await host.raw("stats", timeout=120.0)  # a fresh actor starts a Python worker: slow
            return True
        except (SandboxError, asyncio.TimeoutError):
            return False

    def forget(self, host: HostRef) -> None:
        if self.hosts.get(host.node_id) is host:
            del self.hosts[host.node_id]
            self.banned[host.node_id] = time.monotonic()

    async def stats(self) -> list[tuple[HostRef, dict]]:
        """``(host, stats)`` of every host that answers; the others are forgotten."""
        hosts = await self.refresh()

        async def one(h):
            try:
                return h, await h.raw("stats", timeout=STATS_TIMEOUT_S)
            except (SandboxError, asyncio.TimeoutError):
                return h, None
        return [(h, s) for h, s in await asyncio.gather(*(one(h) for h in hosts)) if s is not None]

    async def pick(self) -> HostRef:
        """The least loaded host: fewest sandboxes (busy + warm, and those being placed) per
        node CPU. A burst's placements share one round of stats (``PLACE_STATS_S``) instead
        of asking every host once per create; a host too busy to answer in time is still a
        host (its creates queue there): only when none is alive is there none to pick."""
        answers, placed = await self._placement_stats()
        if not answers:
            answers = [(h, None) for h in await self.refresh() if not h.lost]
        if not answers:
            raise SandboxError("no sandbox host is available in the Ray cluster")

        def load(item):
            h, s = item
            held = s["sandboxes"] + sum(p["idle"] for p in s["pools"].values()) if s else 0
            return (held + self.pending.get(h.node_id, 0) + placed.get(h.node_id, 0)) / h.cpus, h.node_id
        host = min(answers, key=load)[0]
        placed[host.node_id] = placed.get(host.node_id, 0) + 1  # what the stats do not show yet
        return host

    async def _placement_stats(self) -> tuple[list[tuple[HostRef, dict]], dict[str, int]]:
        """:meth:`stats`, reused for ``PLACE_STATS_S`` by every placement of this loop, with
        the sandboxes placed per node since they were taken."""
        loop = asyncio.get_running_loop()
        lock = self._stats_locks.setdefault(loop, asyncio.Lock())
        async with lock:
            taken, answers, placed = self._stats_cache.get(loop, (-PLACE_STATS_S, [], {}))
            if time.monotonic() - taken >= PLACE_STATS_S or any(h.lost for h, _ in answers):
                answers, placed = await self.stats(), {}
                self._stats_cache[loop] = (time.monotonic(), answers, placed)
            return answers, placed

    @contextlib.contextmanager
    def placing(self, host: HostRef):
        self.pending[host.node_id] = self.pending.get(host.node_id, 0) + 1
        try:
            yield
        finally:
            self.pending[host.node_id] -= 1


def _start_host(node_id: str):
    """Get or create the host actor of a node: pinned there (hard affinity), named so
    every driver of the namespace shares it, owned by its creator (it dies with it)."""
    strategy = importlib.import_module("ray.util.scheduling_strategies").NodeAffinitySchedulingStrategy
    return _host_class().options(
        name=f"rockroll-host-{node_id[:8]}", namespace=NAMESPACE, get_if_exists=True,
        scheduling_strategy=strategy(node_id, soft=False), num_cpus=0, max_restarts=0,
        max_concurrency=1000).remote(node_id)


@functools.cache
def _host_class():
    return _ray().remote(SandboxHost)


_the_cluster: RayCluster | None = None


def cluster() -> RayCluster:
    """The process's view of the cluster (it mirrors Ray's own per-process connection)."""
    global _the_cluster
    if _the_cluster is None:
        _the_cluster = RayCluster()
    return _the_cluster


def local_spec(spec: SandboxSpec) -> dict:
    """What the host runs: the same sandbox on the node's local backend."""
    return dataclasses.replace(spec, backend="local").to_dict()


def model_token(spec: SandboxSpec) -> str | None:
    """The driver's admin token for ``spec.model_endpoint``, sent along with a create: the
    host actor is shared by every driver of the cluster and started long before, so its
    own environment cannot hold each driver's token."""
    return current_token() if spec.model_endpoint else None


async def ship(host: HostRef, ref: Any, *, sandbox_id: str | None = None) -> str:
    """Make a snapshot's layer chain present on a host's node; return its digest."""
    store = SnapshotStore(state_home())
    snap = await asyncio.to_thread(store.load, ref)
    missing = await host.raw("missing_layers", list(snap.layers))
    if missing:
        blobs = {d: store.tarball(d).read_bytes() for d in missing}
        await host.invoke("import_layers", blobs, sandbox_id=sandbox_id)
    return snap.digest


if __name__ == "__main__":
    # `python -m rockroll.sandbox.deployment.ray start --head --node-ip-address=127.0.0.1 ...`
    import sys

    keep_loopback()
    sys.argv[0] = "ray"
    importlib.import_module("ray.scripts.scripts").main()
