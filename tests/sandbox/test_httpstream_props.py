"""Properties of the gateway's HTTP request reader (``deployment/httpstream.py``).

- Round trip: any requests one after another (bodies by Content-Length and chunked,
  trailers), cut into any chunks, come out as their heads, in order, and bytes; what comes
  out is exactly the stream that went in. A real HTTP/1.1 server parser (h11) splits the
  same stream into the same requests with the same bodies: no request a server would
  see goes by unjudged.
- A head cut anywhere gives nothing until its last byte.
- Any bytes at all give events or ``Refused``, never another error; a reader that refused
  stays refused, and what it handed out is a prefix of what it was fed.
- Each smuggling shape, put into any request of a stream, is refused under its reason,
  and no head from that request on comes out.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rockroll.sandbox.deployment import httpstream
from rockroll.sandbox.deployment.httpstream import HEAD_MAX, SWITCH, Head, Refused, RequestReader

PROPS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

HOSTS = st.sampled_from(["allowed.test", "Allowed.Test:8080", "a.b-c.example", "[2001:db8::1]:80", "10.0.0.1"])
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PROPFIND", "X-MADE-UP"])
PATHS = st.text("abcxyz019/-._~%?=&", max_size=30).map(lambda p: "/" + p)
FIELD_NAMES = st.sampled_from(["Accept", "User-Agent", "X-Trace", "Cookie"])  # no Connection: close ends h11's cycle
FIELD_VALUES = st.text("abcdefghij0123456789 ;=,./*-", max_size=40).map(str.strip)
BODIES = st.binary(max_size=300)


@st.composite
def requests(draw) -> tuple[bytes, tuple[str, str], bytes]:
    """One request: (its bytes, (method, host as the reader reports it), its body)."""
    method, host, path = draw(METHODS), draw(HOSTS), draw(PATHS)
    fields = [("Host", host)] + draw(st.lists(st.tuples(FIELD_NAMES, FIELD_VALUES), max_size=4))
    body = draw(BODIES)
    framing = draw(st.sampled_from(["none", "length", "chunked"] if body else ["none", "length"]))
    wire = b""
    if framing == "length":
        fields.append(("Content-Length", str(len(body))))
        wire = body
    elif framing == "chunked":
        fields.append(("Transfer-Encoding", "chunked"))
        cuts = sorted(set(draw(st.lists(st.integers(1, len(body)), max_size=4))) | {len(body)})
        start = 0
        for end in cuts:
            ext = draw(st.sampled_from(["", ";x=1"]))
            wire += f"{end - start:x}{ext}\r\n".encode() + body[start:end] + b"\r\n"
            start = end
        trailer = draw(st.sampled_from([b"", b"X-Check: 1\r\n"]))
        wire += b"0\r\n" + trailer + b"\r\n"
    else:
        body = b""
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
    reported = host.lower().rsplit(":", 1)[0].strip("[]") if not host.startswith("[") else "2001:db8::1"
    return head.encode() + wire, (method, reported), body


streams = st.lists(requests(), min_size=1, max_size=4)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({min(p, len(data)) for p in points})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def read_all(chunks: list[bytes]) -> tuple[list[Head], bytes, list[bytes]]:
    """Heads, everything handed out in order, and each request's body (de-chunked)."""
    reader, heads, out, bodies = RequestReader(), [], b"", []
    for chunk in chunks:
        for event in reader.feed(chunk):
            if isinstance(event, Head):
                heads.append(event)
                out += event.raw
                bodies.append(b"")
            else:
                out += event
                bodies[-1] += event
    assert not reader.in_head()
    return heads, out, bodies


def dechunk(raw: bytes) -> bytes:
    body = b""
    while (size := int(raw.split(b"\r\n", 1)[0].split(b";")[0], 16)) != 0:
        raw = raw.split(b"\r\n", 1)[1]
        body += raw[:size]
        raw = raw[size + 2:]
    return body


@PROPS
@given(streams, st.lists(st.integers(0, 3000), max_size=12))
def test_requests_round_trip_through_any_chunking(sent, points):
    stream = b"".join(r for r, _, _ in sent)
    heads, out, bodies = read_all(cut(stream, points))
    assert out == stream  # nothing lost, nothing added, nothing reordered
    assert [(h.method, h.host) for h in heads] == [who for _, who, _ in sent]
    assert [dechunk(b) if h.chunked else b for h, b in zip(heads, bodies)] == [body for _, _, body in sent]


def h11_requests(stream: bytes) -> list[tuple[str, str, bytes]]:
    """(method, Host, body) of each request as h11, a server's parser, reads ``stream``."""
    conn, found = h11.Connection(h11.SERVER), []
    conn.receive_data(stream)
    conn.receive_data(b"")
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            found.append([event.method.decode(), dict(event.headers)[b"host"].decode(), b""])
        elif isinstance(event, h11.Data):
            found[-1][2] += event.data
        elif isinstance(event, h11.EndOfMessage):
            conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
        else:
            return [tuple(f) for f in found]


@PROPS
@given(streams)
def test_a_servers_parser_sees_the_same_requests(sent):
    stream = b"".join(r for r, _, _ in sent)
    heads, _, bodies = read_all([stream])
    ours = [(h.method, dict(_fields(h.raw))["host"], dechunk(b) if h.chunked else b) for h, b in zip(heads, bodies)]
    assert ours == h11_requests(stream)


def _fields(raw: bytes) -> list[tuple[str, str]]:
    return [(k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in raw.decode().split("\r\n")[1:-2])]


@PROPS
@given(requests(), st.data())
def test_a_head_cut_anywhere_gives_nothing_until_its_last_byte(request, data):
    wire, _, _ = request
    head_len = wire.index(b"\r\n\r\n") + 4
    reader = RequestReader()
    at = data.draw(st.integers(1, head_len - 1))
    assert reader.feed(wire[:at]) == [] and reader.in_head()
    assert reader.feed(wire[at:head_len - 1]) == []
    assert isinstance(reader.feed(wire[head_len - 1:head_len])[0], Head)


@PROPS
@given(st.binary(max_size=800), st.lists(st.integers(0, 800), max_size=6))
def test_no_bytes_make_the_reader_raise_but_refused(data, points):
    for prefix in (b"", b"GET / HTTP/1.1\r\nHost: a.test\r\n",
                   b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"):
        stream = prefix + data
        reader, out = RequestReader(), b""
        try:
            for chunk in cut(stream, points):
                for event in reader.feed(chunk):
                    if event is SWITCH:
                        event = b"".join(e.raw if isinstance(e, Head) else e for e in reader.decide(False))
                    out += event.raw if isinstance(event, Head) else event
        except Refused as e:
            assert e.reason in httpstream.REASONS
            with pytest.raises(Refused):  # stays refused
                reader.feed(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        assert stream.startswith(out)


SMUGGLING = [  # (where it goes: the head's fields, what goes there, the reason)
    ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "http_smuggling"),
    ("Transfer-Encoding: chunked\r\nContent-Length: 0\r\n", "http_smuggling"),
    ("Content-Length: 0\r\nContent-Length: 0\r\n", "http_smuggling"),
    ("Content-Length: 0, 5\r\n", "http_smuggling"),
    ("Content-Length: +5\r\n", "http_smuggling"),
    ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "http_smuggling"),
    ("Transfer-Encoding: gzip, chunked\r\n", "http_smuggling"),
    ("Transfer-Encoding: xchunked\r\n", "http_smuggling"),
    ("X-Folded: a\r\n b\r\n", "http_folding"),
    ("X-Folded: a\r\n\tb\r\n", "http_folding"),
    ("Content-Length : 5\r\n", "http_malformed"),
    ("X-Bare: a\nContent-Length: 5\r\n", "http_malformed"),
    ("X-Bare: a\rContent-Length: 5\r\n", "http_malformed"),
    ("Host: evil.test\r\n", "http_host"),  # a second Host
    ("X-Big: " + "a" * HEAD_MAX + "\r\n", "http_head_size"),
]


@pytest.mark.parametrize("field, reason", SMUGGLING)
@settings(PROPS, max_examples=40)
@given(sent=streams, data=st.data())
def test_each_smuggling_shape_in_any_request_is_refused_by_its_reason(field, reason, sent, data):
    k = data.draw(st.integers(0, len(sent) - 1))
    wires = [r for r, _, _ in sent]
    head_end = wires[k].index(b"\r\n") + 2  # right after the request line
    wires[k] = wires[k][:head_end] + field.encode() + wires[k][head_end:]
    reader, heads = RequestReader(), []
    with pytest.raises(Refused) as e:
        for chunk in [*cut(b"".join(wires), data.draw(st.lists(st.integers(0, 3000), max_size=6))), b""]:
            heads += [ev for ev in reader.feed(chunk) if isinstance(ev, Head)]
    assert e.value.reason == reason
    assert len(heads) == k  # the requests before it, and none from it on


@pytest.mark.parametrize("head, reason", [
    (b"GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_target"),
    (b"GET http://allowed.test@evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_malformed"),
    (b"GET http://allowed.test\\@evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_malformed"),
    (b"GET / HTTP/1.1\r\nHost: allowed.test@evil.test\r\n\r\n", "http_host"),
    (b"GET / HTTP/1.1\r\n\r\n", "http_host"),  # HTTP/1.1 needs a Host
    (b"GET / HTTP/1.0\r\n\r\n", "http_host"),  # nor names any other way
    (b"CONNECT evil.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_target"),
    (b"CONNECT evil.test HTTP/1.1\r\nHost: evil.test\r\n\r\n", "http_malformed"),  # no port
    (b"GET evil.test:80 HTTP/1.1\r\nHost: evil.test\r\n\r\n", "http_malformed"),  # authority form, not CONNECT
    (b"GET * HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_malformed"),  # asterisk form, not OPTIONS
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "http_malformed"),
    (b"GET / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello!\r\n", "http_smuggling"),
    (b"GET / HTTP/1.0\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n", "http_smuggling"),
    (b"\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_malformed"),
    (b"GET / HTTP/1.1\nHost: allowed.test\n\n", "http_malformed"),  # at once: no CRLF CRLF ever comes
    (b"GET  / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_malformed"),
])
def test_targets_hosts_and_framing_refused(head, reason):
    reader = RequestReader()
    with pytest.raises(Refused) as e:
        reader.feed(head)
        reader.feed(b"")  # a refusal after a head's events comes on the next call
    assert e.value.reason == reason
    answer = e.value.response()
    assert answer.startswith(f"HTTP/1.1 {e.value.status} ".encode()) and reason.encode() in answer.split(b"\r\n\r\n")[1]


def test_targets_name_their_host_and_must_agree_with_host():
    read = lambda head: RequestReader().feed(head)[0]  # noqa: E731
    assert read(b"GET http://Allowed.Test:8080/x?y HTTP/1.1\r\nHost: allowed.test\r\n\r\n").host == "allowed.test"
    assert read(b"GET http://allowed.test/ HTTP/1.0\r\n\r\n").host == "allowed.test"  # 1.0: the target alone
    assert read(b"OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n").host == "a.test"
    connect = read(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n")
    assert (connect.host, connect.switch) == ("a.test", True)


def test_a_switch_holds_the_rest_until_the_answer_and_only_as_the_first_request():
    upgrade = b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    after = b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    for answer, agreed in ((b"HTTP/1.1 101 Switching Protocols\r\n", True), (b"HTTP/1.1 200 OK\r\n", False),
                           (b"HTTP/1.1 10", False), (b"", False)):
        reader = RequestReader()
        head, switch = reader.feed(upgrade + after)
        assert switch is SWITCH and reader.feed(b"more") == []  # held
        assert httpstream.switched(head, answer) is agreed
        rest = reader.decide(agreed)
        if agreed:  # another protocol: bytes as they are, to the server decided on
            assert rest == [after + b"more"]
        else:  # the server did not switch: the next head is judged like any other
            assert isinstance(rest[0], Head) and rest[0].host == "evil.test"
    connect = RequestReader().feed(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n")[0]
    assert httpstream.switched(connect, b"HTTP/1.1 200 Connection established\r\n")
    assert not httpstream.switched(connect, b"HTTP/1.1 101 Switching")
    reader = RequestReader()
    assert [h.host for h in reader.feed(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n" + upgrade)] == ["a.test"]
    with pytest.raises(Refused) as e:
        reader.feed(b"")
    assert e.value.reason == "http_upgrade"


def test_a_giant_head_is_refused_once_the_bound_is_passed_not_buffered():
    reader = RequestReader()
    reader.feed(b"GET / HTTP/1.1\r\nHost: a.test\r\nX-Big: " + b"a" * (HEAD_MAX - 100))
    with pytest.raises(Refused) as e:
        reader.feed(b"a" * 200)
    assert (e.value.reason, e.value.status) == ("http_head_size", 431)
