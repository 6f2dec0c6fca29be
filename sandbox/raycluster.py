"""``backend="ray"``: sandboxes spread over a Ray cluster, one host actor per node.

Deployment, not runtime (the SWE-ReX split): each node runs one ``SandboxHost`` actor
that drives ordinary local sandboxes (``AsyncSandbox`` with ``backend="local"``) and
warm pools on that node; ``RaySandbox`` is the client object, with the names,
signatures and exceptions of ``AsyncSandbox``, forwarding every call to its host.

- Placement is by load, not by Ray resources: a sandbox is not a Ray task, so charging
  it ``num_cpus`` would only starve Ray's own scheduling. A new sandbox goes to the host
  with the fewest sandboxes (busy + warm) per CPU of its node.
- A lost node (or host actor) turns every call on its sandboxes into ``SandboxLost``;
  their agents die with the host process (stdin EOF and PDEATHSIG), so nothing leaks.
- ``AsyncRaySandboxPool`` splits its size over the hosts by CPU and re-splits it over
  the survivors when a host is lost; ``SandboxPool(SandboxSpec(backend="ray"))`` is one.

Connection: ``RAY_ADDRESS`` (else ``"auto"``). Ray replaces a loopback node address
with the machine's outward IP; for a loopback cluster address we keep loopback (see
``keep_loopback``). ``python -m rockroll.sandbox.raycluster start ...`` is Ray's own
``ray start`` with that rule, for a single-machine cluster on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import io
import os
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from . import errors
from .client import AsyncSandbox
from .errors import IsolationUnavailable, SandboxClosed, SandboxError, SandboxLost, SpecError
from .pool import AsyncSandboxPool
from .rootfs import state_home
from .snapshots import SnapshotStore
from .spec import CommandResult, SandboxSpec, Snapshot

NAMESPACE = "rockroll"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
REVIVE_S = 30.0      # a node whose host was lost is not offered a new host for this long
REFRESH_S = 2.0      # how stale the node list may be before a placement re-reads it
STATS_TIMEOUT_S = 10.0


# ===================================================================== connection
def _ray():
    """Ray, imported lazily (an optional extra). Named ``raycluster`` so that this
    import can never resolve to this module itself."""
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
def _pack_error(e: SandboxError) -> tuple:
    """Errors cross the wire as (class name, args, attributes), not pickled: several
    of our exception classes take constructor arguments that differ from their args."""
    return type(e).__name__, e.args, dict(e.__dict__)


def _unpack_error(packed: tuple) -> SandboxError:
    name, args, state = packed
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, SandboxError)):
        cls = SandboxError
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


def _tar_dir(path: Path) -> bytes:
    """A directory as an uncompressed tar of ``.`` and ``./...`` (what ``unpack_plain_tar`` takes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        tar.add(path, arcname=".")
    return buf.getvalue()


def _import_layers(store: SnapshotStore, blobs: dict[str, bytes]) -> None:
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


def _missing_layers(store: SnapshotStore, digests) -> list[str]:
    return [d for d in digests if not store.tarball(d).exists()]


# ===================================================================== the actor
class SandboxHost:
    """One per node (a Ray async actor): that node's sandboxes by id, and warm pools by
    pool id. Every method returns ``("ok", value)`` or ``("err", packed error)``."""

    _OPS = frozenset({"run", "write_file", "read_file", "exists", "sessions", "close_session",
                      "reset", "ping"})

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.boxes: dict[str, AsyncSandbox] = {}
        self.owner: dict[str, str] = {}  # sandbox id -> pool id it was acquired from
        self.pools: dict[str, AsyncSandboxPool] = {}
        self.store = SnapshotStore(state_home())

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
            return "err", _pack_error(e)

    # -- liveness and load
    async def stats(self) -> dict:
        return {"node": self.node_id, "pid": os.getpid(), "run_id": _run_id(),
                "sandboxes": len(self.boxes),
                "pools": {pid: {"idle": p.idle, "replaced": p.replaced} for pid, p in self.pools.items()}}

    # -- lifecycle
    async def create(self, spec: dict, digest: str | None):
        async def make():
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
            return "err", _pack_error(SandboxError(f"unknown operation {op!r}", sandbox_id=sid))
        return await self._guard(lambda: getattr(self._box(sid), op)(*args, **kwargs))

    async def run_stream(self, sid: str, cmd: str, kwargs: dict):
        try:
            async for item in self._box(sid).run_stream(cmd, **kwargs):
                yield "ok", item
        except SandboxError as e:
            yield "err", _pack_error(e)

    async def upload(self, sid: str, data: bytes, is_dir: bool, mode: int, remote: str):
        """Stage the bytes on this node, then use the sandbox's own ``upload``."""
        async def upload():
            with tempfile.TemporaryDirectory(prefix="rockroll-up-") as tmp:
                local = Path(tmp) / "x"
                if is_dir:
                    from .layers import unpack_plain_tar
                    await asyncio.to_thread(unpack_plain_tar, data, local)
                else:
                    local.write_bytes(data)
                    local.chmod(mode)
                await self._box(sid).upload(local, remote)
        return await self._guard(upload)

    async def download(self, sid: str, remote: str):
        """The sandbox's own ``download`` into a stage here; a folder travels as a tar."""
        async def download():
            with tempfile.TemporaryDirectory(prefix="rockroll-down-") as tmp:
                local = Path(tmp) / "x"
                await self._box(sid).download(remote, local)
                if local.is_dir():
                    return True, await asyncio.to_thread(_tar_dir, local)
                return False, local.read_bytes()
        return await self._guard(download)

    # -- snapshots: tarballs live in each node's store; only missing layers travel
    async def snapshot(self, sid: str):
        async def snapshot():
            snap = await self._box(sid).snapshot()
            return dataclasses.replace(snap, path=None)
        return await self._guard(snapshot)

    async def missing_layers(self, digests: list[str]) -> list[str]:
        return _missing_layers(self.store, digests)

    async def export_layers(self, digests: list[str]) -> dict[str, bytes]:
        return {d: self.store.tarball(d).read_bytes() for d in digests}

    async def import_layers(self, blobs: dict[str, bytes]):
        return await self._guard(lambda: asyncio.to_thread(_import_layers, self.store, blobs))

    async def restore(self, sid: str, digest: str):
        return await self._guard(lambda: self._box(sid).restore(digest))

    async def fork(self, sid: str, n: int):
        async def fork():
            return [self._adopt(sb) for sb in await self._box(sid).fork(n)]
        return await self._guard(fork)

    # -- warm pools
    async def pool_resize(self, pool_id: str, spec: dict, size: int, health_interval_s: float, wait: bool):
        """Open the pool (or change its share) and, with ``wait``, fill it."""
        async def resize():
            pool = self.pools.get(pool_id)
            if pool is None:
                pool = AsyncSandboxPool(SandboxSpec.from_dict(spec), size, health_interval_s=health_interval_s)
                self.pools[pool_id] = pool
                await pool.start(wait=wait)
                return
            pool.size = size
            pool._kick()  # the refill task tops it up; surplus idle ones drain on release
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
    from .registry import current_run

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
            _cluster().forget(self)
            raise SandboxLost(f"sandbox host on node {self.node_id[:8]} is gone ({type(e).__name__})",
                              sandbox_id=sandbox_id) from None
        except ray.exceptions.RayError as e:
            raise SandboxError(f"sandbox host failed: {e}", sandbox_id=sandbox_id) from e

    async def invoke(self, method: str, *args, sandbox_id: str | None = None):
        """Call an actor method that answers ``(status, value)``; raise what it raised."""
        if self.lost:
            raise SandboxLost(f"sandbox host on node {self.node_id[:8]} is gone", sandbox_id=sandbox_id)
        with self.translating(sandbox_id):
            status, value = await getattr(self.actor, method).remote(*args)
        if status == "err":
            raise _unpack_error(value)
        return value

    async def raw(self, method: str, *args, timeout: float | None = None):
        """Call an actor method that returns plainly (stats, layer lists)."""
        with self.translating(None):
            return await asyncio.wait_for(_awaited(getattr(self.actor, method).remote(*args)), timeout)


async def _awaited(ref):
    return await ref


class RayCluster:
    """The driver's view of the hosts: one ``SandboxHost`` per alive node, created on
    first use and whenever a node appears; placement by load (see the module doc)."""

    def __init__(self):
        self.hosts: dict[str, HostRef] = {}
        self.banned: dict[str, float] = {}  # node id -> when its host was lost
        self.pending: dict[str, int] = {}   # creations in flight per node, so that a
        self.refreshed = 0.0                # burst of creates does not all pick one node
        self.job: str | None = None         # the Ray connection these hosts belong to

    async def refresh(self, *, force: bool = False) -> list[HostRef]:
        if force or time.monotonic() - self.refreshed > REFRESH_S:
            await asyncio.to_thread(connect)
            job = _ray().get_runtime_context().get_job_id()
            if job != self.job:  # a new connection: the old actor handles mean nothing
                self.hosts, self.banned, self.job = {}, {}, job
            nodes = await asyncio.to_thread(_ray().nodes)
            await self._sync(nodes)
            self.refreshed = time.monotonic()
        return [h for h in self.hosts.values() if not h.lost]

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
        """The least loaded host: fewest sandboxes (busy + warm) per node CPU."""
        answers = await self.stats()
        if not answers:
            raise SandboxError("no sandbox host is available in the Ray cluster")

        def load(item):
            h, s = item
            warm = sum(p["idle"] for p in s["pools"].values())
            return (s["sandboxes"] + warm + self.pending.get(h.node_id, 0)) / h.cpus, h.node_id
        return min(answers, key=load)[0]

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


def _cluster() -> RayCluster:
    """The process's view of the cluster (it mirrors Ray's own per-process connection)."""
    global _the_cluster
    if _the_cluster is None:
        _the_cluster = RayCluster()
    return _the_cluster


def _local_spec(spec: SandboxSpec) -> dict:
    """What the host runs: the same sandbox on the node's local backend."""
    return dataclasses.replace(spec, backend="local").to_dict()


class RaySandbox:
    """A sandbox on some node of a Ray cluster: the ``AsyncSandbox`` API, forwarded to
    that node's host actor. When the node or host is lost every call raises
    ``SandboxLost``; ``close()`` still succeeds (there is nothing left to close)."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str, host: HostRef, pool: "AsyncRaySandboxPool | None" = None):
        self.spec, self.id, self.host, self._pool = spec, sandbox_id, host, pool
        self._closed = False
        self.created = time.time()

    @property
    def node_id(self) -> str:
        return self.host.node_id

    @classmethod
    async def create(cls, spec: SandboxSpec | None = None, *, snapshot: Any = None) -> "RaySandbox":
        spec = spec or SandboxSpec(backend="ray")
        cluster = _cluster()
        host = await cluster.pick()
        with cluster.placing(host):
            digest = await _ship(host, snapshot) if snapshot is not None else None
            sid = await host.invoke("create", _local_spec(spec), digest)
        return cls(spec, sid, host)

    @property
    def alive(self) -> bool:
        return not self._closed and not self.host.lost

    def _check(self) -> None:
        if self._closed:
            raise SandboxClosed("sandbox is closed", sandbox_id=self.id)

    async def _call(self, op: str, *args, **kwargs):
        self._check()
        return await self.host.invoke("call", self.id, op, args, kwargs, sandbox_id=self.id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool._busy.discard(self)
        if not self.host.lost:
            with contextlib.suppress(SandboxLost):  # the host took the sandbox with it
                await self.host.invoke("close", self.id, sandbox_id=self.id)

    async def reset(self) -> None:
        await self._call("reset")

    async def ping(self) -> bool:
        try:
            return await self._call("ping")
        except SandboxError:
            return False

    async def __aenter__(self) -> "RaySandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- commands
    async def run(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                  env: dict[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        return await self._call("run", cmd, timeout=timeout, session=session, env=env, cwd=cwd)

    async def run_stream(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                         env: dict[str, str] | None = None, cwd: str | None = None):
        self._check()
        kwargs = {"timeout": timeout, "session": session, "env": env, "cwd": cwd}
        with self.host.translating(self.id):
            refs = self.host.actor.run_stream.options(num_returns="streaming").remote(self.id, cmd, kwargs)
            async for ref in refs:
                status, item = await ref
                if status == "err":
                    raise _unpack_error(item)
                yield item

    async def sessions(self) -> list[str]:
        return await self._call("sessions")

    async def close_session(self, name: str) -> None:
        await self._call("close_session", name)

    # -- files
    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        await self._call("write_file", path, data, mode=mode)

    async def read_file(self, path: str) -> bytes:
        return await self._call("read_file", path)

    async def exists(self, path: str) -> bool:
        return await self._call("exists", path)

    async def upload(self, local: str | os.PathLike, remote: str) -> None:
        """Copy a local file or directory into the sandbox (whole, in memory: the bytes
        travel to the sandbox's node through Ray)."""
        self._check()
        local = Path(local)
        if local.is_dir():
            data, mode = await asyncio.to_thread(_tar_dir, local), 0
        else:
            data, mode = await asyncio.to_thread(local.read_bytes), local.stat().st_mode & 0o777
        await self.host.invoke("upload", self.id, data, local.is_dir(), mode, remote, sandbox_id=self.id)

    async def download(self, remote: str, local: str | os.PathLike) -> None:
        """Copy a sandbox file or directory here; a directory arrives with the safe
        unpacking rules of ``AsyncSandbox.download``."""
        self._check()
        local = Path(local)
        is_dir, data = await self.host.invoke("download", self.id, remote, sandbox_id=self.id)
        if is_dir:
            from .layers import unpack_plain_tar

            await asyncio.to_thread(unpack_plain_tar, data, local)
            return
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:6]}.part")
        try:
            await asyncio.to_thread(tmp.write_bytes, data)
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    # -- snapshots
    async def snapshot(self) -> Snapshot:
        """Snapshot on the node, then fetch the layers this process's store lacks, so the
        result can start a sandbox on any node (``path`` is the local tarball)."""
        self._check()
        snap = await self.host.invoke("snapshot", self.id, sandbox_id=self.id)
        store = SnapshotStore(state_home())
        missing = _missing_layers(store, snap.layers)
        if missing:
            with self.host.translating(self.id):
                blobs = await self.host.actor.export_layers.remote(missing)
            await asyncio.to_thread(_import_layers, store, blobs)
        return dataclasses.replace(snap, path=store.tarball(snap.digest))

    async def restore(self, snapshot: "Snapshot | str | Path") -> None:
        self._check()
        digest = await _ship(self.host, snapshot, sandbox_id=self.id)
        await self.host.invoke("restore", self.id, digest, sandbox_id=self.id)

    async def fork(self, n: int = 1) -> list["RaySandbox"]:
        """``n`` copy-on-write children, on this sandbox's node (they share its layers)."""
        if not isinstance(n, int) or n < 1:
            raise SpecError("n", "must be a positive integer")
        self._check()
        ids = await self.host.invoke("fork", self.id, n, sandbox_id=self.id)
        return [RaySandbox(self.spec, sid, self.host) for sid in ids]

    def __repr__(self) -> str:
        state = "closed" if self._closed else "alive" if self.alive else "lost"
        return f"<RaySandbox {self.id} node={self.node_id[:8]} image={self.spec.image!r} {state}>"


async def _ship(host: HostRef, ref: Any, *, sandbox_id: str | None = None) -> str:
    """Make a snapshot's layer chain present on a host's node; return its digest."""
    store = SnapshotStore(state_home())
    snap = await asyncio.to_thread(store.load, ref)
    missing = await host.raw("missing_layers", list(snap.layers))
    if missing:
        blobs = {d: store.tarball(d).read_bytes() for d in missing}
        await host.invoke("import_layers", blobs, sandbox_id=sandbox_id)
    return snap.digest


# ===================================================================== pools
def _split(size: int, weights: list[float]) -> list[int]:
    """``size`` in integer shares proportional to ``weights`` (largest remainder)."""
    total = sum(weights)
    exact = [size * w / total for w in weights]
    shares = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - shares[i], reverse=True)[:size - sum(shares)]:
        shares[i] += 1
    return shares


class AsyncRaySandboxPool:
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
        self._busy: set[RaySandbox] = set()
        self._shares: dict[str, int] = {}  # node id -> warm sandboxes it was asked to keep
        self._stats: dict[str, dict] = {}  # node id -> last pool stats from its host
        self._lost_replaced = 0
        self._closed = False
        self._task: asyncio.Task | None = None

    async def start(self, *, wait: bool = True) -> "AsyncRaySandboxPool":
        await self._rebalance(wait=wait)
        self._task = asyncio.create_task(self._maintain())
        return self

    @property
    def idle(self) -> int:
        hosts = _cluster().hosts  # a lost host's last numbers are no longer true
        return sum(s["idle"] for node_id, s in self._stats.items() if node_id in hosts)

    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def replaced(self) -> int:
        return self._lost_replaced + sum(s["replaced"] for s in self._stats.values())

    async def _rebalance(self, *, wait: bool = False) -> None:
        """Give every host its share; a host that fails here is dropped and we retry."""
        cluster = _cluster()
        while not self._closed:
            hosts = sorted(await cluster.refresh(force=True), key=lambda h: h.node_id)
            if not hosts:
                raise SandboxError("no sandbox host is available in the Ray cluster")
            shares = dict(zip((h.node_id for h in hosts), _split(self.size, [h.cpus for h in hosts])))
            results = await asyncio.gather(*(
                h.invoke("pool_resize", self.pool_id, _local_spec(self.spec), shares[h.node_id],
                         self.health_interval_s, wait) for h in hosts), return_exceptions=True)
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
                hosts = await _cluster().refresh()
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
        cluster = _cluster()
        for _ in range(3):
            hosts = await cluster.refresh()
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
                sb = RaySandbox(self.spec, sid, host, pool=self)
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
        hosts = [h for h in _cluster().hosts.values() if h.node_id in self._shares and not h.lost]
        await asyncio.gather(*(h.raw("pool_close", self.pool_id) for h in hosts), return_exceptions=True)
        self._stats.clear()

    async def __aenter__(self) -> "AsyncRaySandboxPool":
        if self._task is None:
            await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


if __name__ == "__main__":
    # `python -m rockroll.sandbox.raycluster start --head --node-ip-address=127.0.0.1 ...`
    import sys

    keep_loopback()
    sys.argv[0] = "ray"
    importlib.import_module("ray.scripts.scripts").main()
