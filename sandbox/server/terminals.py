"""A sandbox's terminal over a WebSocket: ``/v1/sandboxes/{id}/terminal``.

The token is checked before the upgrade (a wrong one is refused with 403, no WebSocket
is opened): as ``Authorization: Bearer <token>`` (the SDK, ``runtime/remote.py``), or, from
a browser, which cannot set that header on a WebSocket, as the subprotocol
``bearer.<token>`` beside ``rockroll.terminal`` (the dashboard; a subprotocol, not the
query string, so no access log records it).

The query string opens the terminal (``open_terminal``'s arguments): ``rows``, ``cols``,
``cmd`` (repeated: an argv; once with ``shell=1``: a command line), ``cwd``, ``env`` (a
JSON object), ``idle_timeout`` (seconds, or ``none``; default 600). Then binary messages are keys (client to server) and output (server to
client); text messages are JSON controls: ``{"resize": [rows, cols]}``, ``{"signal": 2}``
from the client; ``{"opened": pid}`` first and ``{"exit": code}`` last from the server,
which then closes the socket. A client that goes away (closed, or killed: the connection
drops) closes its terminal, so nothing it started outlives it.

The output goes as fast as the socket takes it: the guest's window (``PTY_WINDOW``) is
acknowledged only once a chunk was sent, so a slow reader stops the program, not the
service's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from ..base import terminal_request
from ..errors import SandboxError, SpecError
from ..protocol.wire import error_body, status_of
from .fleet import SandboxFleet

router = APIRouter()
SUBPROTOCOL = "rockroll.terminal"


def given_token(ws: WebSocket) -> tuple[bytes, str | None]:
    """The token the client sent, and the subprotocol to answer with (a browser's)."""
    header = ws.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip().encode(), None
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    token = next((p[len("bearer."):] for p in offered if p.startswith("bearer.")), "")
    return token.encode(), SUBPROTOCOL if SUBPROTOCOL in offered else None


def _open_args(ws: WebSocket) -> dict:
    q = ws.query_params
    argv = q.getlist("cmd")
    cmd = (argv[0] if q.get("shell") == "1" and argv else argv) or None
    numbers: dict = {}
    for name, kind, default in (("rows", int, 24), ("cols", int, 80), ("idle_timeout", float, 600.0)):
        try:
            numbers[name] = kind(q[name]) if q.get(name) else default
        except ValueError:
            if name != "idle_timeout" or q[name] != "none":
                raise SpecError(name, f"not a number: {q[name]!r}") from None
            numbers[name] = None  # never
    try:
        env = json.loads(q["env"]) if q.get("env") else None
    except ValueError:
        raise SpecError("env", "not a JSON object") from None
    if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise SpecError("env", "not a JSON object of strings")
    return terminal_request(cmd, numbers["rows"], numbers["cols"], env, q.get("cwd") or None,
                            numbers["idle_timeout"])


@router.websocket("/sandboxes/{sandbox_id}/terminal")
async def terminal(ws: WebSocket, sandbox_id: str) -> None:
    token, subprotocol = given_token(ws)
    if not hmac.compare_digest(token, ws.app.state.token):
        await ws.close(code=1008)  # before accept: the server answers the upgrade with 403
        return
    fleet: SandboxFleet = ws.app.state.fleet
    await ws.accept(subprotocol=subprotocol)
    try:
        entry = fleet.get(sandbox_id)
        args = _open_args(ws)
        term = await fleet.call(entry, entry.sb.open_terminal(args["argv"] or args["command"], rows=args["rows"],
                                                               cols=args["cols"], cwd=args["cwd"], env=args["env"],
                                                               idle_timeout=args["idle_timeout"]))
    except SandboxError as e:  # typed, as the REST routes answer it: the SDK raises the same class
        await ws.send_text(json.dumps({"error": error_body(e), "status": status_of(e)}))
        await ws.close(code=1011)
        return
    await ws.send_text(json.dumps({"opened": True}))
    async with fleet.using(entry):  # an open terminal keeps its sandbox from the idle reaper
        await _serve(ws, term)


async def _serve(ws: WebSocket, term) -> None:
    pump = asyncio.ensure_future(_pump_output(ws, term))
    try:
        while True:
            receive = asyncio.ensure_future(ws.receive())
            done, _ = await asyncio.wait({receive, pump}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:
                receive.cancel()
                break
            msg = receive.result()
            if msg["type"] == "websocket.disconnect":
                break
            if msg.get("bytes") is not None:
                await term.write(msg["bytes"])
            elif msg.get("text"):
                control = json.loads(msg["text"])
                if "resize" in control:
                    await term.resize(int(control["resize"][0]), int(control["resize"][1]))
                if "signal" in control:
                    await term.signal(int(control["signal"]))
                if "input" in control:  # keys as text (a browser's xterm.js onData)
                    await term.write(str(control["input"]))
    except (WebSocketDisconnect, SandboxError, ValueError, KeyError, TypeError):
        pass
    finally:
        pump.cancel()
        with contextlib.suppress(BaseException):
            await pump
        await term.close()  # the client is gone (or the process ended): nothing stays behind
        with contextlib.suppress(Exception):
            await ws.close()


async def _pump_output(ws: WebSocket, term) -> None:
    while True:
        data = await term.read_bytes()  # raw: the client decodes (xterm.js does)
        if data is None:
            await ws.send_text(json.dumps({"exit": term.exit_code}))
            return
        await ws.send_bytes(data)
