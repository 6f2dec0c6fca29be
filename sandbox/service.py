"""``rockroll serve``: sandboxes over HTTP (FastAPI), for the ``remote`` backend's SDK.

    app = create_app(token="...")          # uvicorn.run(app, host="127.0.0.1", port=8765)

REST under ``/v1`` (bearer token), ``/healthz`` (open), ``/metrics`` (Prometheus text,
token), and a dashboard at ``/`` (open page; it reads the token from the URL fragment,
``/#token=...``, which browsers never send to the server, and calls the API with it).

The service owns its sandboxes (``SandboxHub``): creation is capped (429 + Retry-After),
an idle reaper closes sandboxes unused for ``spec.ttl_s`` (else ``idle_ttl``), shutdown
closes all of them, and start-up reaps what a previous, killed server left behind.
Typed sandbox errors travel as ``{"error", "message", "sandbox_id"}`` (see ``wire.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import hmac
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from .client import CHUNK, AsyncSandbox
from .errors import CapacityError, SandboxClosed, SandboxError, SandboxFileError, SandboxNotFound, SnapshotError
from .layers import digest_file, read_meta
from .registry import current_run, reap_dead_runs
from .snapshots import SnapshotStore
from .wire import (API, DIGEST_PATTERN, AuthError, ErrorOut, ExistsOut, ForkIn, HealthOut, OkOut, RestoreIn,
                   ResultOut, RunIn, SandboxOut, SnapshotOut, SpecIn, StatsOut, CommandOut, error_body, status_of)

log = logging.getLogger("rockroll.serve")
RECENT_COMMANDS = 20          # per sandbox, for the dashboard
TOMBSTONES = 10_000           # closed ids remembered, so late callers get SandboxClosed, not 404
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


# --------------------------------------------------------------------------- metrics
class Metrics:
    """The few series the service exports, rendered by hand in Prometheus text format
    (no client library: four metric families do not justify a dependency)."""

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.commands = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.created = 0
        self.closed: collections.Counter[str] = collections.Counter()

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds
        self.commands += 1

    def render(self, states: collections.Counter[str], capacity: int) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}"
                       for labels, value in samples)

        family("rockroll_sandboxes", "gauge", "Sandboxes held by the service, by state.",
               [(f'{{state="{s}"}}', states.get(s, 0)) for s in ("alive", "dead")])
        family("rockroll_sandboxes_capacity", "gauge", "Most sandboxes the service holds at once.",
               [("", capacity)])
        family("rockroll_sandboxes_created_total", "counter", "Sandboxes created.", [("", self.created)])
        family("rockroll_sandboxes_closed_total", "counter", "Sandboxes closed, by reason.",
               [(f'{{reason="{r}"}}', n) for r, n in sorted(self.closed.items())])
        cumulative, samples = 0, []
        for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), self.buckets):
            cumulative += n
            samples.append((f'{{le="{bound}"}}', cumulative))
        out.append("# HELP rockroll_command_duration_seconds Wall time of run() calls, server side.")
        out.append("# TYPE rockroll_command_duration_seconds histogram")
        out.extend(f"rockroll_command_duration_seconds_bucket{labels} {v}" for labels, v in samples)
        out.append(f"rockroll_command_duration_seconds_sum {self.latency_sum:.6f}")
        out.append(f"rockroll_command_duration_seconds_count {self.commands}")
        family("rockroll_failures_total", "counter", "Failed requests, by error kind.",
               [(f'{{kind="{k}"}}', n) for k, n in sorted(self.failures.items())])
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- sandboxes
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
        """cgroup CPU and memory, where the deployment has a cgroup (cheap file reads)."""
        cgroup = getattr(getattr(self.sb, "_deploy", None), "cgroup", None)
        if cgroup is None:
            return StatsOut()
        try:
            return StatsOut(cpu_seconds=cgroup.cpu_seconds(), memory_bytes=cgroup.memory_bytes())
        except (OSError, ValueError, SandboxError):
            return StatsOut()

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


# --------------------------------------------------------------------------- files
async def write_stream(sb: AsyncSandbox, path: str, mode: int, chunks: AsyncIterator[bytes]) -> int:
    """Write an HTTP body into a sandbox file as it arrives, ``CHUNK`` bytes per agent
    request: memory stays bounded whatever the file's size. Returns the size."""
    target, buf, offset = sb._path(path), bytearray(), 0

    async def flush(data: bytes) -> None:
        nonlocal offset
        await sb._request({"op": "write", "path": target, "mode": mode, "offset": offset,
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


async def read_stream(sb: AsyncSandbox, path: str) -> tuple[str, AsyncIterator[bytes] | bytes]:
    """``("dir", tar bytes)`` or ``("file", chunk iterator)``; the first chunk is read before
    returning, so a missing or unreadable file is an error status, not a cut stream."""
    target = sb._path(path)
    header, _ = await sb._request({"op": "stat", "path": target})
    if not header["exists"]:
        raise SandboxFileError(f"no such file: {path}", sandbox_id=sb.id)
    if header["type"] == "dir":
        _, body = await sb._request({"op": "tar_out", "path": target})
        return "dir", body
    first, body = await sb._request({"op": "read", "path": target, "offset": 0, "length": CHUNK})

    async def chunks() -> AsyncIterator[bytes]:
        h, data, offset = first, body, 0
        while True:
            if data:
                yield data
            offset += len(data)
            if not data or offset >= h["size"]:
                return
            h, data = await sb._request({"op": "read", "path": target, "offset": offset, "length": CHUNK})

    return "file", chunks()


# --------------------------------------------------------------------------- app
# Non-JSON routes return a Response (no response_class), so their errors stay documented as JSON.
ERRORS = {code: {"model": ErrorOut} for code in (400, 401, 404, 409, 429, 503)}


def create_app(token: str, *, backend: str = "local", max_sandboxes: int = 256,
               idle_ttl: float | None = 3600.0, reap_interval: float = 1.0) -> FastAPI:
    """The service as an ASGI app. ``token`` guards everything but ``/``, ``/healthz``
    and the OpenAPI document."""
    if backend == "remote":
        raise SandboxError("the service cannot use backend='remote' (it would call itself)")
    hub = SandboxHub(backend=backend, max_sandboxes=max_sandboxes, idle_ttl=idle_ttl,
                     reap_interval=reap_interval)
    store = SnapshotStore(current_run().home)
    expected = token.encode()
    bearer = HTTPBearer(auto_error=False, description="the server's token (ROCKROLL_TOKEN)")

    def auth(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        given = creds.credentials.encode() if creds else b""
        if not hmac.compare_digest(given, expected):
            raise AuthError("missing or wrong bearer token" if creds else "missing bearer token")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await hub.start()
        try:
            yield
        finally:
            await hub.stop()

    app = FastAPI(title="rockroll sandbox service", version="1", lifespan=lifespan, responses=ERRORS)
    app.state.hub = hub
    v1 = APIRouter(prefix=API, dependencies=[Depends(auth)])

    # errors -----------------------------------------------------------------
    @app.exception_handler(SandboxError)
    async def on_sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
        status = 401 if isinstance(exc, AuthError) else status_of(exc)
        hub.metrics.failures[type(exc).__name__] += 1
        headers = {}
        if isinstance(exc, CapacityError):
            headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        if isinstance(exc, AuthError):
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(error_body(exc), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        field = ".".join(str(p) for p in detail[0]["loc"][1:]) if detail else "body"
        hub.metrics.failures["SpecError"] += 1
        return JSONResponse({"error": "SpecError", "field": field or "body",
                             "message": detail[0]["msg"] if detail else "invalid request",
                             "sandbox_id": None, "detail": detail}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own refusals (unparsable body, unknown route, wrong method) in our shape too.
        return JSONResponse({"error": "HTTPError", "message": str(exc.detail), "sandbox_id": None},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Last resort only: every failure an input can cause should be a typed 4xx.
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        hub.metrics.failures["InternalError"] += 1
        return JSONResponse({"error": "InternalError", "message": f"{type(exc).__name__}: {exc}",
                             "sandbox_id": None}, status_code=500)

    # open routes ------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse((Path(__file__).with_name("dashboard.html")).read_text())

    @app.get("/healthz", response_model=HealthOut)
    async def healthz() -> HealthOut:
        return HealthOut(ok=True, run_id=current_run().run_id, sandboxes=len(hub.entries), backend=backend)

    @app.get("/metrics", dependencies=[Depends(auth)],
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics() -> PlainTextResponse:
        states = collections.Counter(e.state for e in hub.entries.values())
        return PlainTextResponse(hub.metrics.render(states, hub.max_sandboxes),
                                 media_type="text/plain; version=0.0.4")

    # sandboxes --------------------------------------------------------------
    @v1.post("/sandboxes", response_model=SandboxOut, status_code=201)
    async def create_sandbox(body: SpecIn) -> SandboxOut:
        spec = body.to_spec(backend)
        entry = await hub.create(spec, body.snapshot)
        return entry.describe(False)

    @v1.get("/sandboxes", response_model=list[SandboxOut], response_model_exclude_none=True)
    async def list_sandboxes(detail: bool = False) -> list[SandboxOut]:
        entries = list(hub.entries.values())
        if detail:  # cgroup reads touch files: off the event loop
            return await asyncio.to_thread(lambda: [e.describe(True) for e in entries])
        return [e.describe(False) for e in entries]

    @v1.get("/sandboxes/{sandbox_id}", response_model=SandboxOut, response_model_exclude_none=True)
    async def get_sandbox(sandbox_id: str, detail: bool = False) -> SandboxOut:
        return hub.get(sandbox_id).describe(detail)

    @v1.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def delete_sandbox(sandbox_id: str) -> Response:
        if sandbox_id not in hub.tombstones:  # closing twice is fine, as locally
            hub.get(sandbox_id)
        await hub.close(sandbox_id, "client")
        return Response(status_code=204)

    @v1.get("/sandboxes/{sandbox_id}/ping", response_model=OkOut)
    async def ping(sandbox_id: str) -> OkOut:
        entry = hub.get(sandbox_id)
        return OkOut(ok=await hub.call(entry, entry.sb.ping()))

    # commands ---------------------------------------------------------------
    @v1.post("/sandboxes/{sandbox_id}/run", response_model=ResultOut)
    async def run(sandbox_id: str, body: RunIn) -> ResultOut:
        entry = hub.get(sandbox_id)
        started = time.monotonic()
        try:
            result = await hub.call(entry, entry.sb.run(body.cmd, timeout=body.timeout, session=body.session,
                                                         env=body.env, cwd=body.cwd))
        except SandboxError as e:
            hub.record(entry, body.cmd, started, error=e)
            raise
        hub.record(entry, body.cmd, started, result)
        return ResultOut.of(result)

    @v1.post("/sandboxes/{sandbox_id}/run/stream",
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "SSE: `stdout`/`stderr` events (data: a JSON string), "
                                             "then one `result` (ResultOut) or `error` (ErrorOut) event"}})
    async def run_stream(sandbox_id: str, body: RunIn) -> StreamingResponse:
        entry = hub.get(sandbox_id)  # before the stream starts: an unknown id is a 404, not an event

        async def events() -> AsyncIterator[str]:
            started = time.monotonic()
            async with hub.using(entry):
                agen = entry.sb.run_stream(body.cmd, timeout=body.timeout, session=body.session,
                                           env=body.env, cwd=body.cwd)
                try:
                    async for item in agen:
                        if isinstance(item, tuple):
                            yield f"event: {item[0]}\ndata: {json.dumps(item[1])}\n\n"
                        else:
                            hub.record(entry, body.cmd, started, item)
                            yield f"event: result\ndata: {ResultOut.of(item).model_dump_json()}\n\n"
                except SandboxError as e:
                    hub.record(entry, body.cmd, started, error=e)
                    hub.metrics.failures[type(e).__name__] += 1
                    yield f"event: error\ndata: {json.dumps(error_body(e))}\n\n"
                finally:
                    await agen.aclose()

        # no-cache / no buffering: each event reaches the client as soon as it is written
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @v1.get("/sandboxes/{sandbox_id}/sessions", response_model=list[str])
    async def sessions(sandbox_id: str) -> list[str]:
        entry = hub.get(sandbox_id)
        return await hub.call(entry, entry.sb.sessions())

    @v1.delete("/sandboxes/{sandbox_id}/sessions/{name}", status_code=204)
    async def close_session(sandbox_id: str, name: str) -> Response:
        entry = hub.get(sandbox_id)
        await hub.call(entry, entry.sb.close_session(name))
        return Response(status_code=204)

    # state ------------------------------------------------------------------
    @v1.post("/sandboxes/{sandbox_id}/reset", status_code=204)
    async def reset(sandbox_id: str) -> Response:
        entry = hub.get(sandbox_id)
        await hub.call(entry, entry.sb.reset())
        return Response(status_code=204)

    @v1.post("/sandboxes/{sandbox_id}/fork", response_model=list[SandboxOut], status_code=201)
    async def fork(sandbox_id: str, body: ForkIn) -> list[SandboxOut]:
        entry = hub.get(sandbox_id)
        hub.reserve(body.n)
        hub.creating += body.n
        try:
            children = await hub.call(entry, entry.sb.fork(body.n))
        finally:
            hub.creating -= body.n
        return [hub.adopt(sb).describe(False) for sb in children]

    @v1.post("/sandboxes/{sandbox_id}/restore", status_code=204)
    async def restore(sandbox_id: str, body: RestoreIn) -> Response:
        entry = hub.get(sandbox_id)
        await hub.call(entry, entry.sb.restore(body.snapshot))
        return Response(status_code=204)

    @v1.post("/sandboxes/{sandbox_id}/snapshots", response_model=SnapshotOut, status_code=201)
    async def snapshot(sandbox_id: str) -> SnapshotOut:
        entry = hub.get(sandbox_id)
        return SnapshotOut.of(await hub.call(entry, entry.sb.snapshot()))

    # files ------------------------------------------------------------------
    @v1.put("/sandboxes/{sandbox_id}/files", status_code=204,
            openapi_extra={"requestBody": {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}})
    async def put_file(sandbox_id: str, request: Request, path: str = Query(min_length=1),
                       mode: int = Query(0o644, ge=0, le=0o7777),
                       tar: bool = Query(False, description="the body is a tar to unpack into `path`")
                       ) -> Response:
        entry = hub.get(sandbox_id)
        if tar:  # the agent unpacks a tar from one frame: directories come whole
            body = await request.body()
            await hub.call(entry, entry.sb._request({"op": "tar_in", "path": entry.sb._path(path)}, body))
        else:
            await hub.call(entry, write_stream(entry.sb, path, mode, request.stream()))
        return Response(status_code=204)

    @v1.get("/sandboxes/{sandbox_id}/files",
            responses={200: {"content": {"application/octet-stream": {}, "application/x-tar": {}},
                             "description": "the file's bytes, or a tar of a directory "
                                            "(header X-Rockroll-Type: file | dir)"}})
    async def get_file(sandbox_id: str, path: str = Query(min_length=1)) -> Response:
        entry = hub.get(sandbox_id)
        kind, data = await hub.call(entry, read_stream(entry.sb, path))
        if kind == "dir":
            return Response(data, media_type="application/x-tar", headers={"X-Rockroll-Type": "dir"})

        async def guarded() -> AsyncIterator[bytes]:
            async with hub.using(entry):
                async for chunk in data:
                    yield chunk

        return StreamingResponse(guarded(), media_type="application/octet-stream",
                                 headers={"X-Rockroll-Type": "file"})

    @v1.get("/sandboxes/{sandbox_id}/exists", response_model=ExistsOut)
    async def exists(sandbox_id: str, path: str = Query(min_length=1)) -> ExistsOut:
        entry = hub.get(sandbox_id)
        header, _ = await hub.call(entry, entry.sb._request({"op": "stat", "path": entry.sb._path(path)}))
        return ExistsOut(exists=header["exists"], type=header.get("type"))

    # snapshots --------------------------------------------------------------
    @v1.get("/snapshots", response_model=list[SnapshotOut])
    async def list_snapshots() -> list[SnapshotOut]:
        return await asyncio.to_thread(_list_snapshots, store)

    @v1.post("/snapshots", response_model=SnapshotOut, status_code=201,
             openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                 "schema": {"type": "string", "format": "binary"}}}}})
    async def upload_snapshot(request: Request) -> SnapshotOut:
        """Import a snapshot tarball (``.tar.zst``); its parents must already be here."""
        store.tar_root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=store.tar_root, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in request.stream():
                    f.write(chunk)
            digest = await asyncio.to_thread(digest_file, tmp)
            existed = store.tarball(digest).exists()
            await asyncio.to_thread(store.import_tarball, Path(tmp))
            try:  # unpacks and checks the whole chain: a crafted tarball is refused here
                snap = await asyncio.to_thread(store.load, digest)
            except SandboxError:
                if not existed:
                    store.tarball(digest).unlink(missing_ok=True)
                raise
        finally:
            Path(tmp).unlink(missing_ok=True)
        return SnapshotOut.of(snap)

    @v1.get("/snapshots/{digest}",
            responses={200: {"content": {"application/zstd": {}}, "description": "the layer tarball"}})
    async def download_snapshot(digest: str) -> Response:
        path = _known_tarball(store, digest)
        return FileResponse(path, media_type="application/zstd", filename=path.name)

    app.include_router(v1)
    return app


def _known_tarball(store: SnapshotStore, digest: str) -> Path:
    if not re.fullmatch(DIGEST_PATTERN, digest):
        raise SnapshotError(f"not a sha256 digest: {digest!r}")
    path = store.tarball(digest)
    if not path.is_file():
        raise SnapshotError(f"no snapshot {digest} on this service")
    return path


def _list_snapshots(store: SnapshotStore) -> list[SnapshotOut]:
    out = []
    for path in sorted((store.tar_root / "sha256").glob("*.tar.zst")):
        digest = "sha256:" + path.name[:64]
        try:
            meta = read_meta(path)
            size = path.stat().st_size
        except (SandboxError, OSError):
            continue  # a half-written or foreign file: not a snapshot we can offer
        out.append(SnapshotOut(id=path.name[:12], digest=digest, size=size,
                               layers=[*meta.get("parents", ()), digest], image=meta.get("image", "host")))
    return out
