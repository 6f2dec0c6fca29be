"""Routes of sandboxes: lifecycle, commands (plain and streamed), state."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import AsyncIterator, Sequence

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from ..errors import SandboxError, SpecError
from ..protocol.tokens import admin_token
from ..protocol.wire import (BatchIn, BatchItemOut, EgressLogOut, ExposeIn, ExposeOut, ForkIn, OkOut, RestoreIn,
                             ResultOut, RunIn, SandboxOut, SnapshotOut, SpecIn, error_body, status_of)
from ..spec import SandboxSpec
from .deps import Fleet, Store
from .quota import token_key

router = APIRouter()
log = logging.getLogger("rockroll.serve")
# Tasks closing the sandboxes of a batch whose client left before it heard of them.
_UNHEARD: set[asyncio.Task] = set()
MODEL_TOKEN_DOC = ("the admin token of the spec's model_endpoint (else the service's own "
                   "$ROCKROLL_MODEL_TOKEN); kept in memory only")


# sandboxes ------------------------------------------------------------------
@router.post("/sandboxes", response_model=SandboxOut, status_code=201)
async def create_sandbox(body: SpecIn, fleet: Fleet, x_rockroll_model_token: str | None = Header(
        default=None, description=MODEL_TOKEN_DOC)) -> SandboxOut:
    with admin_token(x_rockroll_model_token):
        entry = await fleet.create(body.to_spec(fleet.backend), body.snapshot)
    return entry.describe(False)


@router.post("/sandboxes/batch",
             responses={200: {"content": {"application/x-ndjson": {}},
                              "description": "one BatchItemOut per line, each as soon as its sandbox is "
                                             "ready (or failed): the order is not the request's"}})
async def create_sandboxes(body: BatchIn, fleet: Fleet, request: Request, x_rockroll_model_token: str | None = Header(
        default=None, description=MODEL_TOKEN_DOC)) -> StreamingResponse:
    """Many sandboxes in one request: one HTTP round trip and one request's parsing for
    all of them, which is what a burst of creates spends most in, on both ends. Every item
    is checked before any sandbox is made (a bad one is a 422 naming ``sandboxes.<i>.<field>``);
    then each succeeds or fails on its own, as ``POST /v1/sandboxes`` would. A client that
    goes away mid-answer loses nothing: the sandboxes it was not sent are closed."""
    specs = []
    for i, item in enumerate(body.sandboxes):
        try:
            specs.append(item.to_spec(fleet.backend))
        except SpecError as e:
            raise SpecError(f"sandboxes.{i}.{e.field}", str(e).split(": ", 1)[-1]) from None
    return StreamingResponse(_batch_lines(fleet, request, specs, [item.snapshot for item in body.sandboxes],
                                          x_rockroll_model_token),
                             media_type="application/x-ndjson", headers={"X-Accel-Buffering": "no"})


async def _batch_lines(fleet, request: Request, specs: Sequence[SandboxSpec], snapshots: Sequence[str | None],
                       model_token: str | None) -> AsyncIterator[str]:
    # The creates start with the stream: a generator that never ran has no cleanup to run.
    with admin_token(model_token):
        tasks = [asyncio.ensure_future(fleet.create(spec, snap)) for spec, snap in zip(specs, snapshots)]
    fleet.metrics.batches.inc()
    fleet.metrics.batched.inc(len(tasks))
    index = {task: i for i, task in enumerate(tasks)}
    pending: set[asyncio.Future] = set(tasks)
    heard: set[asyncio.Future] = set()
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            yield "".join(_batch_line(fleet, index[task], task) + "\n" for task in done)
            # The server's send returns even when it dropped the chunk: a hang-up it read in this
            # turn of the loop closed the transport, and the connection's end is reported in the
            # next. So the chunk counts as heard only if, one turn later, the client is still there.
            await asyncio.sleep(0)
            if await request.is_disconnected():
                break
            heard |= done
    finally:
        unheard = [task for task in tasks if task not in heard]
        if unheard:
            closer = asyncio.ensure_future(_close_unheard(fleet, unheard))
            _UNHEARD.add(closer)
            closer.add_done_callback(_UNHEARD.discard)


def _batch_line(fleet, i: int, task: asyncio.Future) -> str:
    exc = task.exception()
    if exc is None:
        return BatchItemOut(index=i, status=201, sandbox=task.result().describe(False)).model_dump_json()
    if not isinstance(exc, SandboxError):
        log.error("unexpected error creating sandbox %d of a batch", i, exc_info=exc)
        exc = SandboxError(f"{type(exc).__name__}: {exc}")
        body, status = {**error_body(exc), "error": "InternalError"}, 500
    else:
        body, status = error_body(exc), status_of(exc)
    fleet.metrics.failures.labels(body["error"]).inc()
    return BatchItemOut(index=i, status=status, error=body).model_dump_json()


async def _close_unheard(fleet, tasks: list[asyncio.Future]) -> None:
    for entry in await asyncio.gather(*tasks, return_exceptions=True):
        if not isinstance(entry, BaseException):
            await fleet.close(entry.id, "client")


@router.get("/sandboxes", response_model=list[SandboxOut], response_model_exclude_none=True)
async def list_sandboxes(fleet: Fleet, detail: bool = False) -> list[SandboxOut]:
    entries = list(fleet.entries.values())
    if detail:  # usage reads touch files: off the event loop
        return await asyncio.to_thread(lambda: [e.describe(True) for e in entries])
    return [e.describe(False) for e in entries]


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxOut, response_model_exclude_none=True)
async def get_sandbox(sandbox_id: str, fleet: Fleet, detail: bool = False) -> SandboxOut:
    entry = fleet.get(sandbox_id)
    return entry.describe(detail)


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def delete_sandbox(sandbox_id: str, fleet: Fleet) -> Response:
    if sandbox_id not in fleet.tombstones:  # closing twice is fine, as locally
        fleet.get(sandbox_id)
    await fleet.close(sandbox_id, "client")
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}/ping", response_model=OkOut)
async def ping(sandbox_id: str, fleet: Fleet) -> OkOut:
    entry = fleet.get(sandbox_id)
    return OkOut(ok=await fleet.call(entry, entry.sb.ping()))


@router.post("/sandboxes/{sandbox_id}/expose", response_model=ExposeOut)
async def expose(body: ExposeIn, sandbox_id: str, fleet: Fleet) -> ExposeOut:
    """Open the sandbox's TCP ``port`` on the service's host (127.0.0.1; ``AsyncSandbox.expose``)."""
    entry = fleet.get(sandbox_id)
    host, port = await fleet.call(entry, entry.sb.expose(body.port))
    return ExposeOut(host=host, port=port)


@router.get("/sandboxes/{sandbox_id}/egress", response_model=EgressLogOut)
async def egress_log(sandbox_id: str, fleet: Fleet, since: int | None = Query(default=None, ge=0)) -> EgressLogOut:
    """The sandbox's egress audit log after record ``since`` (``AsyncSandbox.egress_log``),
    with the log's bound and what it dropped (``network_stats()["log"]``)."""
    entry = fleet.get(sandbox_id)
    records = await fleet.call(entry, entry.sb.egress_log(since))
    # the counters read the packet filter (a subprocess) or ask Ray: off the loop
    log = ((await asyncio.to_thread(entry.sb.network_stats)) or {}).get("log") or {}
    return EgressLogOut(records=records, kept=log.get("records", 0), bytes=log.get("bytes", 0),
                        max_bytes=log.get("max_bytes", 0), dropped=log.get("dropped", 0))


_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade", "host", "authorization", "content-length"}


@router.api_route("/sandboxes/{sandbox_id}/ports/{port}/{path:path}", include_in_schema=False,
                  methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def through_port(sandbox_id: str, port: int, path: str, request: Request, fleet: Fleet) -> Response:
    """HTTP to the sandbox's ``port`` through the service (``expose`` on its host, the
    service's token required): ``/v1/sandboxes/{id}/ports/8000/some/page?q=1``."""
    import httpx  # noqa: PLC0415 - the service extra

    entry = fleet.get(sandbox_id)
    if not 1 <= port <= 65535:
        raise SpecError("port", f"not a port number (1-65535): {port}")
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
    body = await request.body()
    for attempt in (0, 1):  # an exposed port dies with its guest (reset, restore): expose again once
        if attempt or port not in entry.exposed:
            entry.exposed[port] = await fleet.call(entry, entry.sb.expose(port))
        host, host_port = entry.exposed[port]
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                up = await client.request(request.method, f"http://{host}:{host_port}/{path}",
                                          params=request.query_params, content=body, headers=headers)
            break
        except httpx.TransportError as e:
            if attempt:
                return Response(f"the sandbox's port {port} does not answer: {e}", status_code=502)
    return Response(up.content, status_code=up.status_code,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP
                             and k.lower() != "content-encoding"})


# commands -------------------------------------------------------------------
@router.post("/sandboxes/{sandbox_id}/run", response_model=ResultOut)
async def run(body: RunIn, sandbox_id: str, fleet: Fleet) -> ResultOut:
    entry = fleet.get(sandbox_id)
    result = await fleet.run(entry, body.cmd, timeout=body.timeout, session=body.session, env=body.env, cwd=body.cwd)
    return ResultOut.of(result)


@router.post("/sandboxes/{sandbox_id}/run/stream",
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "SSE: `stdout`/`stderr` events (data: a JSON string), "
                                             "then one `result` (ResultOut) or `error` (ErrorOut) event"}})
async def run_stream(body: RunIn, sandbox_id: str, fleet: Fleet) -> StreamingResponse:
    entry = fleet.get(sandbox_id)  # before the stream starts: an unknown id is a 404, not an event
    async def events() -> AsyncIterator[str]:
        started = time.monotonic()
        async with fleet.using(entry):
            agen = entry.sb.run_stream(body.cmd, timeout=body.timeout, session=body.session,
                                       env=body.env, cwd=body.cwd)
            try:
                async for item in agen:
                    if isinstance(item, tuple):
                        yield f"event: {item[0]}\ndata: {json.dumps(item[1])}\n\n"
                    else:
                        fleet.record(entry, body.cmd, started, item)
                        yield f"event: result\ndata: {ResultOut.of(item).model_dump_json()}\n\n"
            except SandboxError as e:
                fleet.record(entry, body.cmd, started, error=e)
                fleet.metrics.failures.labels(type(e).__name__).inc()
                yield f"event: error\ndata: {json.dumps(error_body(entry.own(e)))}\n\n"
            finally:
                await agen.aclose()

    # no-cache / no buffering: each event reaches the client as soon as it is written
    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/sandboxes/{sandbox_id}/sessions", response_model=list[str])
async def sessions(sandbox_id: str, fleet: Fleet) -> list[str]:
    entry = fleet.get(sandbox_id)
    return await fleet.call(entry, entry.sb.sessions())


@router.delete("/sandboxes/{sandbox_id}/sessions/{name}", status_code=204)
async def close_session(name: str, sandbox_id: str, fleet: Fleet) -> Response:
    entry = fleet.get(sandbox_id)
    await fleet.call(entry, entry.sb.close_session(name))
    return Response(status_code=204)


# state ----------------------------------------------------------------------
@router.post("/sandboxes/{sandbox_id}/reset", status_code=204)
async def reset(sandbox_id: str, fleet: Fleet) -> Response:
    entry = fleet.get(sandbox_id)
    await fleet.call(entry, entry.sb.reset())
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", response_model=list[SandboxOut], status_code=201)
async def fork(body: ForkIn, sandbox_id: str, fleet: Fleet) -> list[SandboxOut]:
    entry = fleet.get(sandbox_id)
    fleet.reserve(body.n)
    fleet.creating += body.n
    try:
        children = await fleet.call(entry, entry.sb.fork(body.n))
    finally:
        fleet.creating -= body.n
    return [fleet.adopt(sb).describe(False) for sb in children]


@router.post("/sandboxes/{sandbox_id}/restore", status_code=204)
async def restore(body: RestoreIn, sandbox_id: str, fleet: Fleet) -> Response:
    entry = fleet.get(sandbox_id)
    await fleet.call(entry, entry.sb.restore(body.snapshot))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/snapshots", response_model=SnapshotOut, status_code=201)
async def snapshot(sandbox_id: str, fleet: Fleet, store: Store, request: Request) -> SnapshotOut:
    """Snapshot the sandbox into the service's store, charged to the token's quota like an
    upload: 507 (``limit`` token_storage_quota) before anything is copied when the quota is
    used up, or after packing when the new layer does not fit (it is removed again)."""
    entry = fleet.get(sandbox_id)
    quota, key = request.app.state.quota, token_key(request.app.state.token)
    try:
        quota.left(key)
    except SandboxError as e:
        e.sandbox_id = entry.id  # as every error of a sandbox carries its id
        raise
    known = await asyncio.to_thread(store.digests)
    snap = await fleet.call(entry, entry.sb.snapshot())
    # a backend that keeps its layers elsewhere (a Ray host) is charged the tarball it reports
    here = store.tarball(snap.digest).is_file()
    try:
        quota.charge(key, snap.digest, await asyncio.to_thread(store.stored_bytes, snap.digest) if here else snap.size)
    except SandboxError as e:
        if here and snap.digest not in known:  # written by this call: nothing stays uncharged
            await asyncio.to_thread(store.remove, snap.digest)
        e.sandbox_id = entry.id
        raise
    return SnapshotOut.of(snap)
