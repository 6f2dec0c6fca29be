"""The ``remote`` backend: a sandbox held by a ``rockroll serve`` service, driven over HTTP.

``RemoteSandbox`` is an ``AsyncSandbox`` (same methods, signatures and errors), so
``open_sandbox(SandboxSpec(backend="remote"))`` and the sync ``Sandbox`` work unchanged.
The service is found from ``configure(url, token)`` or, by default, ``$ROCKROLL_URL``
(``http://127.0.0.1:8765``) and ``$ROCKROLL_TOKEN``.

Creates issued together (one ``asyncio.gather``) go out as one ``POST /v1/sandboxes/batch``
(``batch.Coalescer``); each call still returns its own sandbox or raises its own error.
One ``httpx.AsyncClient`` per event loop (HTTP/1.1 keep-alive) carries every sandbox's
calls. Idempotent calls (GET, PUT, DELETE) are retried with backoff on connection errors
and on an untyped 502/503 (a proxy, a restarting server); other calls only when the
connection was refused, i.e. nothing was sent. Errors come back as the same exception
classes a local sandbox raises (``wire.error_from_body``).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterable, AsyncIterator, Sequence

import httpx

from ..base import CHUNK, AsyncSandbox, file_chunks, terminal_request
from ..errors import (GuestDied, SandboxClosed, SandboxError, SandboxLost, SandboxNotFound,
                      ServiceUnreachable, SnapshotError, SpecError, StorageLimitError, TerminalError)
from ..terminal import AsyncTerminal
from ..protocol.wire import (API, MAX_BATCH, AuthError, BatchItemOut, ResultOut, SandboxOut, SnapshotOut,
                           error_from_body)
from ..spec import CommandResult, SandboxSpec, Snapshot
from ..storage.limits import StorageLimits
from .batch import Coalescer, Pending
from ..protocol.tokens import TOKEN_HEADER, current_token

DEFAULT_URL = "http://127.0.0.1:8765"
RETRIES = 4            # attempts after the first, for calls that may be repeated
BACKOFF_S = 0.1        # doubled after each failed attempt
IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE"}

__all__ = ["AuthError", "RemoteSandbox", "configure"]


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str | None
    source: str = "url="  # where the url came from, for the error when nothing answers there


_configured: Endpoint | None = None
_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list]" = weakref.WeakKeyDictionary()
# The loop's connections are spread over SHARDS clients of SHARD_CONNECTIONS each (512 in
# all), taken in turn: httpcore's pool scans every connection of a client on every request
# and response, so one client of 512 costs O(connections) per request, and a burst of
# 1,000 creates spent most of its CPU there (11 of 17 s for 200, measured with cProfile).
SHARDS, SHARD_CONNECTIONS = 16, 32


def configure(url: str | None = None, token: str | None = None) -> None:
    """Point every later ``RemoteSandbox`` at a service (overrides the environment)."""
    global _configured
    _configured = Endpoint(url.rstrip("/"), token, "configure()") if url else None


def endpoint() -> Endpoint:
    if _configured is not None:
        return _configured
    url = os.environ.get("ROCKROLL_URL")
    return Endpoint((url or DEFAULT_URL).rstrip("/"), os.environ.get("ROCKROLL_TOKEN"),
                    "$ROCKROLL_URL" if url else "the default: ROCKROLL_URL is not set and configure() was not called")


def _client() -> httpx.AsyncClient:
    """One of the event loop's shared clients, in turn: connections are pooled across
    every sandbox. No read timeout: a command may legitimately run for hours (its own
    timeout bounds it)."""
    loop = asyncio.get_running_loop()
    shards = _clients.get(loop)
    if shards is None:
        # the clients (made on first use, sharing one TLS context: loading the CA bundle
        # takes 36 ms), the TLS context, the turn
        shards = _clients[loop] = [None] * SHARDS + [httpx.create_ssl_context(), 0]
    i = shards[-1] = (shards[-1] + 1) % SHARDS
    client = shards[i]
    if client is None or client.is_closed:
        client = shards[i] = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0), verify=shards[SHARDS],
            limits=httpx.Limits(max_connections=SHARD_CONNECTIONS, max_keepalive_connections=SHARD_CONNECTIONS // 2))
    return client


class RemoteSandbox(AsyncSandbox):
    """A sandbox held by a ``rockroll serve`` service. See ``AsyncSandbox`` for the
    contract of each method: they are the same, over HTTP."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str, ep: Endpoint):
        super().__init__(spec, sandbox_id)
        self._ep = ep
        self._alive = True

    # ----------------------------------------------------------------- plumbing
    async def _call(self, method: str, path: str, *, json_body: Any = None, params: dict | None = None,
                    content=None, stream: bool = False) -> httpx.Response:
        return await _request(self._ep, method, path, json_body=json_body, params=params, content=content,
                              stream=stream, sandbox_id=self.id, on_error=self._on_error)

    def _on_error(self, exc: SandboxError) -> None:
        """Keep ``alive`` as a local sandbox would: false once the guest died or it is gone."""
        if isinstance(exc, (GuestDied, SandboxClosed, SandboxNotFound)):
            self._alive = False

    def _url(self, suffix: str = "") -> str:
        return f"{API}/sandboxes/{self.id}{suffix}"

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(cls, spec: SandboxSpec | None = None, *, snapshot: Any = None,
                   url: str | None = None, token: str | None = None) -> "RemoteSandbox":
        """A new sandbox on the service at ``url`` (default: ``configure()``, else the
        environment)."""
        spec = spec or SandboxSpec(backend="remote")
        ep = Endpoint(url.rstrip("/"), token) if url else endpoint()
        body = spec.to_dict()
        if snapshot is not None:
            body["snapshot"] = await _snapshot_digest(ep, snapshot)
        # The model service's admin token rides in a header, never in the spec (which the
        # service lists); the service issues and revokes this sandbox's key with it.
        token = current_token() if spec.model_endpoint else None
        return cls(spec, await _creates.submit((ep, token), body), ep)

    create = open  # ``RemoteSandbox.create(spec, url=..., token=...)``: this service, not the factory's

    @property
    def alive(self) -> bool:
        return not self._closed and self._alive

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._call("DELETE", self._url())
        except (SandboxNotFound, SandboxClosed, SandboxLost):
            pass  # already gone, or the service is: nothing left to close

    async def reset(self) -> None:
        self._ensure_open()
        await self._call("POST", self._url("/reset"))
        self._alive = True

    async def expose(self, port: int) -> tuple[str, int]:
        self._ensure_open()
        out = (await self._call("POST", self._url("/expose"), json_body={"port": port})).json()
        return out["host"], out["port"]

    async def egress_log(self, since: int | None = None) -> list[dict]:
        self._ensure_open()
        params = {} if since is None else {"since": since}
        return (await self._call("GET", self._url("/egress"), params=params)).json()["records"]

    async def ping(self) -> bool:
        if self._closed:
            return False
        try:
            ok = (await self._call("GET", self._url("/ping"))).json()["ok"]
        except SandboxError:
            return False
        return bool(ok)

    # ----------------------------------------------------------------- commands
    @staticmethod
    def _run_body(cmd, timeout, session, env, cwd) -> dict:
        return {"cmd": cmd, "timeout": timeout, "session": session, "env": env, "cwd": cwd}

    async def run(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                  env: dict[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        self._ensure_open()
        resp = await self._call("POST", self._url("/run"), json_body=self._run_body(cmd, timeout, session, env, cwd))
        return ResultOut.model_validate(resp.json()).to_result()

    async def run_stream(self, cmd: str, *, timeout: float | None = None, session: str | None = None,
                         env: dict[str, str] | None = None, cwd: str | None = None):
        """Yields ``("stdout" | "stderr", text)`` chunks as the service streams them (SSE),
        then the final ``CommandResult``."""
        self._ensure_open()
        resp = await self._call("POST", self._url("/run/stream"), stream=True,
                                json_body=self._run_body(cmd, timeout, session, env, cwd))
        try:
            async for event, data in _sse(resp):
                if event in ("stdout", "stderr"):
                    yield event, json.loads(data)
                elif event == "result":
                    yield ResultOut.model_validate_json(data).to_result()
                    return
                elif event == "error":
                    exc = error_from_body(200, json.loads(data))
                    self._on_error(exc)
                    raise exc
            raise SandboxLost("the service ended the stream without a result", sandbox_id=self.id)
        finally:
            await resp.aclose()

    async def open_terminal(self, cmd: str | Sequence[str] | None = None, *, rows: int = 24, cols: int = 80,
                            env: dict[str, str] | None = None, cwd: str | None = None,
                            idle_timeout: float | None = 600.0) -> "RemoteTerminal":
        """Over the service's WebSocket (``server/terminals.py``)."""
        self._ensure_open()
        req = terminal_request(cmd, rows, cols, env, cwd, idle_timeout)
        params: list[tuple[str, str]] = [("rows", str(rows)), ("cols", str(cols))]
        params += [("cmd", a) for a in req["argv"] or ([req["command"]] if req["command"] else [])]
        if req["command"]:
            params.append(("shell", "1"))
        if cwd:
            params.append(("cwd", cwd))
        if env:
            params.append(("env", json.dumps(env)))
        params.append(("idle_timeout", "none" if idle_timeout is None else str(idle_timeout)))
        return await RemoteTerminal.connect(self._ep, self._url("/terminal"), params, self.id)

    async def sessions(self) -> list[str]:
        self._ensure_open()
        return (await self._call("GET", self._url("/sessions"))).json()

    async def close_session(self, name: str) -> None:
        self._ensure_open()
        await self._call("DELETE", self._url(f"/sessions/{_quote(name)}"))

    # ----------------------------------------------------------------- files
    async def read_file(self, path: str) -> bytes:
        limit = StorageLimits.from_env().max_layer_bytes  # a sparse 1 TB file must not fill our memory
        _, chunks = await self.read_stream(path)
        data = bytearray()
        try:
            async for chunk in chunks:
                if len(data) + len(chunk) > limit:
                    raise StorageLimitError("max_layer_bytes", limit, f"{path} is larger", sandbox_id=self.id)
                data += chunk
        finally:
            await chunks.aclose()
        return bytes(data)

    async def stat(self, path: str) -> str | None:
        self._ensure_open()
        out = (await self._call("GET", self._url("/exists"), params={"path": path})).json()
        return out.get("type") or "other" if out["exists"] else None

    async def write_stream(self, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644,
                           tar: bool = False) -> int:
        """The chunks go as the body of one PUT, streamed, and never twice: a consumed
        iterator cannot start over, so a failed send raises ``SandboxLost``."""
        self._ensure_open()
        sent, pulled = 0, False

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent, pulled
            pulled = True
            async for chunk in chunks:
                sent += len(chunk)
                yield chunk

        def once() -> AsyncIterator[bytes]:
            if pulled:  # a retry would send what is left of a consumed stream: a cut file
                raise SandboxLost(f"the connection failed while sending {path}", sandbox_id=self.id)
            return body()

        params = {"path": path, "tar": "true"} if tar else {"path": path, "mode": mode}
        await self._call("PUT", self._url("/files"), params=params, content=once)
        return sent

    async def read_stream(self, path: str) -> tuple[str, AsyncIterator[bytes]]:
        self._ensure_open()
        resp = await self._call("GET", self._url("/files"), params={"path": path}, stream=True)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_bytes(CHUNK):
                    yield chunk
            except httpx.HTTPError as e:
                raise SandboxLost(f"download of {path} was cut: {e}", sandbox_id=self.id) from e
            finally:
                await resp.aclose()

        return ("dir" if resp.headers.get("x-rockroll-type") == "dir" else "file"), chunks()

    # ----------------------------------------------------------------- snapshots
    async def snapshot(self) -> Snapshot:
        """A snapshot stored on the service (``path`` is None: fetch the tarball with
        ``GET /v1/snapshots/{digest}`` to keep it)."""
        self._ensure_open()
        return SnapshotOut.model_validate((await self._call("POST", self._url("/snapshots"))).json()).to_snapshot()

    async def restore(self, snapshot: Snapshot | str | Path) -> None:
        self._ensure_open()
        digest = await _snapshot_digest(self._ep, snapshot)
        await self._call("POST", self._url("/restore"), json_body={"snapshot": digest})
        self._alive = True

    async def fork(self, n: int = 1) -> list["RemoteSandbox"]:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpecError("n", "must be a positive integer")
        self._ensure_open()
        resp = await self._call("POST", self._url("/fork"), json_body={"n": n})
        return [RemoteSandbox(self.spec, SandboxOut.model_validate(o).id, self._ep) for o in resp.json()]

    def _describe(self) -> str:
        return f"{super()._describe()} at {self._ep.url}"


# --------------------------------------------------------------------------- HTTP
def _unreachable(ep: Endpoint, e: Exception, sandbox_id: str | None) -> str:
    if sandbox_id:  # it answered once: its host is gone, not misconfigured
        return f"the rockroll service at {ep.url} that holds this sandbox does not answer: {e or type(e).__name__}"
    return (f"cannot connect to a rockroll service at {ep.url} ({ep.source}): {e or type(e).__name__}. "
            "Start one with `rockroll serve`, or point the SDK at yours: set ROCKROLL_URL (and "
            "ROCKROLL_TOKEN), or call rockroll.sandbox.configure(url, token)")


async def _request(ep: Endpoint, method: str, path: str, *, json_body: Any = None, params: dict | None = None,
                   content=None, stream: bool = False, sandbox_id: str | None = None,
                   on_error=None, headers: dict[str, str] | None = None,
                   passthrough: tuple[int, ...] = ()) -> httpx.Response:
    """One API call with retries; a non-2xx answer raises the typed error it carries
    (one in ``passthrough`` is returned instead). ``content`` is a zero-argument callable
    giving the body afresh for each attempt."""
    client = _client()
    headers = {**(headers or {}), **({"Authorization": f"Bearer {ep.token}"} if ep.token else {})}
    delay = BACKOFF_S
    for attempt in range(RETRIES + 1):
        last = attempt == RETRIES
        try:
            req = client.build_request(method, ep.url + path, json=json_body, params=params, headers=headers,
                                       content=content() if content is not None else None)
            resp = await client.send(req, stream=stream)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # nothing was sent: always safe to repeat
            if last:
                raise ServiceUnreachable(_unreachable(ep, e, sandbox_id), sandbox_id=sandbox_id) from e
        except httpx.TransportError as e:
            if last or method not in IDEMPOTENT:
                raise SandboxLost(f"connection to {ep.url} failed during {method} {path}: {e}",
                                  sandbox_id=sandbox_id) from e
        else:
            if resp.status_code < 400 or resp.status_code in passthrough:
                return resp
            if stream:
                await resp.aread()
            body = _json_or_none(resp)
            typed = isinstance(body, dict) and "error" in body
            if resp.status_code in (502, 503) and not typed and method in IDEMPOTENT and not last:
                await resp.aclose()
            else:
                exc = error_from_body(resp.status_code, body if typed or resp.status_code in (401, 422) else
                                      {"message": f"HTTP {resp.status_code} from {ep.url}: {resp.text[:200]}"})
                if exc.sandbox_id is None and sandbox_id and not isinstance(exc, (AuthError, SpecError)):
                    exc.sandbox_id = sandbox_id
                if on_error:
                    on_error(exc)
                raise exc
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


# ----------------------------------------------------------------- creates issued together
_NO_BATCH: set[str] = set()  # services that answered a batch with 404/405: older ones


async def _create_batch(key: tuple[Endpoint, str | None], calls: list[Pending]) -> None:
    """Creates issued together (``batch.Coalescer``): one ``POST /v1/sandboxes/batch``,
    whose NDJSON lines answer each call as its sandbox is ready. One call alone, or a
    service without the batch route, takes ``POST /v1/sandboxes`` per call; so does a
    batch the service refused for a bad item (each caller then gets its own error)."""
    ep, token = key
    headers = {TOKEN_HEADER: token} if token else None
    if len(calls) > 1 and ep.url not in _NO_BATCH:
        try:
            resp = await _request(ep, "POST", f"{API}/sandboxes/batch", stream=True, headers=headers,
                                  json_body={"sandboxes": [c.payload for c in calls]}, passthrough=(404, 405))
        except SpecError:
            resp = None
        if resp is not None and resp.status_code in (404, 405):
            await resp.aclose()
            _NO_BATCH.add(ep.url)
        elif resp is not None:
            await _read_batch(ep, resp, calls)
            return
    await asyncio.gather(*(c.settle(_create_one(ep, c.payload, headers)) for c in calls))


async def _read_batch(ep: Endpoint, resp: httpx.Response, calls: list[Pending]) -> None:
    try:
        async for line in resp.aiter_lines():
            if line:
                item = BatchItemOut.model_validate_json(line)
                if item.sandbox is not None:
                    calls[item.index].resolve(item.sandbox.id)
                else:
                    calls[item.index].fail(error_from_body(item.status, item.error))
    except httpx.TransportError as e:
        # The service closes what it could not send (its answer to a client that left).
        raise SandboxLost(f"connection to {ep.url} failed during a batch of creates: {e}") from e
    finally:
        await resp.aclose()
    for call in calls:
        if not call.future.done():
            call.fail(SandboxLost("the service ended a batch of creates without answering for this one"))


async def _create_one(ep: Endpoint, body: dict, headers: dict[str, str] | None) -> str:
    # POST is not repeated after the request went out: a retry could create a second sandbox.
    resp = await _request(ep, "POST", f"{API}/sandboxes", json_body=body, headers=headers)
    return SandboxOut.model_validate(resp.json()).id


def _close_orphan(key: tuple[Endpoint, str | None], sandbox_id: str) -> None:
    """A sandbox whose create's caller was cancelled meanwhile: nobody holds it."""
    task = asyncio.ensure_future(_request(key[0], "DELETE", f"{API}/sandboxes/{sandbox_id}",
                                          sandbox_id=sandbox_id))
    _ORPHANS.add(task)
    task.add_done_callback(_orphan_done)


def _orphan_done(task: asyncio.Task) -> None:
    _ORPHANS.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a failed close of a sandbox nobody holds is not worth a warning


_ORPHANS: set[asyncio.Task] = set()
_creates = Coalescer(_create_batch, limit=MAX_BATCH, orphan=_close_orphan)


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


async def _sse(resp: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """Server-sent events as ``(event, data)`` pairs."""
    event, data = "message", []
    async for line in resp.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


class RemoteTerminal(AsyncTerminal):
    """A terminal of a service's sandbox, over its WebSocket: binary messages are keys and
    output, text messages JSON controls (``server/terminals.py``). Closing the socket (or
    this process dying) closes the terminal on the service."""

    def __init__(self, ws, sandbox_id: str):
        super().__init__(sandbox_id)
        self.ws = ws
        self._ended = False

    @classmethod
    async def connect(cls, ep: Endpoint, path: str, params: list[tuple[str, str]], sandbox_id: str
                      ) -> "RemoteTerminal":
        from websockets.asyncio.client import connect  # noqa: PLC0415 - the service extra
        from websockets.exceptions import InvalidStatus  # noqa: PLC0415

        url = "ws" + ep.url[4:] + path + "?" + urllib.parse.urlencode(params)
        headers = {"Authorization": f"Bearer {ep.token}"} if ep.token else {}
        try:
            ws = await connect(url, additional_headers=headers, max_size=None, compression=None)
        except InvalidStatus as e:
            if e.response.status_code in (401, 403):
                raise AuthError("the service refused the token for the terminal (missing or wrong bearer "
                                "token)", sandbox_id=sandbox_id) from None
            raise SandboxError(f"terminal: HTTP {e.response.status_code}", sandbox_id=sandbox_id) from None
        except OSError as e:
            raise ServiceUnreachable(f"no service answers at {ep.url} ({e})", sandbox_id=sandbox_id) from None
        first = json.loads(await ws.recv())
        if "error" in first:
            await ws.close()
            raise error_from_body(int(first.get("status", 400)), first["error"])
        return cls(ws, sandbox_id)

    async def _recv(self) -> bytes | None:
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415

        while not self._ended:
            try:
                msg = await self.ws.recv()
            except ConnectionClosed:
                break
            if isinstance(msg, bytes):
                return msg
            control = json.loads(msg)
            if "exit" in control:
                self.exit_code = control["exit"]
                break
        self._ended = True
        return None

    async def _send(self, message: str | bytes) -> None:
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415

        self._ensure_open()
        if self._ended or self.exited:
            raise TerminalError(f"the terminal's process ended (exit code {self.exit_code})",
                                sandbox_id=self.sandbox_id)
        try:
            await self.ws.send(message)
        except ConnectionClosed:
            raise TerminalError("the terminal's connection is closed", sandbox_id=self.sandbox_id) from None

    async def write(self, data: str | bytes) -> None:
        await self._send(data.encode() if isinstance(data, str) else bytes(data))

    async def resize(self, rows: int, cols: int) -> None:
        terminal_request(None, rows, cols, None, None, None)
        await self._send(json.dumps({"resize": [rows, cols]}))

    async def signal(self, sig: int = 2) -> None:
        await self._send(json.dumps({"signal": int(sig)}))

    async def _close(self) -> None:
        await self.ws.close()


async def _snapshot_digest(ep: Endpoint, snapshot: Snapshot | str | Path) -> str:
    """The digest the service knows a snapshot by: a ``Snapshot`` or a ``sha256:`` digest
    as is; a local tarball path is uploaded first (its parents must be on the service)."""
    if isinstance(snapshot, Snapshot):
        return snapshot.digest
    if isinstance(snapshot, str) and snapshot.startswith("sha256:"):
        return snapshot
    path = Path(snapshot)
    if not path.is_file():
        raise SnapshotError(f"no snapshot tarball at {path}")
    resp = await _request(ep, "POST", f"{API}/snapshots", content=lambda: file_chunks(path))
    return resp.json()["digest"]


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")
