"""The model service: one OpenAI-compatible server in front of any ``Generator`` mode.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
(stream and not), authenticated by a per-sandbox key; the admin routes
``POST /rockroll/keys`` / ``DELETE /rockroll/keys/{key}`` (admin token) issue and revoke
keys (``runtime/model_channel.py`` calls them when a sandbox opens and closes). A key
resolves to its ``Caller`` (sandbox, episode): attribution never trusts the request body.

FastAPI and uvicorn (the ``service`` extra) are imported when the app is built. (No
``from __future__ import annotations`` here: FastAPI reads the route functions'
annotations, and ``Request`` is imported inside ``app()``.)
"""

import json
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .modes import Answer, Call, Caller, Choice, Generator, ModeError, join_pieces
from .protocol import end_events, error_body, finish, parse_request, piece_events, response_body, sse_events
from .records import Recorder, record_of
from .tools import PARSERS

MAX_BODY = 32 << 20  # bytes of one request body (long agent histories fit; a flood does not)


def _head(call: Call) -> tuple[str, str, int, str]:
    """What every body or chunk of one answer names: kind, a fresh id, time, model."""
    rid = ("chatcmpl-" if call.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
    return call.kind, rid, int(time.time()), call.model


def _include_usage(call: Call) -> bool:
    options = call.request.get("stream_options") or {}
    return bool(isinstance(options, dict) and options.get("include_usage"))


class ModelService:
    """``ModelService(mode)``: serve ``mode`` to sandboxes. ``start()`` runs it on a
    loopback port (a uvicorn thread) and returns its URL, the ``model_endpoint`` of a
    ``SandboxSpec``; sandboxes' hosts need ``token`` as ``$ROCKROLL_MODEL_TOKEN``.

    ``records``: a JSONL path receiving one record per call (``records.py``).
    ``tool_parser``: a ``tools.PARSERS`` name. ``model``: the id ``/v1/models`` lists."""

    def __init__(self, mode: Generator, *, token: str | None = None, records: str | Path | None = None,
                 tool_parser: str = "hermes", model: str = "rockroll"):
        if tool_parser not in PARSERS:
            raise ValueError(f"tool_parser must be one of {sorted(PARSERS)}, not {tool_parser!r}")
        self.mode, self.model = mode, model
        self.token = token or secrets.token_urlsafe(32)
        self.parser = PARSERS[tool_parser]
        self.recorder = Recorder(records)
        self._keys: dict[str, Caller] = {}
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # ----------------------------------------------------------------- keys
    def admit(self, sandbox_id: str, episode: str | None = None, records: str | Path | None = None) -> str:
        """A new key whose calls are attributed to ``sandbox_id`` / ``episode``, and recorded
        to ``records`` too (a JSONL file of the caller's: its run's) besides the service's."""
        key = "rr-" + secrets.token_urlsafe(32)
        with self._lock:
            self._keys[key] = Caller(sandbox_id, episode or sandbox_id, Path(records) if records else None)
            self._calls[key] = 0
        return key

    def revoke(self, key: str) -> bool:
        """Refuse ``key`` from now on; False if it was not admitted."""
        with self._lock:
            self._calls.pop(key, None)
            caller = self._keys.pop(key, None)
        if caller is not None:  # its run's file is final once revoke returns
            self.recorder.end(caller)
        return caller is not None

    def caller(self, key: str) -> Caller | None:
        with self._lock:
            return self._keys.get(key)

    def _next_index(self, key: str) -> int | None:
        with self._lock:
            if key not in self._calls:
                return None
            index = self._calls[key]
            self._calls[key] = index + 1
            return index

    # ----------------------------------------------------------------- calls
    async def answer(self, kind: str, key: str, body: Any) -> tuple[int, Any]:
        """Answer one request: ``(status, body)``, where a 200 streamed body is an
        iterator of SSE events."""
        caller = self.caller(key)
        if caller is None:
            return 401, error_body("Incorrect API key provided (unknown, or its sandbox is closed).",
                                   code="invalid_api_key")
        try:
            fields = parse_request(body, kind)
        except ModeError as e:
            return e.status, error_body(e.message, code=e.code, param=e.param)
        index = self._next_index(key)
        if index is None:  # revoked while we parsed
            return 401, error_body("Incorrect API key provided (its sandbox is closed).", code="invalid_api_key")
        call = Call(caller=caller, index=index, **fields)
        start = time.monotonic()
        mode = type(self.mode).__name__
        stream = getattr(self.mode, "stream", None)
        if (stream is not None and call.request.get("stream") and call.sampling.n == 1
                and not (call.tools and call.tool_choice != "none")):
            return await self._stream(call, stream(call), start, mode)
        try:
            answer = await self.mode.generate(call)
        except Exception as e:  # noqa: BLE001 - a broken mode is a 500 to one caller, not a dead server
            return self._refused(call, e, start, mode)
        finished = [finish(c, call.tools, call.tool_choice, self.parser) for c in answer.choices]
        self._record(call, answer, finished, start, mode)
        return 200, self._body(call, answer, finished)

    def _record(self, call: Call, answer: Answer | None, finished: list, start: float, mode: str,
                error: str | None = None) -> None:
        self.recorder.write(record_of(call, answer, finished, time.monotonic() - start, mode, error), call.caller)

    def _refused(self, call: Call, e: Exception, start: float, mode: str) -> tuple[int, dict]:
        """A call the mode failed: recorded, and the caller's error (a ``ModeError``'s own
        status, anything else a 500 ``mode_failed``)."""
        message = e.message if isinstance(e, ModeError) else f"{type(e).__name__}: {e}"
        self._record(call, None, [], start, mode, message)
        if isinstance(e, ModeError):
            return e.status, error_body(e.message, "invalid_request_error" if e.status < 500 else "server_error",
                                        code=e.code, param=e.param)
        return 500, error_body(message, "server_error", code="mode_failed")

    async def _stream(self, call: Call, pieces, start: float, mode: str) -> tuple[int, Any]:
        """Stream the mode's pieces as they come. The first is awaited here, so a call the
        mode refuses gets its error status rather than a stream that breaks."""
        try:
            first = await anext(pieces)
        except StopAsyncIteration:
            first = Answer([Choice(text="")])
        except Exception as e:  # noqa: BLE001
            return self._refused(call, e, start, mode)
        return 200, self._pieces(call, first, pieces, start, mode)

    async def _pieces(self, call: Call, first: Answer, pieces, start: float, mode: str):
        """SSE events of a piece-by-piece answer; recorded whole at its end. A failure
        after the first piece can only be reported in the stream: an OpenAI error event."""
        head = _head(call)
        got, error = [first], "the caller went away mid-stream"
        try:
            for event in piece_events(*head, first.choices[0], call.sampling.logprobs, first=True):
                yield event
            async for piece in pieces:
                got.append(piece)
                for event in piece_events(*head, piece.choices[0], call.sampling.logprobs, first=False):
                    yield event
            error = None
        except Exception as e:  # noqa: BLE001 - a broken mode ends one stream, not the server
            error = e.message if isinstance(e, ModeError) else f"{type(e).__name__}: {e}"
        finally:  # recorded before the caller hears the end; also when the caller went away
            await pieces.aclose()  # a caller gone: stop generating
            answer = join_pieces(got)
            finished = [finish(c, None, None, self.parser) for c in answer.choices]
            self._record(call, answer, finished, start, mode, error)
        if error is not None:
            yield f"data: {json.dumps(error_body(error, 'server_error', code='mode_failed'))}\n\n"
            return
        for event in end_events(*head, answer, finished[0][2], _include_usage(call)):
            yield event

    def _body(self, call: Call, answer: Answer, finished: list):
        args = (*_head(call), answer, finished, call.sampling.logprobs)
        if call.request.get("stream"):
            return sse_events(*args, _include_usage(call))
        return response_body(*args)

    # ----------------------------------------------------------------- app
    def app(self):
        """The FastAPI app (built on each call; ``start()`` serves one)."""
        from fastapi import FastAPI, Request  # noqa: PLC0415 - the service extra
        from fastapi.responses import JSONResponse, StreamingResponse  # noqa: PLC0415

        app = FastAPI(title="rockroll model service", docs_url=None, redoc_url=None)

        def bearer(request: Request) -> str:
            auth = request.headers.get("authorization", "")
            return auth[7:].strip() if auth.lower().startswith("bearer ") else ""

        async def call(kind: str, request: Request):
            # Read with a cap: a sandbox must not make the host buffer an unbounded body.
            raw = bytearray()
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > MAX_BODY:
                    return JSONResponse(error_body(f"request body over {MAX_BODY} bytes", code="too_large"), 413)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            status, out = await self.answer(kind, bearer(request), body)
            if status == 200 and not isinstance(out, dict):
                return StreamingResponse(out, media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            return JSONResponse(out, status_code=status)

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await call("chat", request)

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await call("completion", request)

        @app.get("/v1/models")
        async def models(request: Request):
            if self.caller(bearer(request)) is None:
                return JSONResponse(error_body("Incorrect API key provided.", code="invalid_api_key"), 401)
            return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                                "owned_by": "rockroll"}]}

        def admin(request: Request) -> bool:
            return secrets.compare_digest(bearer(request), self.token)

        @app.post("/rockroll/keys")
        async def issue(request: Request):
            if not admin(request):
                return JSONResponse(error_body("admin token required", code="invalid_api_key"), 401)
            try:
                body = await request.json()
            except ValueError:
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("sandbox_id"), str) or not body["sandbox_id"]:
                return JSONResponse(error_body("sandbox_id: must be a non-empty string", param="sandbox_id"), 400)
            episode = body.get("episode")
            return {"key": self.admit(body["sandbox_id"], episode if isinstance(episode, str) else None)}

        @app.delete("/rockroll/keys/{key}")
        async def revoke(key: str, request: Request):
            if not admin(request):
                return JSONResponse(error_body("admin token required", code="invalid_api_key"), 401)
            return {"revoked": self.revoke(key)}

        @app.exception_handler(404)
        async def not_found(request: Request, exc):
            return JSONResponse(error_body(f"no route {request.method} {request.url.path}", code="not_found"), 404)

        return app

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: a free port) in a background thread; returns the URL."""
        try:
            import fastapi  # noqa: F401, PLC0415 - app() builds on it
            import uvicorn  # noqa: PLC0415 - the service extra
        except ImportError as e:
            raise ImportError(f"the model service (agent envs, rock/Agent-v0) needs the service extra: "
                              f"pip install 'rockroll[service]' ({e})") from e

        config = uvicorn.Config(self.app(), host=host, port=port, log_level="warning", lifespan="off")
        self._server = server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=server.run, name="rockroll-modelservice", daemon=True)
        self._thread.start()
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the model service could not start on {host}:{port}")
            time.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{bound}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> "ModelService":
        if self.url is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

