"""The client of ``backend="ray"``: a sandbox on some node of a Ray cluster.

``RaySandbox`` forwards every call to the ``SandboxHost`` actor of its node
(``deployment/ray.py``), which drives an ordinary local sandbox there. When the node or
host is lost every call raises ``SandboxLost``; ``close()`` still succeeds (there is
nothing left to close).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, AsyncIterable, AsyncIterator, Callable, Sequence

from ..base import AsyncSandbox, once, terminal_request
from ..deployment.ray import (HostRef, cluster, import_layers, local_spec, missing_layers, model_token, ship,
                              this_node, unpack_error)
from ..errors import SandboxError, SandboxLost, SpecError
from ..home import state_home
from ..spec import CommandResult, SandboxSpec, Snapshot
from ..storage.snapshots import SnapshotStore
from ..terminal import AsyncTerminal


class RayTerminal(AsyncTerminal):
    """A terminal held by a node's host actor (``SandboxHost.terminal_*``)."""

    def __init__(self, host: HostRef, key: str, sandbox_id: str):
        super().__init__(sandbox_id)
        self.host, self.key = host, key

    async def _recv(self) -> bytes | None:
        item = await self.host.invoke("terminal_recv", self.key, sandbox_id=self.sandbox_id)
        if isinstance(item, tuple):  # (None, exit code): the end
            self.exit_code = item[1]
            return None
        return item

    async def _op(self, op: str, *args) -> None:
        self._ensure_open()
        await self.host.invoke("terminal_call", self.key, op, args, sandbox_id=self.sandbox_id)

    async def write(self, data: str | bytes) -> None:
        await self._op("write", data)

    async def resize(self, rows: int, cols: int) -> None:
        await self._op("resize", rows, cols)

    async def signal(self, sig: int = 2) -> None:
        await self._op("signal", int(sig))

    async def _close(self) -> None:
        if not self.host.lost:
            with contextlib.suppress(SandboxError):
                await self.host.invoke("terminal_call", self.key, "close", (), sandbox_id=self.sandbox_id)


class RaySandbox(AsyncSandbox):
    """A sandbox held by a host actor on a Ray node. See ``AsyncSandbox`` for each
    method's contract. File transfers travel whole (in memory) through Ray."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str, host: HostRef,
                 on_close: Callable[["RaySandbox"], None] | None = None):
        super().__init__(spec, sandbox_id)
        self.host, self._on_close = host, on_close
        self.created = time.time()

    @property
    def node_id(self) -> str:
        return self.host.node_id

    @classmethod
    async def open(cls, spec: SandboxSpec, *, snapshot: Any = None) -> "RaySandbox":
        """A new sandbox on the least loaded host."""
        hosts = cluster()
        host = await hosts.pick()
        with hosts.placing(host):
            digest = await ship(host, snapshot) if snapshot is not None else None
            sid = await host.invoke("create", local_spec(spec), digest, model_token(spec))
        return cls(spec, sid, host)

    @property
    def alive(self) -> bool:
        return not self._closed and not self.host.lost

    async def _call(self, op: str, *args, **kwargs):
        self._ensure_open()
        return await self.host.invoke("call", self.id, op, args, kwargs, sandbox_id=self.id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        if not self.host.lost:
            try:
                await self.host.invoke("close", self.id, sandbox_id=self.id)
            except SandboxLost:
                pass  # the host took the sandbox with it

    async def reset(self) -> None:
        await self._call("reset")

    def network_stats(self) -> dict | None:
        """The counters kept on the sandbox's node, asked of its host (a blocking Ray call,
        seconds at most); None once closed or when the node is gone (its counts went with it)."""
        if not self.alive:
            return None
        try:
            return self.host.invoke_blocking("network_stats", self.id, sandbox_id=self.id)
        except SandboxLost:
            return None

    async def egress_log(self, since: int | None = None) -> list[dict]:
        """Kept by the gateway on the sandbox's node, asked of its host."""
        return await self._call("egress_log", since)

    async def expose(self, port: int) -> tuple[str, int]:
        """Exposed by the node's host, on that node's 127.0.0.1: an address only a process
        on the same node can use, so from another node this refuses rather than hand back
        an address that leads nowhere (or to some other service on this machine)."""
        self._ensure_open()
        if await asyncio.to_thread(this_node) != self.node_id:
            raise SandboxError(f"expose() through Ray answers an address on the sandbox's node "
                               f"({self.node_id[:8]}), not this one: call it from a process on that node",
                               sandbox_id=self.id)
        host, host_port = await self._call("expose", port)
        return host, host_port

    async def ping(self) -> bool:
        try:
            return await self._call("ping")
        except SandboxError:
            return False

    # -- commands
    async def run(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                  env: dict[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        return await self._call("run", cmd, timeout=timeout, session=session, env=env, cwd=cwd)

    async def run_stream(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                         env: dict[str, str] | None = None, cwd: str | None = None):
        self._ensure_open()
        kwargs = {"timeout": timeout, "session": session, "env": env, "cwd": cwd}
        with self.host.translating(self.id):
            refs = self.host.actor.run_stream.options(num_returns="streaming").remote(self.id, cmd, kwargs)
            async for ref in refs:
                status, item = await ref
                if status == "err":
                    raise unpack_error(item)
                yield item

    async def open_terminal(self, cmd: str | Sequence[str] | None = None, *, rows: int = 24, cols: int = 80,
                            env: dict[str, str] | None = None, cwd: str | None = None,
                            idle_timeout: float | None = 600.0) -> "RayTerminal":
        """Opened by the node's host actor; each chunk of output is one call to it."""
        self._ensure_open()
        terminal_request(cmd, rows, cols, env, cwd, idle_timeout)  # checked here, as on every backend
        kwargs = {"rows": rows, "cols": cols, "env": env, "cwd": cwd, "idle_timeout": idle_timeout}
        key = await self.host.invoke("terminal_open", self.id, {"cmd": cmd, **kwargs}, sandbox_id=self.id)
        return RayTerminal(self.host, key, self.id)

    async def sessions(self) -> list[str]:
        return await self._call("sessions")

    async def close_session(self, name: str) -> None:
        await self._call("close_session", name)

    # -- files
    async def read_file(self, path: str) -> bytes:
        return await self._call("read_file", path)

    async def stat(self, path: str) -> str | None:
        return await self._call("stat", path)

    async def write_stream(self, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644,
                           tar: bool = False) -> int:
        self._ensure_open()
        data = b"".join([chunk async for chunk in chunks])
        return await self.host.invoke("write_bytes", self.id, path, data, mode, tar, sandbox_id=self.id)

    async def read_stream(self, path: str) -> tuple[str, AsyncIterator[bytes]]:
        self._ensure_open()
        kind, data = await self.host.invoke("read_bytes", self.id, path, sandbox_id=self.id)
        return kind, once(data)

    # -- snapshots
    async def snapshot(self) -> Snapshot:
        """Snapshot on the node, then fetch the layers this process's store lacks, so the
        result can start a sandbox on any node (``path`` is the local tarball)."""
        self._ensure_open()
        snap = await self.host.invoke("snapshot", self.id, sandbox_id=self.id)
        store = SnapshotStore(state_home())
        missing = missing_layers(store, snap.layers)
        if missing:
            with self.host.translating(self.id):
                blobs = await self.host.actor.export_layers.remote(missing)
            await asyncio.to_thread(import_layers, store, blobs)
        return dataclasses.replace(snap, path=store.tarball(snap.digest))

    async def restore(self, snapshot: Snapshot | str | Path) -> None:
        self._ensure_open()
        digest = await ship(self.host, snapshot, sandbox_id=self.id)
        await self.host.invoke("restore", self.id, digest, sandbox_id=self.id)

    async def fork(self, n: int = 1) -> list["RaySandbox"]:
        """``n`` copy-on-write children, on this sandbox's node (they share its layers)."""
        if not isinstance(n, int) or n < 1:
            raise SpecError("n", "must be a positive integer")
        self._ensure_open()
        ids = await self.host.invoke("fork", self.id, n, sandbox_id=self.id)
        return [RaySandbox(self.spec, sid, self.host) for sid in ids]

    def _describe(self) -> str:
        state = "closed" if self._closed else "alive" if self.alive else "lost"
        return f"node={self.node_id[:8]} {state}"

