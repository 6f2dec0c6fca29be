"""The bytes the sandbox gateway reads (``deployment/wire.py``): a DNS question and its
answer, a real TLS ClientHello's server name, whether bytes start an HTTP request (its
heads: ``test_httpstream_props.py``); and that nothing an attacker sends makes them raise
(anything malformed reads as None)."""

from __future__ import annotations

import ssl

from hypothesis import given, settings
from hypothesis import strategies as st

from rockroll.sandbox.deployment import wire

LABEL = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
NAME = st.lists(LABEL, min_size=1, max_size=5).map(".".join)


@given(NAME, st.integers(0, 0xFFFF), st.sampled_from([wire.QTYPE_A, wire.QTYPE_AAAA, 16]))
def test_a_question_reads_back_and_its_answer_carries_the_addresses(name, qid, qtype):
    q = wire.parse_query(wire.encode_query(qid, name, qtype))
    assert (q.id, q.name, q.qtype) == (qid, name, qtype)
    addrs = ["203.0.113.7", "198.51.100.9"] if qtype == wire.QTYPE_A else []
    assert wire.answer_addresses(wire.answer(q, addrs)) == (wire.NOERROR, addrs)
    assert wire.answer_addresses(wire.answer(q, rcode=wire.NXDOMAIN)) == (wire.NXDOMAIN, [])


@given(st.binary(max_size=600))
def test_no_bytes_make_the_readers_raise(data):
    wire.parse_query(data)
    wire.tls_server_name(data)
    wire.is_http(data)
    wire.incomplete_head(data)
    wire.tls_server_name(b"\x16\x03\x01" + data)


def client_hello(server_name: str | None) -> bytes:
    ctx = ssl.create_default_context()
    if server_name is None:
        ctx.check_hostname = False
    conn = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname=server_name)
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def test_the_server_name_of_a_real_client_hello():
    assert wire.tls_server_name(client_hello("index.example")) == "index.example"
    assert wire.tls_server_name(client_hello("Files.Packages.Example")) == "files.packages.example"
    assert wire.is_tls(client_hello(None)) and wire.tls_server_name(client_hello(None)) is None


def test_an_http_request_is_known_by_its_shape_not_its_method():
    """A server routes a PROPFIND or a made-up method by its Host as it does a GET: any
    token, a target and an HTTP version make a request line (HTTP/2's preface too)."""
    for line in (b"GET / HTTP/1.1\r\n", b"POST /x HTTP/1.1\r\n", b"PROPFIND / HTTP/1.1\r\n",
                 b"X-MADE-UP /a HTTP/1.0\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                 # loose shapes a lenient server may still read as a request: httpstream refuses them
                 b"\r\nGET / HTTP/1.1\r\n", b"GET\t/\tHTTP/1.1\r\n", b"get / http/1.1\r\n", b"GET / HTTP/1.1\n"):
        assert wire.is_http(line), line
    for other in (b"\x16\x03\x01", b"SSH-2.0-OpenSSH_9.6 Ubuntu\r\n", b"EHLO mail.example\r\n",
                  b"*1\r\n$4\r\nPING\r\n"):
        assert not wire.is_http(other), other
    # a request line still coming is waited for; a line that cannot be one is not
    assert wire.incomplete_head(b"PROPF") and wire.incomplete_head(b"PROPFIND /a HT")
    assert wire.incomplete_head(b"\r\n") and wire.incomplete_head(b"\r\nGE")
    assert not wire.incomplete_head(b"EHLO mail.example\r\n")


@settings(deadline=None)  # a real ClientHello each time: slow on a loaded machine
@given(st.data())
def test_a_head_cut_anywhere_reads_as_incomplete(data):
    """The proxy reads on while a request head or a ClientHello is cut short (the name may
    be in the next segment), and stops once it is whole."""
    for whole in (b"GET /simple/ HTTP/1.1\r\nHost: index.example\r\nAccept: */*\r\n\r\n",
                  client_hello("index.example")):
        cut = data.draw(st.integers(1, len(whole) - 1))
        assert wire.incomplete_head(whole[:cut]) and not wire.incomplete_head(whole)
    assert not wire.incomplete_head(b"SSH-2.0-OpenSSH_9.6\r\n") and not wire.incomplete_head(b"\x00")
