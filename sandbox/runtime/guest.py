"""The client of our guest (``guest/``, pid 1 of a sandbox): a sandbox of the local and docker backends.

``GuestSandbox`` speaks the guest protocol over a pipe pair, with many requests in flight
at once (one per session), and leaves starting and stopping to a deployment
(``deployment/local.py``, ``deployment/docker.py``); the factory says which.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import os
import posixpath
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterable, AsyncIterator, Sequence

from ..base import CHUNK, AsyncSandbox, once, terminal_request
from ..deployment.base import Deployment
from ..deployment.reaper import current_run
from ..errors import (GuestDied, IsolationUnavailable, SandboxClosed, SandboxError, SandboxFileError,
                      SandboxFileNotFound, SandboxStartError, SessionError, SnapshotError, SpecError,
                      StorageLimitError, TerminalError)
from ..lifecycle import install_exit_handlers
from ..protocol.frames import FrameReader, ModelConfig, encode_frame
from ..protocol.tokens import admin_token, current_token
from ..spec import CommandResult, SandboxSpec, Snapshot
from ..storage.layers import pack_layer, read_meta
from ..storage.snapshots import SnapshotStore, copy_tree
from ..terminal import AsyncTerminal
from .model_channel import SANDBOX_PORT, ModelRelay, issue_key, revoke_key, sandbox_env

# Tasks closing sandboxes whose create() was cancelled mid-build (held here: the loop keeps
# only weak references to tasks).
_ORPHAN_CLOSERS: set[asyncio.Task] = set()
# Starting and stopping a sandbox (cgroups, loop devices, mounts, reaping) mostly waits in
# the kernel: on the loop's default executor (cores + 4 threads) a burst of 1,000 creates
# queued behind 6 of them. Threads are started only as needed.
_DEPLOY = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="rockroll-deploy")
_ERRORS = {"SandboxFileError": SandboxFileError, "SessionError": SessionError,
           "IsolationUnavailable": IsolationUnavailable, "TerminalError": TerminalError}


async def _deploying(fn, *args):
    """``fn(*args)`` on the deployment threads (``_DEPLOY``); in this thread once the
    interpreter is exiting (its executors refuse work then, and a teardown that a background
    task, a pool's recycle, still runs must happen rather than fail unseen)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(_DEPLOY, functools.partial(fn, *args))
    except RuntimeError:
        if not (_DEPLOY._shutdown or concurrent.futures.thread._shutdown):  # noqa: SLF001 - the refusals only
            raise
        return fn(*args)


class GuestConnection:
    """Framed, multiplexed requests over the guest's stdin/stdout (asyncio, no threads)."""

    def __init__(self, proc, sandbox_id: str, model_endpoint: str | None = None):
        self.loop = asyncio.get_running_loop()
        self.sandbox_id = sandbox_id
        self.pid = proc.pid
        self.rfd, self.wfd = proc.stdout.fileno(), proc.stdin.fileno()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self.reader = FrameReader()
        self.pending: dict[int, asyncio.Future] = {}
        self.streams: dict[int, asyncio.Queue] = {}  # live output of streamed commands
        self.terminals: dict[int, GuestTerminal] = {}  # open terminals, by number (ours)
        self.terminal_count = 0
        self.events: asyncio.Queue = asyncio.Queue()
        self.out = bytearray()
        self.next_id = 0
        self.dead: str | None = None
        # The sandbox's model connections, piped to the model service (model_channel.py).
        self.relay = ModelRelay(model_endpoint, self._send_frame) if model_endpoint else None
        self.loop.add_reader(self.rfd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data = os.read(self.rfd, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._fail("the sandbox guest exited")
            return
        self.reader.feed(data)
        try:
            frames = list(self.reader.frames())
        except ValueError as e:  # a malformed or oversized frame: the stream cannot be trusted
            self._fail(f"the sandbox guest sent a bad frame ({e})")
            return
        for header, payload in frames:
            if header.get("op", "").startswith("mc_") and "id" not in header:
                if self.relay is not None:
                    self.relay.on_frame(header, payload)
                continue
            if header.get("op", "").startswith("pty_") and "id" not in header:
                term = self.terminals.get(header.get("pty"))
                if term is not None:
                    term.on_frame(header, payload)
                continue
            if "chunk" in header:
                queue = self.streams.get(header["id"])
                if queue is not None:
                    queue.put_nowait((header["chunk"], payload))
                continue
            fut = self.pending.pop(header.get("id"), None) if "id" in header else None
            if fut is None:
                self.events.put_nowait((header, payload))
            elif not fut.done():
                fut.set_result((header, payload))

    def _fail(self, reason: str, error: type[SandboxError] = GuestDied) -> None:
        """Stop listening and fail every request in flight with ``error`` (once)."""
        if self.dead:
            return
        self.dead = reason
        self.detach()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(error(reason, sandbox_id=self.sandbox_id))
        self.pending.clear()
        self.events.put_nowait(({"op": "eof"}, b""))

    def close(self) -> None:
        """We are closing the sandbox: calls still waiting get ``SandboxClosed``."""
        self._fail("sandbox is closed", SandboxClosed)

    def detach(self) -> None:
        for term in list(self.terminals.values()):  # their processes end with the guest
            term.on_frame({"op": "pty_exit", "exit_code": None}, b"")
        if self.relay is not None:  # the sandbox's model connections end with its guest
            self.relay.close()
        for remove, fd in ((self.loop.remove_reader, self.rfd), (self.loop.remove_writer, self.wfd)):
            try:
                remove(fd)
            except (ValueError, OSError):
                pass

    def _send_frame(self, header: dict, payload: bytes) -> None:
        if not self.dead:
            self._write(encode_frame(header, payload))

    def _write(self, data: bytes) -> None:
        if not self.out:
            try:
                n = os.write(self.wfd, data)
            except BlockingIOError:
                n = 0
            except OSError:
                self._fail("the sandbox guest's pipe is closed")
                return
            data = data[n:]
            if not data:
                return
            self.loop.add_writer(self.wfd, self._on_writable)
        self.out += data

    def _on_writable(self) -> None:
        try:
            n = os.write(self.wfd, self.out)
        except BlockingIOError:
            return
        except OSError:
            self._fail("the sandbox guest's pipe is closed")
            return
        del self.out[:n]
        if not self.out:
            self.loop.remove_writer(self.wfd)

    async def request(self, header: dict, payload: bytes = b"", *, stream: asyncio.Queue | None = None
                      ) -> tuple[dict, bytes]:
        """Send one request and wait for its reply; ``stream`` receives live output chunks."""
        if self.dead:
            raise GuestDied(self.dead, sandbox_id=self.sandbox_id)
        self.next_id += 1
        req_id = self.next_id
        fut = self.loop.create_future()
        self.pending[req_id] = fut
        if stream is not None:
            self.streams[req_id] = stream
        self._write(encode_frame({**header, "id": req_id}, payload))
        try:
            reply, body = await fut
        except asyncio.CancelledError:
            if header.get("op") == "run":  # nobody waits for it any more: kill its process group
                self.cancel(req_id)
            raise
        finally:
            self.streams.pop(req_id, None)
        if not reply.get("ok"):
            cls = _ERRORS.get(reply.get("error"), SandboxError)
            if cls is SandboxFileError and reply.get("errno") == errno.ENOENT:
                cls = SandboxFileNotFound
            raise cls(reply.get("message", "guest error"), sandbox_id=self.sandbox_id)
        return reply, body

    def send(self, header: dict, payload: bytes = b"") -> None:
        """A frame that has no reply (a terminal's ``pty_ack``)."""
        self._send_frame(header, payload)

    def cancel(self, req_id: int) -> None:
        """Ask the guest to kill request ``req_id``'s command (fire and forget: its reply, and
        the cancelled command's, find their futures done or gone and are dropped)."""
        if self.dead:
            return
        self.next_id += 1
        fut = self.pending[self.next_id] = self.loop.create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it
        self._write(encode_frame({"op": "cancel", "target": req_id, "id": self.next_id}))

    async def handshake(self, timeout: float = 30.0) -> int:
        """Wait for the guest to report its init pid and readiness; return the init pid.

        A guest that is one process is init itself (``ready`` says ``one_process``). Else
        the two frames come from two processes sharing one pipe (the outer guest reports the
        pid it forked, init reports ready), so on a loaded host "ready" can come first."""
        init_pid, ready = None, False
        deadline = time.monotonic() + timeout
        while init_pid is None or not ready:
            try:
                header, _ = await asyncio.wait_for(self.events.get(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise SandboxStartError("the sandbox guest did not start in time",
                                        sandbox_id=self.sandbox_id) from None
            op = header.get("op")
            if op == "spawned":
                init_pid = header["init_pid"]
            elif op == "ready":
                if not header.get("ok"):
                    cls = _ERRORS.get(header.get("error"), SandboxStartError)
                    raise cls(header.get("message", "start failed"), sandbox_id=self.sandbox_id)
                ready = True
                if header.get("one_process"):
                    init_pid = self.pid
            elif op == "eof":
                raise SandboxStartError(f"the sandbox guest exited during start-up ({self.dead})",
                                        sandbox_id=self.sandbox_id)
        return init_pid


class GuestTerminal(AsyncTerminal):
    """A terminal of a guest (``guest/terminals.py``): its output arrives as ``pty_out``
    frames, at most ``PTY_WINDOW`` bytes ahead of what ``_recv`` handed on (each chunk is
    acknowledged as it is consumed)."""

    def __init__(self, conn: GuestConnection, tid: int):
        super().__init__(conn.sandbox_id)
        self.conn, self.tid = conn, tid
        self.queue: asyncio.Queue = asyncio.Queue()
        conn.terminals[tid] = self

    def on_frame(self, header: dict, payload: bytes) -> None:
        if header["op"] == "pty_out":
            self.queue.put_nowait(payload)
        elif header["op"] == "pty_exit":
            self.exit_code = header.get("exit_code")
            self.queue.put_nowait(None)
            self.conn.terminals.pop(self.tid, None)

    async def _recv(self) -> bytes | None:
        data = await self.queue.get()
        if data is None:
            self.queue.put_nowait(None)  # the end stays the end
        else:
            self.conn.send({"op": "pty_ack", "pty": self.tid, "n": len(data)})
        return data

    async def _call(self, header: dict, payload: bytes = b"") -> None:
        self._ensure_open()
        if self.exited:
            raise TerminalError(f"the terminal's process ended (exit code {self.exit_code})",
                                sandbox_id=self.sandbox_id)
        await self.conn.request({**header, "pty": self.tid}, payload)

    async def write(self, data: str | bytes) -> None:
        await self._call({"op": "pty_write"}, data.encode() if isinstance(data, str) else bytes(data))

    async def resize(self, rows: int, cols: int) -> None:
        terminal_request(None, rows, cols, None, None, None)  # the size's checks
        await self._call({"op": "pty_resize", "rows": rows, "cols": cols})

    async def signal(self, sig: int = signal.SIGINT) -> None:
        await self._call({"op": "pty_signal", "signal": int(sig)})

    async def _close(self) -> None:
        self.conn.terminals.pop(self.tid, None)
        if not self.conn.dead and not self.exited:
            with contextlib.suppress(SandboxError):
                await self.conn.request({"op": "pty_close", "pty": self.tid})


class GuestSandbox(AsyncSandbox):
    """A sandbox whose guest runs on this host, started by a deployment (local
    namespaces or a docker container). A guest crash raises ``GuestDied``; ``reset()``
    recovers. See ``AsyncSandbox`` for each method's contract."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str, deployment: type):
        super().__init__(spec, sandbox_id)
        self.run_id = current_run().run_id
        self._deployment = deployment
        self._deploy: Deployment | None = None
        self._conn: GuestConnection | None = None
        self._layers: tuple[str, ...] = ()  # snapshot chain mounted above the image
        self._oom_seen = 0
        self._lock = asyncio.Lock()  # serializes restarts against each other
        self.model_key: str | None = None  # this sandbox's key at spec.model_endpoint
        # the admin token that issued it: revokes it, and issues its forks' keys
        self._model_token = current_token() if spec.model_endpoint else None
        self.created = time.time()
        self.store = SnapshotStore(current_run().home)

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(cls, spec: SandboxSpec, *, deployment: type, snapshot: Any = None) -> "GuestSandbox":
        """Start a sandbox of ``spec`` on ``deployment`` (a ``Deployment`` class)."""
        install_exit_handlers()  # SIGTERM -> normal exit -> atexit closes every sandbox
        self = cls(spec, "sb-" + uuid.uuid4().hex[:10], deployment)
        # The build runs in threads, which a cancellation cannot stop: a thread would finish
        # a sandbox nobody holds. So the build is shielded, and a cancelled caller leaves a
        # task behind that closes the sandbox once it is built.
        build = asyncio.ensure_future(self._build(snapshot))
        try:
            await asyncio.shield(build)
        except asyncio.CancelledError:
            closer = asyncio.ensure_future(self._close_when_built(build))
            _ORPHAN_CLOSERS.add(closer)
            closer.add_done_callback(_ORPHAN_CLOSERS.discard)
            raise
        return self

    async def _build(self, snapshot: Any) -> None:
        try:
            if self.spec.model_endpoint:
                self.model_key = await asyncio.to_thread(issue_key, self.spec.model_endpoint, self.id,
                                                        self._model_token)
            sessions: dict[str, str] = {}
            if snapshot is not None:
                snap = await asyncio.to_thread(self.store.load, snapshot)
                self._check_image(snap)
                self._layers = snap.layers
                sessions = await asyncio.to_thread(self._sessions_of, snap)
            await self._start(sessions)
        except BaseException:
            await self._teardown()
            raise

    async def _close_when_built(self, build: asyncio.Future) -> None:
        with contextlib.suppress(BaseException):
            await build
        await self.close()

    async def _start(self, sessions: dict[str, str]) -> None:
        layer_dirs = [self.store.layer_dir(d) for d in reversed(self._layers)]
        model = ModelConfig(SANDBOX_PORT, sandbox_env(self.model_key)) if self.model_key else None
        proc = await _deploying(self._spawn, current_run(), layer_dirs, sessions, model)
        self._conn = GuestConnection(proc, self.id, self.spec.model_endpoint)
        init_pid = await self._conn.handshake()
        self._deploy.record(init_pid)
        self._oom_seen = self._deploy.oom_kills()

    def _spawn(self, run, layer_dirs: list, sessions: dict[str, str], model: ModelConfig | None):
        """On a deployment thread: the deployment itself on the first start (it touches the
        filesystem and cgroups: off the loop), then its guest. One trip to the threads a
        create, not two: each is a handoff of the GIL, and the futex calls of those
        handoffs were 4-6 % of a burst's CPU."""
        if self._deploy is None:
            self._deploy = self._deployment(self.spec, self.id, run)
        return self._deploy.spawn(layer_dirs, sessions, model)

    async def _restart(self, layers: tuple[str, ...], sessions: dict[str, str]) -> None:
        self._ensure_open()
        async with self._lock:
            if self._conn:
                self._conn.detach()
            self._deploy.stop_guest()
            self._layers = layers
            await self._start(sessions)

    async def reset(self) -> None:
        await self._restart((), {})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._teardown()

    async def _teardown(self) -> None:
        if self._conn:
            self._conn.close()
        if self._deploy:
            await _deploying(self._deploy.close)
        if self.model_key:  # after the guest is gone: nothing can call with it any more
            key, self.model_key = self.model_key, None
            await asyncio.to_thread(revoke_key, self.spec.model_endpoint, key, self.id, self._model_token)

    async def _request(self, header: dict, payload: bytes = b"", *, stream: asyncio.Queue | None = None
                       ) -> tuple[dict, bytes]:
        self._ensure_open()
        return await self._conn.request(header, payload, stream=stream)

    @property
    def alive(self) -> bool:
        return not self._closed and self._conn is not None and not self._conn.dead

    async def ping(self) -> bool:
        try:
            await asyncio.wait_for(self._request({"op": "ping"}), 5.0)
            return True
        except (SandboxError, asyncio.TimeoutError):
            return False

    # ----------------------------------------------------------------- commands
    async def run(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                  env: dict[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        return await self._run(cmd, timeout, session, env, cwd, None)

    async def run_stream(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                         env: dict[str, str] | None = None, cwd: str | None = None):
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self._run(cmd, timeout, session, env, cwd, queue))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    kind, data = getter.result()
                    yield ("stdout" if kind == "out" else "stderr"), data.decode(errors="replace")
                    continue
                getter.cancel()
                while not queue.empty():
                    kind, data = queue.get_nowait()
                    yield ("stdout" if kind == "out" else "stderr"), data.decode(errors="replace")
                yield task.result()
                return
        finally:
            if not task.done():
                task.cancel()

    async def _run(self, cmd, timeout, session, env, cwd, stream) -> CommandResult:
        timeout = self.spec.timeout_s if timeout is None else timeout
        if env and not all(isinstance(k, str) and k.isidentifier() for k in env):
            raise SpecError("env", "variable names must be identifiers")
        header, body = await self._request({
            "op": "run", "cmd": cmd, "session": session or "default", "timeout": timeout,
            "env": env or {}, "cwd": self._path(cwd) if cwd else None,
            "max_output": self.spec.max_output_bytes, "stream": stream is not None}, stream=stream)
        code = header["exit_code"]
        oom = False
        if code == 137 and not header["timed_out"]:
            kills = await asyncio.to_thread(self._deploy.oom_kills)
            oom, self._oom_seen = kills > self._oom_seen, kills
        nout = header["nout"]
        return CommandResult(
            exit_code=code, stdout=body[:nout].decode(errors="replace"),
            stderr=body[nout:].decode(errors="replace"), duration_s=header["duration_s"],
            timed_out=header["timed_out"], truncated=header["truncated"], oom_killed=oom)

    async def open_terminal(self, cmd: str | Sequence[str] | None = None, *, rows: int = 24, cols: int = 80,
                            env: dict[str, str] | None = None, cwd: str | None = None,
                            idle_timeout: float | None = 600.0) -> GuestTerminal:
        req = terminal_request(cmd, rows, cols, env, self._path(cwd) if cwd else None, idle_timeout)
        self._ensure_open()
        conn = self._conn
        conn.terminal_count += 1
        term = GuestTerminal(conn, conn.terminal_count)  # listening before its first output comes
        try:
            await conn.request({"op": "pty_open", "pty": term.tid, **req})
        except BaseException:
            conn.terminals.pop(term.tid, None)
            raise
        return term

    async def sessions(self) -> list[str]:
        header, _ = await self._request({"op": "ping"})
        return header["sessions"]

    async def close_session(self, name: str) -> None:
        await self._request({"op": "close_session", "session": name})

    # ----------------------------------------------------------------- files
    def _path(self, path: str) -> str:
        if not isinstance(path, str) or not path or "\0" in path:
            raise SandboxFileError(f"bad path {path!r}", sandbox_id=self.id)
        return posixpath.normpath(posixpath.join(self.spec.workdir, path))

    async def read_file(self, path: str) -> bytes:
        target, chunks, offset = self._path(path), [], 0
        limit = self.store.limits.max_layer_bytes  # a sparse 1 TB file must not fill host memory
        while True:
            header, body = await self._request({"op": "read", "path": target, "offset": offset,
                                                "length": CHUNK})
            if max(header["size"], offset + len(body)) > limit:
                raise StorageLimitError("max_layer_bytes", limit, f"{path} is {header['size']} bytes",
                                        sandbox_id=self.id)
            chunks.append(body)
            offset += len(body)
            if not body or offset >= header["size"]:
                return b"".join(chunks)

    async def stat(self, path: str) -> str | None:
        header, _ = await self._request({"op": "stat", "path": self._path(path)})
        return header["type"] if header["exists"] else None

    async def write_stream(self, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644,
                           tar: bool = False) -> int:
        """Each ``CHUNK`` bytes go as one guest request as they arrive (a tar goes whole:
        the guest unpacks it from one frame)."""
        target = self._path(path)
        if tar:
            data = b"".join([chunk async for chunk in chunks])
            await self._request({"op": "tar_in", "path": target}, data)
            return len(data)
        buf, offset = bytearray(), 0

        async def flush(data: bytes) -> None:
            nonlocal offset
            await self._request({"op": "write", "path": target, "mode": mode, "offset": offset,
                                 "truncate": offset == 0}, data)
            offset += len(data)

        async for chunk in chunks:
            buf += chunk
            while len(buf) >= CHUNK:
                await flush(bytes(buf[:CHUNK]))
                del buf[:CHUNK]
        if buf or offset == 0:
            await flush(bytes(buf))
        return offset

    async def read_stream(self, path: str) -> tuple[str, AsyncIterator[bytes]]:
        target = self._path(path)
        header, _ = await self._request({"op": "stat", "path": target})
        if not header["exists"]:
            raise SandboxFileNotFound(f"no such file: {path}", sandbox_id=self.id)
        if header["type"] == "dir":
            _, body = await self._request({"op": "tar_out", "path": target})
            return "dir", once(body)
        first, body = await self._request({"op": "read", "path": target, "offset": 0, "length": CHUNK})

        async def chunks() -> AsyncIterator[bytes]:
            h, data, offset = first, body, 0
            while True:
                if data:
                    yield data
                offset += len(data)
                if not data or offset >= h["size"]:
                    return
                h, data = await self._request({"op": "read", "path": target, "offset": offset, "length": CHUNK})

        return "file", chunks()

    # ----------------------------------------------------------------- snapshots
    async def snapshot(self) -> Snapshot:
        """Save files (the overlay upper layer) and session state as a content-addressed
        zstd tarball on top of the current chain. Processes are frozen while packing."""
        names = await self.sessions()
        states = {}
        for name in names:
            header, _ = await self._request({"op": "dump", "session": name})
            states[name] = header["state"]
        meta = {"sessions": states, "parents": list(self._layers), "image": self.spec.image,
                "workdir": self.spec.workdir, "format": 1}
        # Freeze only while copying the upper (a cheap local copy); pack the portable
        # tarball from the copy while the sandbox runs on, then keep the copy as the
        # unpacked layer that restore() and fork() mount.
        # The copy and the tarball are not metered (the sandbox wrote them already); a disk
        # below its reserve refuses the snapshot before either starts.
        try:
            self.store.limits.check_free(self.store.tar_root.parent, 0, f"snapshot of {self.id}")
        except StorageLimitError as e:
            e.sandbox_id = self.id  # as every error of a sandbox carries its id
            raise
        staged = self.store.staging_dir()
        await asyncio.to_thread(self._deploy.freeze)
        try:
            await asyncio.to_thread(copy_tree, self._deploy.upper, staged)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staged, True)
            raise
        finally:
            await asyncio.to_thread(self._deploy.thaw)
        try:
            info = await asyncio.to_thread(pack_layer, staged, self.store.tar_root, meta=meta)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staged, True)
            raise
        await asyncio.to_thread(self.store.adopt_layer, info.digest, staged)
        return Snapshot(id=info.digest.split(":")[1][:12], digest=info.digest, size=info.size,
                        layers=self._layers + (info.digest,), image=self.spec.image, path=info.path)

    def _check_image(self, snap: Snapshot) -> None:
        if snap.image != self.spec.image:
            raise SnapshotError(f"snapshot {snap.id} was taken on image {snap.image!r}, "
                                f"this sandbox runs {self.spec.image!r}", sandbox_id=self.id)

    def _sessions_of(self, snap: Snapshot) -> dict[str, str]:
        return dict(read_meta(self.store.tarball(snap.digest)).get("sessions", {}))

    async def restore(self, snapshot: Snapshot | str | Path) -> None:
        self._ensure_open()
        try:
            snap = await asyncio.to_thread(self.store.load, snapshot)
        except SandboxError as e:
            e.sandbox_id = e.sandbox_id or self.id
            raise
        self._check_image(snap)
        sessions = await asyncio.to_thread(self._sessions_of, snap)
        await self._restart(snap.layers, sessions)

    async def fork(self, n: int = 1) -> list["GuestSandbox"]:
        """``n`` new sandboxes sharing this one's current state copy-on-write (the
        snapshot is their common lower layer)."""
        if not isinstance(n, int) or n < 1:
            raise SpecError("n", "must be a positive integer")
        snap = await self.snapshot()
        with admin_token(self._model_token):  # the children's keys come from the same service
            results = await asyncio.gather(*(type(self).open(self.spec, deployment=self._deployment, snapshot=snap)
                                             for _ in range(n)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(r.close() for r in results if isinstance(r, AsyncSandbox)))
            raise failed[0]
        return list(results)

    def usage(self) -> dict[str, float] | None:
        return self._deploy.usage() if self._deploy else None

    def network_stats(self) -> dict | None:
        stats = getattr(self._deploy, "network_stats", None)
        return stats() if stats else None

    async def egress_log(self, since: int | None = None) -> list[dict]:
        _check_since(since)
        read = getattr(self._deploy, "egress_log", None)
        return read(since) if read else []

    async def expose(self, port: int) -> tuple[str, int]:
        self._ensure_open()
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise SpecError("port", f"not a port number (1-65535): {port!r}")
        if not hasattr(self._deploy, "expose"):
            return await super().expose(port)
        return await asyncio.to_thread(self._deploy.expose, port)


def _check_since(since) -> None:
    if since is not None and (isinstance(since, bool) or not isinstance(since, int) or since < 0):
        raise SpecError("since", f"must be a record's seq (an integer >= 0) or None, not {since!r}")
