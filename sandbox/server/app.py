"""``rockroll serve``: sandboxes over HTTP (FastAPI), for the ``remote`` backend's SDK.

    app = create_app(token="...")          # uvicorn.run(app, host="127.0.0.1", port=8765)

REST under ``/v1`` (bearer token), ``/healthz`` (open), ``/metrics`` (Prometheus text,
token), and a dashboard at ``/`` (open page; it reads the token from the URL fragment,
``/#token=...``, which browsers never send to the server, and calls the API with it).

The routes are module-level routers (``sandboxes.py``, ``files.py``, ``snapshots.py``,
``pools.py``) over the wire models (``protocol/wire.py``) and the public sandbox API only; the app holds the
``SandboxFleet`` (``fleet.py``) and the snapshot store they work on. Typed sandbox errors
travel as ``{"error", "message", "sandbox_id"}`` (see ``protocol/wire.py``).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from pathlib import Path
from typing import AsyncContextManager, Protocol, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..deployment.reaper import current_run
from ..errors import CapacityError, SandboxError
from ..protocol.wire import API, AuthError, ErrorOut, HealthOut, PoolIn, error_body, status_of
from ..storage.limits import StorageLimits
from ..storage.snapshots import SnapshotStore
from . import files, rock, sandboxes, snapshots, swerex, terminals
from . import pools as pool_routes  # the name `pools` is create_app's argument
from .metrics import storage_families
from .quota import DEFAULT_QUOTA, TokenQuota
from .deps import Fleet
from .fleet import SandboxFleet

log = logging.getLogger("rockroll.serve")
# Non-JSON routes return a Response (no response_class), so their errors stay documented as JSON.
ERRORS = {code: {"model": ErrorOut} for code in (400, 401, 404, 409, 413, 429, 503, 507)}
XTERM_DIR = Path(__file__).with_name("static") / "xterm"
_XTERM_TYPES = {"xterm.js": "text/javascript", "addon-fit.js": "text/javascript", "xterm.css": "text/css"}
_bearer = HTTPBearer(auto_error=False, description="the server's token (ROCKROLL_TOKEN)")


def auth(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """Every route but ``/``, ``/healthz`` and the OpenAPI document needs the app's token."""
    given = creds.credentials.encode() if creds else b""
    if not hmac.compare_digest(given, request.app.state.token):
        raise AuthError("missing or wrong bearer token" if creds else "missing bearer token")


# open routes (and the token-guarded metrics) ----------------------------------
pages = APIRouter()


@pages.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse((Path(__file__).with_name("dashboard.html")).read_text())


@pages.get("/terminal", response_class=HTMLResponse, include_in_schema=False)
async def terminal_page() -> HTMLResponse:
    """A sandbox's terminal in the browser: ``/terminal#token=...&sandbox=<id>``."""
    return HTMLResponse((Path(__file__).with_name("terminal.html")).read_text())


@pages.get("/static/xterm/{name}", include_in_schema=False)
async def xterm_asset(name: str) -> Response:
    """The vendored xterm.js (``static/xterm/``): only the files there, by name."""
    path = XTERM_DIR / name
    if name not in _XTERM_TYPES and not name.startswith("LICENSE") or "/" in name or not path.is_file():
        return Response("not found", status_code=404)
    return Response(path.read_bytes(), media_type=_XTERM_TYPES.get(name, "text/plain"))


@pages.get("/healthz", response_model=HealthOut)
async def healthz(fleet: Fleet) -> HealthOut:
    return HealthOut(ok=True, run_id=current_run().run_id, sandboxes=len(fleet.entries), backend=fleet.backend)


@pages.get("/metrics", dependencies=[Depends(auth)], responses={200: {"content": {"text/plain": {}}}})
async def metrics(fleet: Fleet) -> Response:
    body, content_type = fleet.metrics.exposition()
    return Response(body, media_type=content_type)


# errors -------------------------------------------------------------------------
async def on_sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
    status = 401 if isinstance(exc, AuthError) else status_of(exc)
    request.app.state.fleet.metrics.failures.labels(type(exc).__name__).inc()
    headers = {}
    if isinstance(exc, CapacityError):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    if isinstance(exc, AuthError):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error_body(exc), status_code=status, headers=headers)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    field = ".".join(str(p) for p in detail[0]["loc"][1:]) if detail else "body"
    request.app.state.fleet.metrics.failures.labels("SpecError").inc()
    return JSONResponse({"error": "SpecError", "field": field or "body",
                         "message": detail[0]["msg"] if detail else "invalid request",
                         "sandbox_id": None, "detail": detail}, status_code=422)


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # Starlette's own refusals (unparsable body, unknown route, wrong method) in our shape too.
    return JSONResponse({"error": "HTTPError", "message": str(exc.detail), "sandbox_id": None},
                        status_code=exc.status_code, headers=exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Last resort only: every failure an input can cause should be a typed 4xx.
    log.exception("unexpected error in %s %s", request.method, request.url.path)
    request.app.state.fleet.metrics.failures.labels("InternalError").inc()
    return JSONResponse({"error": "InternalError", "message": f"{type(exc).__name__}: {exc}",
                         "sandbox_id": None}, status_code=500)


# the app --------------------------------------------------------------------------
class Extension(Protocol):
    """Routes from a part that ``sandbox`` must not import (GEM envs come from ``registry``,
    which depends on ``sandbox``, not the reverse): the caller of ``create_app`` hands them in.
    ``lifespan(app)`` is entered after the fleet starts and left before it stops."""

    router: APIRouter

    def lifespan(self, app: FastAPI) -> AsyncContextManager[None]: ...


def create_app(token: str, *, backend: str = "local", max_sandboxes: int = 256,
               idle_ttl: float | None = 3600.0, reap_interval: float = 1.0,
               limits: StorageLimits | None = None, token_storage_quota: int = DEFAULT_QUOTA,
               pools: list[PoolIn] = (), extensions: Sequence[Extension] = (),
               metrics_address: tuple[str, int] | None = None) -> FastAPI:
    """The service as an ASGI app. ``token`` guards everything but ``/``, ``/healthz``
    and the OpenAPI document. ``limits`` bound what snapshot uploads unpack to (default:
    ``StorageLimits.from_env()``); ``token_storage_quota`` is how many bytes of snapshots
    (uploaded or taken through the service) a token may hold. ``pools``: warm pools to
    keep from the start (filled in the background once the service is up; ``POST
    /v1/pools`` adds more). ``extensions``: more routes, with what they hold while the app
    runs (``rockroll serve`` adds GEM envs). ``metrics_address``: ``(host, port)`` where
    ``/metrics`` is also served without the token (a scraper's port)."""
    if backend == "remote":
        raise SandboxError("the service cannot use backend='remote' (it would call itself)")
    fleet = SandboxFleet(backend=backend, max_sandboxes=max_sandboxes, idle_ttl=idle_ttl,
                     reap_interval=reap_interval)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await fleet.start(list(pools))
        exporter = fleet.metrics.serve(*metrics_address) if metrics_address else None
        try:
            async with contextlib.AsyncExitStack() as stack:
                for extension in extensions:
                    await stack.enter_async_context(extension.lifespan(app))
                yield
        finally:
            if exporter is not None:
                exporter.shutdown()
            await fleet.stop()

    app = FastAPI(title="rockroll sandbox service", version="1", lifespan=lifespan, responses=ERRORS)
    app.state.fleet, app.state.token = fleet, token.encode()
    app.state.store = SnapshotStore(current_run().home, limits)
    app.state.quota = TokenQuota(current_run().home / "service-quota", token_storage_quota)
    fleet.metrics.watch(lambda: storage_families(app.state.quota, app.state.store))
    app.add_exception_handler(SandboxError, on_sandbox_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
    app.include_router(pages)
    for routes in (sandboxes.router, files.router, snapshots.router, pool_routes.router):
        app.include_router(routes, prefix=API, dependencies=[Depends(auth)])
    app.include_router(terminals.router, prefix=API)  # a WebSocket: checks the token itself, before the upgrade
    # ROCK's admin API and SWE-ReX's runtime API (docs/compat.md): their clients' own
    # shapes and headers, so each checks the token itself; documented there, not in OpenAPI.
    for routes in (rock.router, swerex.router, *(e.router for e in extensions)):
        app.include_router(routes, include_in_schema=False)
    return app
