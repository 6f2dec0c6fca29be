"""The client's side of a plain-HTTP connection as the gateway reads it (``gateway.py``):
request after request (keep-alive, pipelined in one write), each head parsed and refused
or handed over to be judged, each body's framing followed so the next head is found.
Pure: bytes in, events out, no I/O and no clock.

Why every head, and strictly: the upstream server (a CDN edge holds many names on one
address) routes each request by its own target and ``Host``, so a check of the first head
only lets the second one go anywhere. And where this reader and the server could split
the stream into requests differently (request smuggling), a request the gateway never saw
would reach the server; so whatever two HTTP parsers may read two ways is refused rather
than guessed: ``Content-Length`` and ``Transfer-Encoding`` together, two of either, a
coding other than ``chunked``, obsolete line folding, a bare CR or LF, a header name with
space before its colon, blank lines before a request line. A head is bounded
(``HEAD_MAX``); how long one may take to come is the gateway's (``gateway.HEAD_S``).

A ``CONNECT`` or a request asking to ``Upgrade`` makes the rest of the stream another
protocol *if* the server agrees, which only its answer tells. So it is taken as a
connection's first request only (the first bytes the server sends are then its answer to
it), and the reader holds what follows (``SWITCH``) until the gateway tells it the answer
(``decide``): agreed, the rest is bytes as they are, to the server already decided on (the
gateway judges them anew, as a connection's first bytes); refused, the reader goes on with
the next request head, which is judged like any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEAD_MAX = 32 * 1024  # a request head's bytes at most (nginx's default limit is 4 x 8 KiB)
CHUNK_LINE_MAX = 1024  # a chunk-size line with its extensions
LINE_MAX = 8 * 1024  # a trailer line (after a chunked body)

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/(\d\.\d)")
_FIELD = re.compile(rb"(" + _TOKEN + rb"):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(;[\x09\x20-\x7e]*)?")
_LABEL = r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?"
_AUTHORITY = re.compile(rf"({_LABEL}(\.{_LABEL})*\.?|\[[0-9a-f:.]+\])(:\d{{1,5}})?")
_ABSOLUTE = re.compile(rb"[A-Za-z][A-Za-z0-9+.\-]*://([^/?#]*)([/?#].*)?")

REASONS = {  # refusal reason -> (status, what the client is told)
    "http_malformed": (400, "not an HTTP/1 request the gateway can read one way only"),
    "http_smuggling": (400, "the body's length is ambiguous (Content-Length / Transfer-Encoding)"),
    "http_folding": (400, "obsolete header line folding"),
    "http_head_size": (431, f"request head over {HEAD_MAX} bytes"),
    "http_slow": (408, "the request head did not come in time"),
    "http_target": (403, "the request target names another host than Host"),
    "http_upgrade": (403, "CONNECT or Upgrade only as a connection's first request"),
    "http_host": (403, "the request's host is not allowed for this sandbox"),
    "http_method": (403, "the policy's rule for this host does not allow the method"),
    "http_path": (403, "the policy's rule for this host does not allow the path"),
    # inspected TLS (tlsinspect.py): the request names another host than the TLS server
    # name the gateway verified upstream, or the upstream's certificate did not verify
    "http_sni": (421, "the request's host is not the TLS server name of its connection"),
    "tls_upstream": (502, "the upstream server's certificate did not verify"),
}


class Refused(Exception):
    """A request the gateway does not forward: ``reason`` (a counter's key, ``REASONS``),
    the HTTP ``status`` the client gets, and a short ``detail``."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason, self.status = reason, REASONS[reason][0]
        self.detail = detail or REASONS[reason][1]
        super().__init__(f"{reason}: {self.detail}")

    def response(self) -> bytes:
        """The answer the client gets before the gateway closes the connection."""
        body = f"rockroll sandbox gateway: {self.reason}: {self.detail}\n".encode()
        phrase = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 421: "Misdirected Request",
                  431: "Request Header Fields Too Large", 502: "Bad Gateway"}[self.status]
        return (f"HTTP/1.1 {self.status} {phrase}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Head:
    """One request head, read and found well formed (its host is still to be judged)."""

    method: str
    target: str
    host: str  # the host it is for: its target's, else its Host's; lower case, no port
    length: int  # body bytes by Content-Length (0 without one)
    chunked: bool
    switch: bool  # CONNECT or Upgrade: what follows is another protocol if the server agrees
    raw: bytes  # the head as sent, its blank line included


class _Switch:
    def __repr__(self) -> str:
        return "SWITCH"


SWITCH = _Switch()  # the event after a CONNECT / Upgrade request: hold, ask the answer, ``decide``
Event = Head | bytes | _Switch


def host_of(authority: str) -> str | None:
    """The host of an authority (``host``, ``host:port``, ``[v6]:port``), lower case without
    port or trailing dot; None unless it is a plain name or address (no user info, no
    empty port)."""
    m = _AUTHORITY.fullmatch(authority.lower())
    if m is None:
        return None
    host = m.group(1)
    return host[1:-1] if host.startswith("[") else host.rstrip(".")


def _target_host(method: str, target: str) -> str | None:
    """The host a request's target names (absolute- or authority-form), or None (origin-
    or asterisk-form, which name none). Refused: a form its method does not take."""
    if method == "CONNECT":
        if "/" in target or ":" not in target or not target.rsplit(":", 1)[1].isdigit():
            raise Refused("http_malformed", "CONNECT takes host:port")
        host = host_of(target)
    elif target.startswith("/") or (target == "*" and method == "OPTIONS"):
        return None
    elif m := _ABSOLUTE.fullmatch(target.encode()):
        host = host_of(m.group(1).decode())
    else:
        raise Refused("http_malformed", "request target")
    if host is None:
        raise Refused("http_malformed", "the target's host")
    return host


def path_of(head: Head) -> str | None:
    """The path a request's target names, without its query (origin- and absolute-form;
    None for authority-form ``CONNECT`` and ``OPTIONS *``); absolute-form's empty path is ``/``."""
    if head.target.startswith("/"):
        return re.split(r"[?#]", head.target, maxsplit=1)[0]
    if head.method != "CONNECT" and (m := _ABSOLUTE.fullmatch(head.target.encode())):
        return re.split(r"[?#]", (m.group(2) or b"/").decode(), maxsplit=1)[0] or "/"
    return None


def parse_head(raw: bytes, first: bool = True) -> Head:
    """The request head ``raw`` (from its request line to the blank line that ends it);
    ``first``: the connection's first request. Raises ``Refused``."""
    lines = raw[:-4].split(b"\r\n")
    if raw[-4:] != b"\r\n\r\n" or b"\r" in raw[:-4].replace(b"\r\n", b"") or b"\n" in raw[:-4].replace(b"\r\n", b""):
        raise Refused("http_malformed", "a bare CR or LF")
    line = _REQUEST_LINE.fullmatch(lines[0])
    if line is None or line.group(3) not in (b"1.0", b"1.1"):
        raise Refused("http_malformed", "request line")
    method, target, version = line.group(1).decode(), line.group(2).decode(), line.group(3)
    fields: dict[str, list[str]] = {}
    for field in lines[1:]:
        if field[:1] in (b" ", b"\t"):
            raise Refused("http_folding")
        m = _FIELD.fullmatch(field)
        if m is None:
            raise Refused("http_malformed", "a header line")
        fields.setdefault(m.group(1).decode().lower(), []).append(m.group(2).decode("latin-1"))
    lengths, codings = fields.get("content-length", []), fields.get("transfer-encoding", [])
    if len(lengths) > 1 or len(codings) > 1 or (lengths and codings):
        raise Refused("http_smuggling")
    if lengths and not (lengths[0].isdigit() and lengths[0].isascii() and len(lengths[0]) <= 18):
        raise Refused("http_smuggling", "Content-Length is not a number")
    if codings and (codings[0].lower() != "chunked" or version == b"1.0"):
        raise Refused("http_smuggling", "a Transfer-Encoding other than chunked")
    named = _target_host(method, target)
    hosts = fields.get("host", [])
    if len(hosts) > 1 or (not hosts and (named is None or version == b"1.1")):
        raise Refused("http_host", "one Host header")
    host = host_of(hosts[0]) if hosts else named
    if host is None:
        raise Refused("http_host", "the Host header")
    if named is not None and named != host:
        raise Refused("http_target", f"{named} is not Host {host}")
    switch = method == "CONNECT" or "upgrade" in fields
    if switch and not first:
        raise Refused("http_upgrade")
    return Head(method, target, host, int(lengths[0]) if lengths else 0, bool(codings), switch, raw)


def with_headers(head: Head, headers: dict[str, str]) -> bytes:
    """``head``'s raw bytes with each of ``headers`` set: every line of that name (any case)
    taken out, one line of the value put in before the blank line. The head was parsed
    already (``parse_head``: CRLF lines, no folding), so a line is a field whole; the values
    are the caller's (``inject.py`` keeps CR, LF and NUL out of them)."""
    names = {name.lower() for name in headers}
    lines = head.raw[:-4].split(b"\r\n")
    kept = [lines[0]] + [line for line in lines[1:] if line.split(b":", 1)[0].decode("latin-1").lower() not in names]
    added = [f"{name}: {value}".encode("latin-1") for name, value in headers.items()]
    return b"\r\n".join(kept + added) + b"\r\n\r\n"


def switched(head: Head, answer: bytes) -> bool:
    """Whether the server's first bytes ``answer`` (its status line's start) agree to the
    protocol switch ``head`` asked for: 101 to an Upgrade, 2xx to a CONNECT."""
    m = re.match(rb"HTTP/1\.[01] (\d\d\d)", answer)
    if m is None:
        return False
    status = int(m.group(1))
    return 200 <= status < 300 if head.method == "CONNECT" else status == 101


_HEAD, _BODY, _CHUNK_SIZE_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _HOLD, _OPAQUE = range(8)


def _bare_lf(buf: bytearray, start: int, stop: int) -> bool:
    """Whether ``buf[start:stop]`` holds an LF that no CR comes before."""
    i = buf.find(b"\n", start, stop)
    while i != -1:
        if i == 0 or buf[i - 1] != 0x0D:
            return True
        i = buf.find(b"\n", i + 1, stop)
    return False


class RequestReader:
    """Incremental: ``feed(bytes)`` returns the events the bytes complete, in order: a
    ``Head`` (judge it; forward its ``raw`` if allowed), ``bytes`` of a body (forward),
    ``SWITCH`` (then ``decide``). Raises ``Refused``; a reader that refused stays refused.
    What it returns, heads' ``raw`` and bytes, is exactly the stream it was fed, in order."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = _HEAD
        self._left = 0  # body or chunk bytes still to come
        self._after = _HEAD  # the state once the current request's body is done
        self._seen = 0  # bytes of a head begun that were scanned already
        self._trailers = 0  # bytes of a chunked body's trailers so far
        self._refused: Refused | None = None
        self.requests = 0

    def in_head(self) -> bool:
        """Whether a request head (or a chunk's size line, or trailers) has begun and not
        ended: the gateway bounds how long that may take."""
        return self._state in (_HEAD, _TRAILER, _CHUNK_SIZE_LINE) and bool(self._buf)

    def between_requests(self) -> bool:
        """Whether every request begun so far has been read whole, its body too (the next
        head may have begun): what the gateway's audit log closes a request's bytes on."""
        return self._state in (_HEAD, _HOLD, _OPAQUE)

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes. A refusal behind some of them is raised on the
        next call: the requests before a refused one are forwarded and answered."""
        if self._refused is not None:
            raise self._refused
        self._buf += data
        out: list[Event] = []
        try:
            self._drain(out)
        except Refused as e:
            self._refused = e
            if not out:
                raise
        return out

    def decide(self, agreed: bool) -> list[Event]:
        """After ``SWITCH``: the server's answer. Agreed: the rest is bytes, as they come."""
        assert self._state == _HOLD, "decide() answers a SWITCH"
        self._state = _OPAQUE if agreed else _HEAD
        return self.feed(b"")

    def _drain(self, out: list[Event]) -> None:
        while self._buf and self._state != _HOLD:
            step = (self._read_head, self._read_body, self._read_chunk_size, self._read_body,
                    self._read_chunk_end, self._read_trailer, None, self._read_opaque)[self._state]
            if not step(out):
                break

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _line(self, limit: int, reason: str) -> bytes | None:
        """The next CRLF-ended line with its CRLF, or None until it has come (Refused:
        no end within ``limit``; what a line holds, bare LFs too, its caller's pattern judges)."""
        end = self._buf.find(b"\r\n", 0, limit)
        if end == -1:
            if len(self._buf) >= limit:
                raise Refused(reason)
            return None
        return self._take(end + 2)

    def _read_head(self, out: list[Event]) -> bool:
        # Only what came since the last look is scanned: a head sent a byte at a time
        # costs its length, not its length squared.
        start, self._seen = max(self._seen - 3, 0), len(self._buf)
        end = self._buf.find(b"\r\n\r\n", start)
        if _bare_lf(self._buf, start, len(self._buf) if end == -1 else end + 2):
            raise Refused("http_malformed", "a bare LF")
        if end == -1:
            if len(self._buf) > HEAD_MAX:
                raise Refused("http_head_size")
            return False
        if end + 4 > HEAD_MAX:
            raise Refused("http_head_size")
        self._seen = 0
        head = parse_head(self._take(end + 4), first=self.requests == 0)
        self.requests += 1
        out.append(head)
        self._after = _HOLD if head.switch else _HEAD
        if head.chunked:
            self._state, self._trailers = _CHUNK_SIZE_LINE, 0
        elif head.length:
            self._state, self._left = _BODY, head.length
        else:
            self._end_request(out)
        return True

    def _end_request(self, out: list[Event]) -> None:
        self._state = self._after
        if self._state == _HOLD:
            out.append(SWITCH)

    def _read_body(self, out: list[Event]) -> bool:
        data = self._take(self._left)
        self._left -= len(data)
        out.append(data)
        if not self._left:
            if self._state == _CHUNK_DATA:
                self._state = _CHUNK_END
            else:
                self._end_request(out)
        return True

    def _read_chunk_size(self, out: list[Event]) -> bool:
        line = self._line(CHUNK_LINE_MAX, "http_smuggling")
        if line is None:
            return False
        m = _CHUNK_SIZE.fullmatch(line[:-2])
        if m is None:
            raise Refused("http_smuggling", "a chunk size")
        out.append(line)
        self._left = int(m.group(1), 16)
        self._state = _CHUNK_DATA if self._left else _TRAILER
        return True

    def _read_chunk_end(self, out: list[Event]) -> bool:
        if len(self._buf) < 2:
            return False
        if self._buf[:2] != b"\r\n":
            raise Refused("http_smuggling", "a chunk longer than its size")
        out.append(self._take(2))
        self._state = _CHUNK_SIZE_LINE
        return True

    def _read_trailer(self, out: list[Event]) -> bool:
        line = self._line(LINE_MAX, "http_head_size")
        if line is None:
            return False
        self._trailers += len(line)
        if self._trailers > HEAD_MAX:
            raise Refused("http_head_size")
        if line[:1] in (b" ", b"\t"):
            raise Refused("http_folding")
        if line != b"\r\n" and _FIELD.fullmatch(line[:-2]) is None:
            raise Refused("http_malformed", "a trailer line")
        out.append(line)
        if line == b"\r\n":
            self._end_request(out)
        return True

    def _read_opaque(self, out: list[Event]) -> bool:
        out.append(self._take(len(self._buf)))
        return True
