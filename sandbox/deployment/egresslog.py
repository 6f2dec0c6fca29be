"""A sandbox's egress audit log: one JSON record per HTTP request, per TLS or opaque
connection (a tunnel after ``CONNECT`` / ``Upgrade`` counts as one), per DNS query, and per
attempt the gateway refused, with its reason. Written by the gateway (``gateway.py``) on
the host side, read through ``AsyncSandbox.egress_log`` (and ``GET /v1/sandboxes/{id}/egress``).
Pure: no I/O; the caller gives the clock.

A record: ``seq`` (1, 2, ... per sandbox: ``egress_log(since=seq)`` reads on from there),
``time`` (Unix seconds, when the request or connection began), ``kind`` (``http``, ``https``
for a request inside TLS the gateway inspected, ``tls``, ``tcp``, ``tunnel``, ``dns``),
``method``, ``host`` (the request's host, the TLS server name, the ``CONNECT`` target's or the DNS name; None where none is known), ``path`` (the request
target as sent), ``ip``, ``port``, ``status`` (the answer's status code when known: the
server's, or the gateway's own 4xx for a refused request), ``bytes_out`` (sandbox to far
end) and ``bytes_in`` (back), exactly the bytes the gateway forwarded for it (a refused
request's are 0: nothing of it went on, and the gateway's own answer is not the far end's),
``decision`` (``allowed`` / ``refused``), ``reason`` (a refused one's, the key it is
counted under in ``network_stats()["denied"]``) and ``injected`` (the names of the headers
the gateway set on the request from the policy's secrets, ``inject.py``; never a value).
Inside inspected TLS the bytes are the plaintext the gateway forwarded, heads as rewritten.

Design, and why:

- **In the gateway's memory, not a file.** The records are made by the process that owns
  the sandbox, outside every namespace of it; nothing of the log is on a filesystem the
  sandbox could see, and no byte of it comes from the sandbox but fields the gateway parsed
  and ``json.dumps`` encoded (a target or host cannot hold a newline or end a record: each
  record is one line, escaped). It lives as long as the sandbox, across its guests (a
  ``reset`` / ``restore`` keeps it), like the counters of ``network_stats``.
- **Bounded in bytes** (``MAX_BYTES`` of encoded lines a sandbox, 1 MiB: some thousands of
  records), **the oldest dropped first**, each drop counted (``stats()["dropped"]``, in
  ``network_stats()["log"]``). Bytes, not records: a record's size depends on what the
  sandbox sends (a target may be 32 KiB), so a count of records would bound nothing; each
  text field is also cut at ``FIELD_MAX`` characters, so one record is small. A reader that
  polls with ``since`` sees a gap in ``seq`` where records were dropped before it read them.
- **Exact bytes per request on a kept-alive connection** need the answers split as the
  server framed them: ``ResponseFramer`` follows each response's framing (status line,
  ``Content-Length``, chunked, none for ``HEAD`` / 1xx / 204 / 304, to the close otherwise)
  and hands each byte to the request it answers, in order (pipelining included). What it
  cannot read (a malformed answer) it gives to the oldest request still waiting, whole,
  to the close: the sum over records stays exact; the split is then the best it can tell.
"""

from __future__ import annotations

import collections
import json
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

MAX_BYTES = 1 << 20  # encoded bytes of one sandbox's records at most; a process may change it before its sandboxes start
FIELD_MAX = 1024  # characters of a host or path kept in a record
KINDS = ("http", "https", "tls", "tcp", "tunnel", "dns")


class EgressLog:
    """One sandbox's records: a ring bounded in encoded bytes (the module docstring).
    ``add`` from the gateway's loop, ``records`` / ``stats`` from any thread."""

    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self._lines: collections.deque[tuple[int, str]] = collections.deque()
        self._bytes = 0
        self._seq = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, *, time: float, kind: str, decision: str, reason: str | None = None, method: str | None = None,
            host: str | None = None, path: str | None = None, ip: str | None = None, port: int | None = None,
            status: int | None = None, bytes_out: int = 0, bytes_in: int = 0, injected: tuple[str, ...] = ()) -> None:
        with self._lock:
            self._seq += 1
            record = {"seq": self._seq, "time": round(time, 6), "kind": kind, "method": _cut(method),
                      "host": _cut(host), "path": _cut(path), "ip": ip, "port": port, "status": status,
                      "bytes_out": bytes_out, "bytes_in": bytes_in, "decision": decision, "reason": reason,
                      "injected": list(injected)}
            line = json.dumps(record, separators=(",", ":"))  # ASCII, control characters escaped: one line
            self._lines.append((self._seq, line))
            self._bytes += len(line) + 1  # as a JSON Lines file would hold it
            while self._bytes > self.max_bytes and self._lines:
                _, old = self._lines.popleft()
                self._bytes -= len(old) + 1
                self.dropped += 1

    def records(self, since: int | None = None) -> list[dict]:
        """The records kept whose ``seq`` is above ``since`` (all: None), oldest first."""
        with self._lock:
            lines = [line for seq, line in self._lines if since is None or seq > since]
        return [json.loads(line) for line in lines]

    def stats(self) -> dict:
        """``records`` and ``bytes`` kept, ``max_bytes``, and ``dropped`` (the oldest, to stay under it)."""
        with self._lock:
            return {"records": len(self._lines), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "dropped": self.dropped}


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= FIELD_MAX else text[:FIELD_MAX] + "..."


# -- the server's side of an HTTP connection, only as far as framing tells --------------

class Piece(NamedTuple):
    """``n`` bytes of the server's stream: of the current response (``done``: it ends with
    them; ``status``: its final status once known), or, ``tunnel``, after a switch."""
    n: int
    status: int | None
    done: bool
    tunnel: bool = False


_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")
_HEAD, _BODY, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE, _TUNNEL, _LOST = range(9)
_HEAD_MAX = 64 * 1024


class ResponseFramer:
    """Incremental, observe-only: ``expect(method)`` for each request forwarded, in order;
    ``feed(bytes)`` gives ``Piece``s that cover the bytes exactly, in order. Never raises:
    what it cannot read goes to the current response until the close (``_LOST``)."""

    def __init__(self) -> None:
        self._methods: collections.deque[str] = collections.deque()
        self._buf = bytearray()
        self._state = _HEAD
        self._left = 0
        self._status: int | None = None
        self._head_bytes = 0  # bytes of the current response's heads (1xx ones too) scanned into _buf

    def expect(self, method: str) -> None:
        self._methods.append(method)

    def feed(self, data: bytes) -> list[Piece]:
        out: list[Piece] = []
        if self._state in (_TUNNEL, _LOST, _TO_CLOSE):
            if data:
                out.append(Piece(len(data), self._status, False, self._state == _TUNNEL))
            return out
        self._buf += data
        while self._buf and self._step(out):
            pass
        return out

    def ahead(self) -> float:
        """How many of the server's next bytes need not be shown to ``feed`` (``skip`` counts
        them): the rest of a body or a chunk of known length, everything after a switch or
        till the close (``math.inf``); 0 while framing reads."""
        if self._state in (_TUNNEL, _LOST, _TO_CLOSE):
            return math.inf
        return self._left if self._state in (_BODY, _CHUNK_DATA) and not self._buf else 0

    def skip(self, n: int) -> list[Piece]:
        """``feed`` of ``n`` bytes the caller forwarded unseen, at most ``ahead()`` of them."""
        if n > self.ahead():
            raise ValueError(f"skip({n}): only {self.ahead()} bytes may pass unseen")
        if self._state in (_TUNNEL, _LOST, _TO_CLOSE):
            return [Piece(n, self._status, False, self._state == _TUNNEL)] if n else []
        out: list[Piece] = []
        self._body(out, n)
        return out

    def _piece(self, out: list[Piece], n: int, done: bool) -> None:
        del self._buf[:n]
        if n or done:
            out.append(Piece(n, self._status, done))
        if done:
            self._status, self._state = None, _HEAD
            if self._methods:
                self._methods.popleft()

    def _body(self, out: list[Piece], n: int) -> None:
        """``n`` bytes of a body or a chunk's data (``_buf``'s first, or skipped)."""
        self._left -= n
        if self._left:
            self._piece(out, n, False)
        elif self._state == _BODY:
            self._piece(out, n, True)
        else:
            self._piece(out, n, False)
            self._state = _CHUNK_END

    def _rest(self, out: list[Piece], state: int) -> bool:
        """Everything from here on is the current response's (``_TO_CLOSE``, ``_LOST``) or the tunnel's."""
        self._state = state
        if self._buf:
            out.append(Piece(len(self._buf), self._status, False, state == _TUNNEL))
            del self._buf[:]
        return False

    def _step(self, out: list[Piece]) -> bool:
        if self._state == _HEAD:
            end = self._buf.find(b"\r\n\r\n")
            if end == -1:
                if len(self._buf) > _HEAD_MAX:
                    return self._rest(out, _LOST)
                return False
            m = _STATUS.match(self._buf)
            if m is None or not self._methods:  # not a response, or one nothing asked for
                return self._rest(out, _LOST)
            status, head_len = int(m.group(1)), end + 4
            method = self._methods[0]
            head = bytes(self._buf[:head_len]).lower()
            if 100 <= status < 200 and status != 101:  # interim: the final answer follows, same request
                out.append(Piece(head_len, None, False))
                del self._buf[:head_len]
                return True
            self._status = status
            if status == 101 or (method == "CONNECT" and 200 <= status < 300):
                self._piece(out, head_len, True)
                self._methods.clear()
                return self._rest(out, _TUNNEL)
            if method == "HEAD" or status in (204, 304):
                self._piece(out, head_len, True)
                return True
            lengths = re.findall(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*\r\n", head)
            if re.search(rb"\r\ntransfer-encoding:[^\r]*chunked", head):
                out.append(Piece(head_len, status, False))
                del self._buf[:head_len]
                self._state = _CHUNK_LINE
                return True
            if lengths and len(set(lengths)) == 1:
                self._left = int(lengths[0])
                if not self._left:
                    self._piece(out, head_len, True)
                    return True
                out.append(Piece(head_len, status, False))
                del self._buf[:head_len]
                self._state = _BODY
                return True
            out.append(Piece(head_len, status, False))
            del self._buf[:head_len]
            return self._rest(out, _TO_CLOSE)
        if self._state in (_BODY, _CHUNK_DATA):
            self._body(out, min(self._left, len(self._buf)))
            return True
        if self._state == _CHUNK_END:
            if len(self._buf) < 2:
                return False
            if self._buf[:2] != b"\r\n":
                return self._rest(out, _LOST)
            self._piece(out, 2, False)
            self._state = _CHUNK_LINE
            return True
        # _CHUNK_LINE or _TRAILER: one CRLF-ended line
        end = self._buf.find(b"\r\n")
        if end == -1:
            return False if len(self._buf) <= _HEAD_MAX else self._rest(out, _LOST)
        line = bytes(self._buf[:end])
        if self._state == _TRAILER:
            self._piece(out, end + 2, not line)
            return True
        m = re.fullmatch(rb"([0-9A-Fa-f]{1,15})(;.*)?", line)
        if m is None:
            return self._rest(out, _LOST)
        self._left = int(m.group(1), 16)
        self._piece(out, end + 2, False)
        self._state = _CHUNK_DATA if self._left else _TRAILER
        return True


# -- what the gateway writes a connection's records through ----------------------------

@dataclass
class _Exchange:
    time: float
    method: str | None
    host: str | None
    path: str | None
    bytes_out: int = 0
    bytes_in: int = 0
    status: int | None = None
    request_done: bool = False
    answered: bool = False
    refused: str | None = None
    injected: tuple[str, ...] = ()  # the names of the headers the gateway set (never their values)


@dataclass
class Connection:
    """One TCP connection's records, as the gateway forwards its bytes (``sent`` / ``received``
    from its upstream, ``request`` / ``request_done`` / ``refuse`` from its HTTP reading,
    ``switched`` after a tunnel or an upgrade, ``close`` at its end: what is still open is
    written then). ``kind``: ``http`` (a record per request), ``tls`` / ``tcp`` (one for the
    connection)."""

    log: EgressLog
    clock: Callable[[], float]
    ip: str
    port: int
    kind: str = "tcp"
    host: str | None = None
    http_kind: str = "http"  # what a request's record is: ``https`` inside inspected TLS
    _exchanges: collections.deque = field(default_factory=collections.deque)
    _framer: ResponseFramer = field(default_factory=ResponseFramer)
    _tunnel: _Exchange | None = None  # the connection's one record (tls, tcp, tunnel)
    _last: _Exchange | None = None  # the last request allowed (a switch's tunnel is to its host)
    _early_in: int = 0  # the tunnel's bytes that came before the gateway heard of the switch
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.kind != "http":
            self._tunnel = _Exchange(self.clock(), None, self.host, None)

    # -- HTTP, request by request
    def request(self, method: str, host: str, path: str, injected: tuple[str, ...] = ()) -> None:
        """A request head allowed (its bytes are ``sent`` next), with the names of the
        headers the gateway set on it; the one before is complete."""
        if self._tunnel is not None:
            return  # inside a tunnel: its bytes are the tunnel's
        if self._exchanges:
            self._exchanges[-1].request_done = True
        self._last = _Exchange(self.clock(), method, host, path, injected=injected)
        self._exchanges.append(self._last)
        self._framer.expect(method)
        self._emit()

    def request_done(self) -> None:
        """The last request's body has all been sent."""
        if self._exchanges:
            self._exchanges[-1].request_done = True
            self._emit()

    def refuse(self, reason: str, *, kind: str | None = None, status: int | None = None, method: str | None = None,
               host: str | None = None, path: str | None = None) -> None:
        """A request, TLS server name or connection the gateway did not forward: a record
        of its own, after those before it (a connection's own record, if nothing went
        through it yet, is this one)."""
        if self._exchanges:
            self._exchanges[-1].request_done = True
        if self.kind != "http" and self._tunnel is not None and not (self._tunnel.bytes_in or self._tunnel.bytes_out):
            self._tunnel = None
        ex = _Exchange(self.clock(), method, host, path, status=status, request_done=True, answered=True,
                       refused=reason)
        if self._tunnel is not None or not self._exchanges:
            self._write(ex, kind or self.http_kind)
        else:
            self._exchanges.append(ex)
            self._emit()

    def as_http(self, kind: str = "http") -> None:
        """The connection's first bytes are HTTP (``https``: inside TLS the gateway
        terminated): a record per request (unless it is a tunnel already, or its server
        spoke first)."""
        if self.kind != "http" and self._tunnel is not None and not (self._tunnel.bytes_in or self._tunnel.bytes_out):
            self.kind, self._tunnel, self.http_kind = "http", None, kind

    def switched(self) -> None:
        """The server agreed to the last request's ``CONNECT`` / ``Upgrade``: the rest of the
        connection is one ``tunnel`` record, to the host that request named."""
        last = self._last
        self._tunnel = _Exchange(self.clock(), last.method if last else None, last.host if last else self.host, None,
                                 bytes_in=self._early_in)
        if last is not None:
            last.request_done = True
        self._emit()

    def named(self, kind: str, host: str | None) -> None:
        """The connection turned out to be ``kind`` (its first bytes read), for ``host``."""
        if self._tunnel is not None and self.kind != "http":
            self.kind, self._tunnel.host = kind, host

    # -- bytes, as forwarded
    def sent(self, n: int) -> None:
        if self._tunnel is not None:
            self._tunnel.bytes_out += n
        elif self._exchanges:
            self._exchanges[-1].bytes_out += n

    def ahead(self) -> float:
        """How many of the server's next bytes may be forwarded unseen (``received_unseen``):
        ``ResponseFramer.ahead``; all of a connection that is not HTTP."""
        return math.inf if self._tunnel is not None and self.kind != "http" else self._framer.ahead()

    def received_unseen(self, n: int) -> None:
        """``n`` bytes forwarded without being read here (zero-copy), at most ``ahead()``."""
        if self._tunnel is not None and self.kind != "http":
            self._tunnel.bytes_in += n
        else:
            self._pieces(self._framer.skip(n))

    def received(self, data: bytes) -> None:
        if self._tunnel is not None and self.kind != "http":
            self._tunnel.bytes_in += len(data)
        else:
            self._pieces(self._framer.feed(data))

    def _pieces(self, pieces: list[Piece]) -> None:
        for p in pieces:
            if p.tunnel:
                if self._tunnel is not None:
                    self._tunnel.bytes_in += p.n
                else:
                    self._early_in += p.n
                continue
            ex = next((e for e in self._exchanges if not e.answered), None)
            if ex is None:  # the server's bytes before or past every request: the last one's
                if not self._exchanges:
                    continue
                ex = self._exchanges[-1]
            ex.bytes_in += p.n
            if p.status is not None:
                ex.status = p.status
            if p.done:
                ex.answered = True
        self._emit()

    # -- records
    def _emit(self) -> None:
        while self._exchanges and self._exchanges[0].answered and self._exchanges[0].request_done:
            ex = self._exchanges.popleft()
            self._write(ex, self.http_kind if ex.method is not None or ex.status is not None else self.kind)

    def _write(self, ex: _Exchange, kind: str) -> None:
        self.log.add(time=ex.time, kind=kind, method=ex.method, host=ex.host, path=ex.path, ip=self.ip,
                     port=self.port, status=ex.status, bytes_out=ex.bytes_out, bytes_in=ex.bytes_in,
                     decision="refused" if ex.refused else "allowed", reason=ex.refused, injected=ex.injected)

    def close(self) -> None:
        """The connection ended: every record still open is written, in order."""
        if self._closed:
            return
        self._closed = True
        while self._exchanges:
            self._write(self._exchanges.popleft(), self.http_kind)
        if self._tunnel is not None:
            kind = "tunnel" if self.kind == "http" else self.kind
            self._write(self._tunnel, kind)
