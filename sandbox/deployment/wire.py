"""The few bytes of other protocols the sandbox gateway reads (``gateway.py``): a DNS
question and the answer it gives, the server name of a TLS ClientHello, whether a client's
first bytes are an HTTP request (``httpstream.py`` reads those, request by request). Pure
functions over bytes; anything malformed reads as ``None``."""

from __future__ import annotations

import ipaddress
import re
import struct
from dataclasses import dataclass

QTYPE_A, QTYPE_AAAA = 1, 28
NOERROR, SERVFAIL, NXDOMAIN, REFUSED = 0, 2, 3, 5


@dataclass(frozen=True)
class Question:
    id: int
    name: str  # lower case, no trailing dot
    qtype: int
    raw: bytes  # the question section as sent (echoed in the answer)
    flags: int


def parse_query(data: bytes) -> Question | None:
    """The single question of a DNS query, or None (a response, no question, compression
    in the question, a bad length)."""
    if len(data) < 12:
        return None
    qid, flags, qd = struct.unpack(">HHH", data[:6])
    if flags & 0x8000 or qd != 1:
        return None
    labels, i = [], 12
    while True:
        if i >= len(data):
            return None
        n = data[i]
        i += 1
        if n == 0:
            break
        if n > 63 or i + n > len(data):
            return None
        try:
            labels.append(data[i:i + n].decode("ascii").lower())
        except UnicodeDecodeError:
            return None
        i += n
    if i + 4 > len(data) or sum(len(l) + 1 for l in labels) > 254:
        return None
    qtype = struct.unpack(">H", data[i:i + 2])[0]
    return Question(qid, ".".join(labels), qtype, data[12:i + 4], flags)


def answer(q: Question, addresses: list[str] = (), rcode: int = NOERROR, ttl: int = 30) -> bytes:
    """The response to ``q``: ``addresses`` (of the question's type) as its answers."""
    flags = 0x8000 | (q.flags & 0x0100) | 0x0080 | rcode  # QR, RD echoed, RA
    out = [struct.pack(">HHHHHH", q.id, flags, 1, len(addresses), 0, 0), q.raw]
    for a in addresses:
        packed = ipaddress.ip_address(a).packed
        out.append(struct.pack(">HHHIH", 0xC00C, q.qtype, 1, ttl, len(packed)) + packed)
    return b"".join(out)


def encode_query(qid: int, name: str, qtype: int = QTYPE_A) -> bytes:
    """A recursive query for ``name`` (tests, and anything that asks like a stub resolver)."""
    qname = b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split(".")) + b"\0"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", qtype, 1)


def answer_addresses(data: bytes) -> tuple[int, list[str]]:
    """``(rcode, addresses)`` of a response's A/AAAA answers (tests read what a resolver said)."""
    rcode, records = answer_records(data, (QTYPE_A, QTYPE_AAAA))
    return rcode, [a for a, _ in records]


def answer_records(data: bytes, qtypes: tuple[int, ...] = (QTYPE_A,)) -> tuple[int, list[tuple[str, int]]]:
    """``(rcode, [(address, ttl)])`` of a response's answers of ``qtypes``. A recursive
    resolver's answer to a name behind CNAMEs carries the chain: each address's TTL is the
    least of its own and the chain's, since the answer holds only as long as every link.
    Raises ``ValueError`` on a malformed response."""
    try:
        rcode = struct.unpack(">H", data[2:4])[0] & 0xF
        an = struct.unpack(">H", data[6:8])[0]
        i = _skip_name(data, 12) + 4
        found, chain = [], []
        for _ in range(an):
            i = _skip_name(data, i)
            rtype, _, ttl, rdlen = struct.unpack(">HHIH", data[i:i + 10])
            i += 10
            if i + rdlen > len(data):
                raise ValueError("a record runs past the end")
            if rtype in qtypes:
                found.append((str(ipaddress.ip_address(data[i:i + rdlen])), ttl))
            else:
                chain.append(ttl)
            i += rdlen
    except (IndexError, struct.error) as e:
        raise ValueError(f"malformed DNS response: {e}") from None
    least = min(chain, default=0x7FFFFFFF)
    return rcode, [(a, min(ttl, least)) for a, ttl in found]


def _skip_name(data: bytes, i: int) -> int:
    """The offset just past the (possibly compressed) name at ``i``."""
    while True:
        n = data[i]
        if n & 0xC0 == 0xC0:
            return i + 2
        if n == 0:
            return i + 1
        i += 1 + n


def is_tls(data: bytes) -> bool:
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 3


def tls_server_name(data: bytes) -> str | None:
    """The SNI host name of a TLS ClientHello at the start of ``data`` (first record), or None."""
    try:
        if not is_tls(data):
            return None
        rec_len = struct.unpack(">H", data[3:5])[0]
        body = data[5:5 + rec_len]
        if body[0] != 1:  # ClientHello
            return None
        i = 4 + 2 + 32  # handshake header, version, random
        i += 1 + body[i]  # session id
        i += 2 + struct.unpack(">H", body[i:i + 2])[0]  # cipher suites
        i += 1 + body[i]  # compression methods
        end = i + 2 + struct.unpack(">H", body[i:i + 2])[0]
        i += 2
        while i + 4 <= end:
            etype, elen = struct.unpack(">HH", body[i:i + 4])
            i += 4
            if etype == 0:  # server_name: list length, then (type 0, length, name)
                j = i + 2
                if body[j] == 0:
                    n = struct.unpack(">H", body[j + 1:j + 3])[0]
                    return body[j + 3:j + 3 + n].decode("ascii").lower().rstrip(".")
                return None
            i += elen
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")
# Any method: a server routes a PROPFIND (or a made-up method) by its Host as it does a GET,
# so a request line is known by its shape, not its method, and loosely (tabs, blank lines
# before it, a lower-case version: what some server might still take for a request): what
# looks like one is read by ``httpstream``, which refuses all but the strict form. HTTP/2's
# cleartext preface ("PRI * HTTP/2.0") is one too, refused as a version it does not read.
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}"
_REQUEST_LINE = re.compile(_TOKEN + rb"[ \t]+[^\r\n]*HTTP/", re.I)
_REQUEST_LINE_START = re.compile(_TOKEN + rb"([ \t][\x09\x20-\x7e]*)?")


def is_http(data: bytes) -> bool:
    line = data.lstrip(b"\r\n").split(b"\n", 1)[0]
    return data.startswith(HTTP_METHODS) or _REQUEST_LINE.match(line) is not None


def incomplete_head(data: bytes) -> bool:
    """Whether ``data`` is the start of an HTTP request head or a TLS record that has not
    all come yet (more bytes would tell the name); False for anything else."""
    if data and data[0] == 0x16 and len(data) < 5:
        return True
    if is_tls(data):
        return len(data) < 5 + struct.unpack(">H", data[3:5])[0]
    line = data.lstrip(b"\r\n")
    if data and not line or b"\n" not in line and len(data) < 8192 and _REQUEST_LINE_START.fullmatch(line):
        return True  # a request line still coming (blank lines before one are read on)
    return is_http(data) and b"\r\n\r\n" not in data
