"""The host end of a sandbox's model endpoint: an OpenAI-compatible URL inside a sandbox
that still has no network.

Design. A sandbox with ``SandboxSpec(model_endpoint=URL)`` sees
``OPENAI_BASE_URL=http://127.0.0.1:8080/v1`` and its own ``OPENAI_API_KEY`` in every
session. Port 8080 is a listener of the sandbox's guest (``guest/model.py``, ``ModelChannel``)
in the sandbox's *own* network namespace, which still holds nothing but loopback. Each
connection accepted there travels as frames (``mc_open`` / ``mc_data`` / ``mc_close``)
over the guest's control pipe, which the host already holds; ``ModelRelay`` opens one TCP
connection per sandbox connection to the model service at ``URL`` (a loopback server of
the host) and pipes the bytes both ways. Why this way:

- No network is opened: no veth, no bridge, no published port, no shared socket file. The
  sandbox can reach exactly one thing, through a process we wrote, and an attack on any
  other address (host loopback included) still finds an empty namespace.
- It costs one frame hop per read, on a pipe that is already there: no file polling (ROCK
  bridges calls through log files), no ``exec`` per answer.
- The same guest runs in local namespaces and inside docker containers (enter mode joins
  the container's network namespace before listening), so both backends get it from this
  one code path. The remote and ray backends run this same ``GuestSandbox`` on their host,
  so the relay lives there; the model service URL must be reachable from that host.
- The relay pipes bytes and parses nothing: HTTP/1.1 keep-alive, streaming (SSE) and any
  client work unchanged.

Keys. Attribution is by key: when the sandbox starts, the host asks the model service for
a fresh key for this sandbox id (``POST /rockroll/keys`` with the service's admin token)
and revokes it on close, so calls with a closed sandbox's key are refused. A key is 32
random bytes that exist only in that sandbox's environment (other sandboxes have separate
pid and mount namespaces and cannot read it); each sandbox connection is its own upstream
connection, so no sandbox can read or answer another's calls. The guest re-exports the sandbox's own key over restored session state, so a
sandbox forked from another's snapshot does not inherit its key.

The admin token. Where ``open_sandbox`` runs (the driver), it is ``$ROCKROLL_MODEL_TOKEN``
(``current_token()``). A sandbox remembers the token it was opened with (for its revoke and
its forks). A host that opens sandboxes for a driver elsewhere (the ray host actor,
``rockroll serve``) gets the driver's token with the create call, never in the spec (the
service lists specs), and opens the sandbox inside ``admin_token(token)``. The token never
enters a sandbox: sessions get only their key, and guests start with an empty environment
(``deployment/process.py``), so ``/proc/*/environ`` inside holds nothing of the host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from ..errors import SandboxStartError
from ..protocol.tokens import TOKEN_ENV

SANDBOX_PORT = 8080  # the model endpoint's port inside every sandbox


def host_port(url: str) -> tuple[str, int]:
    """The (host, port) of an ``http://host:port`` URL."""
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def sandbox_env(key: str) -> dict[str, str]:
    """The variables a sandbox's sessions see."""
    return {"OPENAI_BASE_URL": f"http://127.0.0.1:{SANDBOX_PORT}/v1", "OPENAI_API_KEY": key}


def _admin(url: str, method: str, path: str, body: dict | None, sandbox_id: str, token: str | None) -> dict:
    if not token:
        raise SandboxStartError(f"spec.model_endpoint is set but no admin token is: set ${TOKEN_ENV} "
                                "(the model service's token) where open_sandbox runs", sandbox_id=sandbox_id)
    req = urllib.request.Request(url.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SandboxStartError(f"cannot reach the model service at {url}: {e}", sandbox_id=sandbox_id) from e


def issue_key(url: str, sandbox_id: str, token: str | None) -> str:
    """A fresh key for ``sandbox_id`` from the model service at ``url``, asked with the
    admin ``token`` (blocking)."""
    return _admin(url, "POST", "/rockroll/keys", {"sandbox_id": sandbox_id}, sandbox_id, token)["key"]


def revoke_key(url: str, key: str, sandbox_id: str, token: str | None) -> None:
    """Refuse ``key`` from now on (blocking; a service already gone is fine)."""
    with contextlib.suppress(SandboxStartError):
        _admin(url, "DELETE", "/rockroll/keys/" + urllib.parse.quote(key, safe=""), None, sandbox_id, token)


class ModelRelay:
    """Pipes the sandbox's model connections to the model service (one upstream TCP
    connection per sandbox connection). ``send(header, payload)`` writes a frame to the
    guest."""

    def __init__(self, url: str, send: Callable[[dict, bytes], None]):
        self.host, self.port = host_port(url)
        self.send = send
        self.conns: dict[int, asyncio.Queue] = {}   # bytes (or None: closed) for upstream
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    def on_frame(self, header: dict, payload: bytes) -> None:
        cid, op = header.get("conn"), header.get("op")
        if self.closed:
            return
        if op == "mc_open" and cid not in self.conns:
            queue: asyncio.Queue = asyncio.Queue()
            self.conns[cid] = queue
            task = asyncio.ensure_future(self._pipe(cid, queue))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif cid in self.conns:
            self.conns[cid].put_nowait(payload if op == "mc_data" else None)

    async def _pipe(self, cid: int, queue: asyncio.Queue) -> None:
        writer = None
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)

            async def upstream() -> None:
                while (data := await queue.get()) is not None:
                    writer.write(data)
                    await writer.drain()
                writer.close()

            up = asyncio.ensure_future(upstream())
            try:
                while data := await reader.read(1 << 16):
                    self.send({"op": "mc_data", "conn": cid}, data)
            finally:
                up.cancel()
        except OSError:
            pass  # the service is unreachable: the sandbox sees its connection closed
        finally:
            self.conns.pop(cid, None)
            if writer is not None:
                writer.close()
            if not self.closed:  # after close() the guest's pipe may be gone (or its fd reused)
                self.send({"op": "mc_close", "conn": cid}, b"")

    def close(self) -> None:
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        self.conns.clear()
