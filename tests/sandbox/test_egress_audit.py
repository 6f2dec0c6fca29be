"""The egress audit log (``deployment/egresslog.py``): one record per HTTP request, per TLS,
tunnel or other connection, per DNS query and per refusal, written by the gateway outside
the sandbox, bounded, and the same through the service and its SDK.

The lab (``_netlab.py``, as the network tests use it): "the host" and "the internet" are
network namespaces this module makes, wired only to each other; ``_netdriver.py audit``
makes the sandboxes inside the host namespace, ``audit_remote`` starts a real ``rockroll
serve`` there and drives it through ``backend="remote"``. One lab for the module: each run
is a minute of the machine's two cores. The framing that splits a kept-alive connection's
answers into requests is pure and checked here without a lab, at every split point."""

from __future__ import annotations

import json
import os

import pytest

from rockroll.sandbox.deployment.egresslog import Connection, EgressLog, ResponseFramer

from _netdriver import AUDIT_MARK, get
from _netlab import NetLab, lab_available

why_not = lab_available()
needs_lab = pytest.mark.skipif(why_not is not None and os.environ.get("CI") != "true", reason=why_not or "")
FIELDS = {"seq", "time", "kind", "method", "host", "path", "ip", "port", "status", "bytes_out", "bytes_in",
          "decision", "reason", "injected"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if why_not:
        pytest.fail(f"CI must run the network tests: {why_not}")
    with NetLab(tmp_path_factory.mktemp("auditlab")) as lab:
        yield lab


@pytest.fixture(scope="module")
def local(lab):
    return lab.run_host("audit")


@pytest.fixture(scope="module")
def remote(lab):
    return lab.run_host("audit_remote")


def answers(got: str) -> list[str]:
    """The responses of one connection, split where each status line begins."""
    parts = got.split("HTTP/1.1 ")
    return ["HTTP/1.1 " + p for p in parts[1:]]


def check_cases(r: dict) -> None:
    """``_netdriver.audit_cases``' result: the records of each request and connection."""
    # two requests on one kept-alive connection: two records, each with its own bytes
    keep = r["keepalive"]
    first, second = answers(keep["got"])
    assert [(x["method"], x["host"], x["path"], x["status"], x["bytes_out"], x["bytes_in"], x["decision"])
            for x in keep["records"]] == [
        ("GET", "allowed.test", AUDIT_MARK, 200, len(get("allowed.test", AUDIT_MARK)), len(first), "allowed"),
        ("GET", "allowed.test", "/second?q=1", 200, len(get("allowed.test", "/second?q=1")), len(second), "allowed")]
    assert {x["ip"] for x in keep["records"]} == {"203.0.113.10"} and all(set(x) == FIELDS for x in r["all"])
    # refused: the reason it is counted under, the gateway's status, nothing forwarded
    [refused] = r["refused"]["records"]
    assert (refused["kind"], refused["host"], refused["status"], refused["decision"], refused["reason"],
            refused["bytes_out"], refused["bytes_in"]) == ("http", "evil.test", 403, "refused", "http_host", 0, 0)
    # a CONNECT tunnel: its request, then one record for what went through it, each way
    connect, tunnel = r["tunnel"]["records"]
    head = "CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n"
    assert (connect["method"], connect["status"], connect["bytes_out"], connect["bytes_in"]) == (
        "CONNECT", 200, len(head), len(r["tunnel"]["got"]) - len("hello"))
    assert (tunnel["kind"], tunnel["host"], tunnel["bytes_out"], tunnel["bytes_in"]) == ("tunnel", "allowed.test", 5, 5)
    # TLS: one record for the connection, host from its SNI
    assert r["tls"]["got"] == "tls-site"
    [tls] = r["tls"]["records"]
    assert (tls["kind"], tls["host"], tls["port"], tls["decision"]) == ("tls", "tls.test", 443, "allowed")
    assert tls["bytes_out"] > 300 and tls["bytes_in"] > 1000, tls
    [direct] = r["direct_ip"]["records"]
    assert (direct["kind"], direct["ip"], direct["decision"], direct["reason"]) == ("tcp", "203.0.113.20", "refused",
                                                                                     "address")
    [dns] = r["dns"]
    assert (dns["kind"], dns["host"], dns["decision"], dns["reason"]) == ("dns", "other.test", "refused", "dns")
    seqs = [x["seq"] for x in r["all"]]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


def check_unforgeable(r: dict) -> None:
    """A target or Host built to end a record and start another is one record, as sent."""
    forged = '/a"},{"seq":1,"decision":"allowed","host":"evil.test"}\\'
    assert [(x["path"], x["host"], x["decision"]) for x in r["forged_path"]["records"]] == [
        (forged, "allowed.test", "allowed")]
    assert [(x["path"], x["host"], x["reason"]) for x in r["newline_path"]["records"]] == [(None, None, "http_malformed")]
    assert [(x["host"], x["reason"]) for x in r["forged_host"]["records"]] == [(None, "http_host")]
    assert not any(x["host"] == "evil.test" and x["decision"] == "allowed" for x in r["all"]), r["all"]
    assert sum(1 for x in r["all"] if x["seq"] == 1) == 1


@needs_lab
def test_each_request_and_connection_is_one_record_with_exact_bytes(local):
    check_cases(local)
    stats = local["stats"]  # every byte the gateway forwarded is in exactly one record
    assert (sum(x["bytes_in"] for x in local["all"]), sum(x["bytes_out"] for x in local["all"])) == (
        stats["bytes_in"], stats["bytes_out"])
    refused = {}
    for x in local["all"]:
        if x["decision"] == "refused":
            refused[x["reason"]] = refused.get(x["reason"], 0) + 1
    assert refused == stats["denied"], (refused, stats["denied"])  # each refusal counted is a record


@needs_lab
def test_the_sandbox_cannot_read_or_forge_its_log(local):
    check_unforgeable(local)
    assert local["marker_on_host"] == 1
    assert local["inside_sees"] == "", local["inside_sees"]  # no file of it, no process of the host
    assert local["control_sees"] == "/workspace/control.jsonl"  # where a record was, the look finds it


@needs_lab
def test_the_log_is_bounded_and_counts_what_it_dropped(local):
    f = local["flood"]
    assert f["answers"] == f["n"]  # the bound drops records, never traffic
    log, records = f["log"], f["records"]
    encoded = sum(len(json.dumps(x, separators=(",", ":"))) + 1 for x in records)
    assert log["max_bytes"] == 4096 and encoded == log["bytes"] <= 4096 and log["records"] == len(records)
    total = records[-1]["seq"]  # every record made: the oldest dropped, the newest kept, none lost between
    assert total >= f["n"] and log["dropped"] == total - len(records) > 0, log
    assert [x["seq"] for x in records] == list(range(log["dropped"] + 1, total + 1))
    assert records[-1]["kind"] == "http" and records[-1]["status"] == 200


@needs_lab
def test_the_service_and_the_sdk_give_the_same_records(remote):
    check_cases(remote)
    check_unforgeable(remote)
    status, body = remote["route"]
    assert status == 200 and [x["seq"] for x in body["records"]] == [x["seq"] for x in remote["all"] if x["seq"] > 2]
    assert body["records"] == [x for x in remote["all"] if x["seq"] > 2]
    assert body["max_bytes"] == 1 << 20 and body["dropped"] == 0 and body["kept"] == len(remote["all"])
    assert remote["bad_since"] == 422 and remote["openapi"]


@needs_lab
def test_bulk_bytes_go_in_the_kernel_and_every_one_is_counted(lab):
    """16 MiB down and up on an open network, and down under an allow-list (a body framed
    around: its record still has its status and every byte): what reached the client is
    whole, each record and counter has the exact bytes, and nearly all went by splice."""
    r = lab.run_host("bulk")
    body = 16 << 20
    for case in ("open_down", "allow_list_down"):
        got, records, stats = r[case]["client"], r[case]["records"], r[case]["stats"]
        assert got["body"] == got["zeros"] == body, got
        [rec] = records
        assert (rec["bytes_in"], rec["bytes_out"], rec["decision"]) == (got["got"], got["sent"], "allowed"), rec
        assert (stats["bytes_in"], stats["bytes_out"]) == (got["got"], got["sent"])
        assert stats["bytes_spliced"] >= body - (1 << 20), (case, stats)  # all but the first reads'
    assert r["allow_list_down"]["records"][0]["kind"] == "http" and r["allow_list_down"]["records"][0]["status"] == 200
    assert r["open_down"]["records"][0]["kind"] == "tcp"
    up = r["open_up"]
    assert up["client"]["answer"].endswith(f":posted={body}"), up["client"]
    [rec] = up["records"]
    assert (rec["bytes_out"], rec["bytes_in"]) == (up["client"]["sent"], up["client"]["got"])
    assert up["stats"]["bytes_out"] == up["client"]["sent"] and up["stats"]["bytes_spliced"] >= body - (1 << 20)


# -- the framing of answers, without a lab ------------------------------------------------

ANSWERS = [  # (request method, the server's answer)
    ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    ("POST", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: t\r\n\r\n"),
    ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n"),
    ("GET", b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"),
    ("GET", b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"),
]


def feed_split(framer: ResponseFramer, data: bytes, cut: int) -> list:
    return framer.feed(data[:cut]) + framer.feed(data[cut:])


def requested(answers: list) -> tuple[EgressLog, Connection]:
    """A connection's log, and the connection with a request (10 bytes) sent for each answer."""
    log = EgressLog()
    conn = Connection(log, lambda: 0.0, "203.0.113.10", 80, kind="http")
    for method, _ in answers:
        conn.request(method, "allowed.test", f"/{method.lower()}")
        conn.sent(10)
    conn.request_done()
    return log, conn


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_pipelined_answers_are_split_exactly_by_their_framing(step):
    log, conn = requested(ANSWERS)
    stream = b"".join(a for _, a in ANSWERS)
    for i in range(0, len(stream), step):
        conn.received(stream[i:i + step])
    got = [(x["method"], x["status"], x["bytes_in"], x["bytes_out"]) for x in log.records()]
    assert got == [(m, status, len(a), 10) for (m, a), status in zip(ANSWERS, [200, 201, 200, 304, 404])]
    conn.close()
    assert len(log.records()) == len(ANSWERS)  # nothing left open to write again


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_bytes_forwarded_unseen_where_framing_allows_make_the_same_records(step):
    """The gateway splices what framing need not read (``ahead``: a body's or chunk's rest,
    a tunnel): counting those bytes (``received_unseen``) instead of reading them gives the
    records reading them gives, at every read size, with a tunnel after the answers."""
    answers = ANSWERS + [("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + b"z" * 3000),
                         ("GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"800\r\n" + b"c" * 2048 + b"\r\n0\r\n\r\n"),
                         ("CONNECT", b"HTTP/1.1 200 OK\r\n\r\n" + b"t" * 500)]

    def records(unseen: bool) -> list:
        log, conn = requested(answers)
        stream, i, skipped = b"".join(a for _, a in answers), 0, 0
        while i < len(stream):
            if unseen and (ahead := conn.ahead()):
                n = int(min(ahead, len(stream) - i))
                conn.received_unseen(n)
                skipped += n
            else:
                n = min(step, len(stream) - i)
                conn.received(stream[i:i + n])
            i += n
        conn.close()
        return [(x["kind"], x["method"], x["status"], x["bytes_in"], x["bytes_out"]) for x in log.records()], skipped

    seen, _ = records(False)
    unseen, skipped = records(True)
    assert unseen == seen and len(seen) == len(answers)
    assert skipped >= 3000 + 2048 + 500 - 3 * step  # the bodies' rest and the tunnel passed unseen
    framer = ResponseFramer()
    framer.expect("GET")
    framer.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    assert framer.ahead() == 7
    with pytest.raises(ValueError):  # framing would lose its place: refused, not miscounted
        framer.skip(8)


def test_an_answer_read_to_the_close_or_unreadable_keeps_every_byte():
    log = EgressLog()
    conn = Connection(log, lambda: 0.0, "203.0.113.10", 80, kind="http")
    conn.request("GET", "allowed.test", "/")
    conn.sent(20)
    conn.request("GET", "allowed.test", "/2")
    conn.sent(21)
    a, b = b"HTTP/1.0 200 OK\r\n\r\nbody to the close", b"HTTP/1.1 200 OK\r\n\r\nmore of the same body"
    conn.received(a)
    conn.received(b)
    assert log.records() == []  # not done until the close
    conn.close()
    assert [(x["path"], x["status"], x["bytes_in"], x["bytes_out"]) for x in log.records()] == [
        ("/", 200, len(a) + len(b), 20), ("/2", None, 0, 21)]
    framer = ResponseFramer()
    framer.expect("GET")
    pieces = framer.feed(b"SSH-2.0-not-http\r\n\r\nxx")
    assert sum(p.n for p in pieces) == 22 and not any(p.done for p in pieces)


def test_a_switch_hands_the_rest_to_the_tunnel_at_every_split():
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n\r\n"
    for cut in range(len(head) + 5):
        framer = ResponseFramer()
        framer.expect("GET")
        pieces = feed_split(framer, head + b"frame", cut)
        assert sum(p.n for p in pieces if not p.tunnel) == len(head)
        assert sum(p.n for p in pieces if p.tunnel) == 5
        assert [p.status for p in pieces if p.done] == [101]


def test_the_ring_drops_the_oldest_by_bytes_and_each_record_is_one_line():
    log = EgressLog(max_bytes=5000)
    for i in range(50):
        log.add(time=float(i), kind="http", decision="allowed", path='/"\n}{' + "x" * 2000)
    stats = log.stats()
    assert stats["dropped"] + stats["records"] == 50 and stats["bytes"] <= 5000 and stats["records"] >= 3
    kept = log.records()
    assert [x["seq"] for x in kept] == list(range(51 - len(kept), 51))
    assert kept[-1]["path"].startswith('/"\n}{x') and len(kept[-1]["path"]) == 1024 + 3  # cut at FIELD_MAX
    assert log.records(since=49) == kept[-1:] and log.records(since=50) == []
