"""Opt-in TLS inspection and secret headers (``EgressPolicy(inspect_tls=True, inject=...)``):
``deployment/tlsinspect.py`` (the sandbox's CA, TLS both ways), ``deployment/inject.py``
(the secrets, read on the host) and the gateway that judges each request inside.

In the lab (``_netlab.py``; ``_tlsdriver.py`` drives the sandboxes from its host namespace):
203.0.113.10:443 holds allowed.test, api.test and evil.test on one address and one
certificate of the lab's CA, routing each request by its ``Host``, and writes what it
received to a file the test reads on the host; evil.test answers each request with its
headers, as an attacker's site would. One lab run for the module: the lab-side tests read
its one result. The pure parts (policy fields, header rewriting, secret reading, the CA's
certificates) are checked without a lab, the CA's over a socket pair."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import tempfile
from pathlib import Path

import pytest

from rockroll.sandbox import EgressPolicy, SandboxSpec, SecretRef, SpecError
from rockroll.sandbox.deployment import httpstream, inject, tlsinspect

from _netlab import NetLab, lab_available

why_not = lab_available()
needs_lab = pytest.mark.skipif(why_not is not None and os.environ.get("CI") != "true", reason=why_not or "")
_ANSWER = re.compile(r"HTTP/1\.1 (\d{3}) [^\r]*\r\n(?:[^\r]+\r\n)*\r\nrockroll sandbox gateway: (\w+)")


@pytest.fixture(scope="module", params=["root", "unprivileged"])
def lab_result(request, tmp_path_factory):
    """One lab run per path: as root (veths, ``network.py``) and as uid 65534 with the
    system Python (``usernet.py``, ``_nobody.py``), the same gateway and attacks."""
    if why_not:
        pytest.fail(f"CI must run the network tests: {why_not}")
    if request.param == "root":
        with NetLab(tmp_path_factory.mktemp("tlslab")) as lab:
            return lab.run_host("inspect", driver="_tlsdriver.py")
    world = Path(tempfile.mkdtemp(prefix="rockroll-unpriv-", dir="/tmp"))  # nobody can reach it
    try:
        os.chmod(world, 0o755)
        (world / "lab").mkdir()
        with NetLab(world / "lab") as lab:
            return lab.run_host_unprivileged(world, "inspect", driver="_tlsdriver.py")
    finally:
        shutil.rmtree(world, ignore_errors=True)


def gateway_answer(case: dict) -> tuple[int, str] | None:
    """The gateway's own refusal in what the client got (status, reason), or None."""
    m = _ANSWER.search(case.get("got", ""))
    return (int(m.group(1)), m.group(2)) if m else None


def memory_read(r: dict) -> bool:
    """Whether the driver read the sandbox's processes' memory: as root it must have; as
    nobody it cannot (the guest's processes are not dumpable, so not readable by their owner)."""
    assert (r["memory"] is not None) == (r["euid"] == 0), (r["euid"], r["memory"])
    return r["euid"] == 0


def upstream_hosts(case: dict) -> list[str]:
    return [x["host"] for x in case["upstream"]]


@needs_lab
def test_clients_inside_trust_the_sandbox_ca_with_no_flags(lab_result):
    """curl and Python, with the variables and with the system bundle alone, Node and pip
    (through theirs) trust the sandbox's CA; ALPN gives HTTP/1.1 to a client that offers h2 too, and one that speaks
    h2 alone is refused by its preface."""
    r = lab_result
    ex = r["extract"]
    assert (ex["curl"], ex["curl_system"], ex["python"], ex["python_system"], ex["node"]) == (
        "allowed-site", "allowed-site", "allowed-site:api\n", "allowed-site\n", "allowed-site"), ex
    # pip reached the index over the sandbox's CA: the GET was answered (a page that is no index), no TLS error
    assert "Skipping page https://allowed.test/simple/nothing-here/ because the GET request got" in ex["pip"]
    assert "SSL" not in ex["pip"] and "CERTIFICATE" not in ex["pip"], ex["pip"]
    assert ex["trust_env"].split() == [tlsinspect.BUNDLE_PATH] * 5
    assert r["ca_pem_inside"] == 1 and "PRIVATE KEY" not in ex["bundle"]
    assert r["uninspected_env"] == ""  # no inspection: no CA, no variables
    cases = r["cases"]
    assert cases["allowed"]["got"].endswith("allowed-site") and cases["allowed"]["counted"] == {}
    assert cases["h2_offered"]["alpn"] == "http/1.1" and cases["h2_offered"]["got"].endswith("allowed-site")
    assert cases["h2_only"]["alpn"] is None
    assert (gateway_answer(cases["h2_only"]), cases["h2_only"]["counted"]) == ((400, "http_malformed"),
                                                                                {"http_malformed": 1})


@needs_lab
def test_tls_it_cannot_terminate_is_refused_and_a_late_hello_is_inspected(lab_result):
    """A ClientHello inside a CONNECT tunnel the server agreed to: the gateway cannot put its
    certificate there, so it refuses (``tls_tunnel``) rather than pass TLS it cannot read. A
    client that waits past the sniff window before its ClientHello is inspected as any other."""
    ex = lab_result["extract"]
    assert ex["tunnel_tls"].splitlines()[0] == "HTTP/1.1 200 Connection established", ex["tunnel_tls"]
    assert ex["tunnel_tls"].splitlines()[1].startswith("refused "), ex["tunnel_tls"]
    assert ex["late_hello"] == "allowed-site\n", ex["late_hello"]
    assert lab_result["stats"]["denied"]["tls_tunnel"] == 1


@needs_lab
def test_domain_fronting_is_refused_with_inspection_and_passes_without(lab_result):
    """SNI allowed.test, ``Host`` another name of the address: refused before a byte goes
    on (``http_host`` for a name not allowed, ``http_sni`` for an allowed one, whose secret
    must not go over a connection verified for another name). Without inspection the same
    request reaches evil.test: the hole docs/security.md describes."""
    cases = lab_result["cases"]
    for name, want in (("fronting_evil", (403, "http_host")), ("fronting_api", (421, "http_sni"))):
        case = cases[name]
        assert (gateway_answer(case), case["counted"], case["upstream"]) == (want, {want[1]: 1}, []), case
    assert "evil-site" in lab_result["uninspected_fronting"]["got"]


@needs_lab
def test_each_request_inside_inspected_tls_is_judged(lab_result):
    """A second request, pipelined or kept alive, an absolute-form target, Content-Length
    with Transfer-Encoding, a request after a 101, a method the host's rule does not take:
    judged one by one, as on plain HTTP; what
    came before a refused one was answered; a body that reads as a request stays a body."""
    cases = lab_result["cases"]
    for name, want, reached in (
            ("keepalive_evil", (403, "http_host"), ["api.test"]), ("pipelined_evil", (403, "http_host"), ["api.test"]),
            ("absolute_evil", (403, "http_target"), []), ("smuggle_cl_te", (400, "http_smuggling"), []),
            ("upgrade_then_evil", (403, "http_host"), []),  # the echo (after its 101) writes no record
            ("rule_method", (403, "http_method"), [])):  # the policy's rule for allowed.test: GET and HEAD
        case = cases[name]
        assert (gateway_answer(case), case["counted"], upstream_hosts(case)) == (want, {want[1]: 1}, reached), case
    assert cases["keepalive_evil"]["got"].count("allowed-site:api") == 1
    body = cases["body_is_a_request"]
    assert "posted=61" in body["got"] and upstream_hosts(body) == ["api.test"] and body["counted"] == {}


@needs_lab
def test_a_forged_upstream_certificate_fails_and_the_client_gets_an_error(lab_result):
    """A certificate of the trusted CA for other names, one of a CA nobody trusts: the
    gateway's verification fails, the client gets a 502 naming why, never a page; a client
    that pins its server's CA fails its handshake with the sandbox's (counted)."""
    cases = lab_result["cases"]
    for name, why in (("wrong_name", "Hostname mismatch"), ("rogue_ca", "unable to get local issuer certificate")):
        case = cases[name]
        assert (gateway_answer(case), case["counted"]) == ((502, "tls_upstream"), {"tls_upstream": 1}), case
        assert why in case["got"] and "site" not in case["got"].split("tls_upstream")[0]
    pinned = cases["pinned"]
    assert pinned["error"].startswith("SSLCertVerificationError") and pinned["counted"] == {"tls_client": 1}, pinned


@needs_lab
def test_the_secret_reaches_its_host_and_nothing_in_the_sandbox(lab_result):
    """Control: api.test receives the secrets (the client's own values under those names
    replaced), allowed.test none. Attacks from inside, none of which shows the secret: every
    process's environ and cmdline, the filesystem searched for the secrets' shape, the
    memory of every process of the sandbox (read on the host), evil.test's header echo
    reached by fronting, a kept-alive or pipelined second request, an absolute target,
    smuggling, a request inside an upgraded stream (echoed back as sent: no secret added).
    The looks find a decoy put where the sandbox can see it. A secret not on the host fails
    the start, naming its header."""
    r = lab_result
    token, key = r["secrets"]
    cases = r["cases"]
    api = cases["api"]["upstream"]
    assert len(api) == 1 and api[0]["host"] == "api.test"
    sent = [(k.lower(), v) for k, v in api[0]["headers"] if k.lower() in ("authorization", "x-api-key")]
    assert sorted(sent) == [("authorization", f"Bearer {token}"), ("x-api-key", key)], sent
    allowed = cases["allowed"]["upstream"][0]["headers"]
    assert not [k for k, _ in allowed if k.lower() in ("authorization", "x-api-key")]
    reached = [x for c in cases.values() for x in c["upstream"]]
    assert "evil.test" not in [x["host"] for x in reached]
    assert all(token not in json.dumps(x) for x in reached if x["host"] != "api.test")
    for name, case in cases.items():  # what the client got back, in every case
        assert token not in json.dumps(case.get("got", case.get("error"))), name
        assert key not in json.dumps(case.get("got", case.get("error"))), name
    echoed = cases["upgrade_then_api"]["got"]
    assert "\r\n\r\nGET /headers HTTP/1.1\r\nHost: api.test\r\n\r\n" in echoed and "Authorization" not in echoed
    for name, out in r["extract"].items():
        assert token not in out and key not in out, name
    assert r["decoy"] in r["extract"]["filesystem"] and "SSL_CERT_FILE=" in r["extract"]["environ"]
    if memory_read(r):
        assert r["memory"]["token"] == 0 and r["memory"]["key"] == 0 and r["memory"]["decoy"] >= 1, r["memory"]
    assert r["missing_secret"][:2] == ["SpecError", "egress.inject.api.test.Authorization"]
    assert r["links_left"] == []


@needs_lab
def test_the_ca_key_is_not_readable_inside(lab_result):
    """The CA's key (and its scalar) is in no process of the sandbox and in no file it can
    read; its trust store holds certificates only."""
    r = lab_result
    if memory_read(r):
        assert r["memory"]["ca_key"] == 0 and r["memory"]["ca_scalar"] == 0, r["memory"]
    assert all(r["ca_key_line"] not in out for out in r["extract"].values())
    assert "PRIVATE KEY" not in r["extract"]["bundle"]


@needs_lab
def test_the_audit_log_records_each_inspected_request_and_names_injected_headers(lab_result):
    """One ``https`` record per request inside inspected TLS (method, host, path, status,
    bytes), the refused ones with their reason; the injected headers by name, never a value."""
    r = lab_result
    token, key = r["secrets"]
    log = [x for x in r["log"] if x["kind"] != "dns"]
    assert token not in json.dumps(r["log"]) and key not in json.dumps(r["log"])
    api = [x for x in log if x["kind"] == "https" and x["host"] == "api.test" and x["decision"] == "allowed"]
    assert api and all(x["injected"] == ["Authorization", "X-Api-Key"] for x in api)
    assert all(x["status"] in (200, 101) and x["bytes_out"] > 0 and x["bytes_in"] > 0 for x in api), api
    first = next(x for x in log if x["host"] == "allowed.test" and x["kind"] == "https")
    assert (first["method"], first["path"], first["status"], first["port"], first["injected"]) == (
        "GET", "/", 200, 443, [])
    refused = {x["reason"] for x in log if x["decision"] == "refused"}
    assert refused == {"http_host", "http_sni", "http_target", "http_smuggling", "http_malformed", "http_method",
                       "tls_upstream", "tls_client", "tls_tunnel"}, refused
    assert r["stats"]["denied"] == {"http_malformed": 1, "http_host": 4, "http_sni": 1, "http_target": 1,
                                    "http_smuggling": 1, "http_method": 1, "tls_upstream": 2, "tls_client": 1,
                                    "tls_tunnel": 1}


# -- without a lab ----------------------------------------------------------------------

@pytest.mark.parametrize("policy, field", [
    (dict(hosts=["api.example"], inject={"api.example": {"Authorization": "env:TOKEN"}}), "egress.inject"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"other.example": {"X": "env:T"}}),
     "egress.inject.other.example"),
    (dict(hosts=["*.example"], inspect_tls=True, inject={"*.example": {"X": "env:T"}}), "egress.inject.*.example"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"Host": "env:T"}}),
     "egress.inject.api.example.Host"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"Content-Length": "env:T"}}),
     "egress.inject.api.example.Content-Length"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"a b": "env:T"}}),
     "egress.inject.api.example.a b"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"X": "env:1T"}}),
     "egress.inject.api.example.X"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"X": "file:relative"}}),
     "egress.inject.api.example.X"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"X": "T"}}), "egress.inject.api.example.X"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {"X": "env:T", "x": "env:U"}}),
     "egress.inject.api.example.x"),
    (dict(hosts=["api.example"], inspect_tls=True, inject={"api.example": {}}), "egress.inject.api.example"),
    (dict(hosts=["api.example"], inspect_tls=True, inject=["api.example"]), "egress.inject"),
    (dict(inspect_tls="yes"), "egress.inspect_tls"),
    (dict(upstream_ca="/ca.pem"), "egress.upstream_ca"),
    (dict(inspect_tls=True, upstream_ca="ca.pem"), "egress.upstream_ca"),
])
def test_bad_inspection_policies_are_refused_by_field(policy, field):
    with pytest.raises(SpecError) as e:
        SandboxSpec(network=True, egress=policy)
    assert e.value.field == field


def test_an_inspecting_policy_round_trips_and_the_service_refuses_host_secrets():
    """``to_dict`` / JSON / ``from_dict`` keep it whole (a secret as its reference); a
    service client may ask for inspection, not for the service's own secrets or files."""
    from rockroll.sandbox.protocol.wire import SpecIn

    policy = EgressPolicy(hosts=("API.example.",), inspect_tls=True,
                          inject={"api.example": {"Authorization": SecretRef("env:TOKEN", prefix="Bearer "),
                                                  "X-Key": "file:/run/secrets/key"}})
    assert policy.inject == {"api.example": {"Authorization": SecretRef("env:TOKEN", "Bearer "),
                                             "X-Key": SecretRef("file:/run/secrets/key")}}
    spec = SandboxSpec(network=True, egress=policy)
    body = json.loads(json.dumps(spec.to_dict()))
    assert SandboxSpec.from_dict(body) == spec
    with pytest.raises(SpecError, match="egress.inject: reads secrets of the service's host"):
        SpecIn(**body).to_spec("local")
    body["egress"]["inject"] = {}
    assert SpecIn(**body).to_spec("local").egress.inspect_tls is True
    body["egress"]["upstream_ca"] = "/etc/ssl/certs/ca-certificates.crt"
    with pytest.raises(SpecError, match="egress.upstream_ca"):
        SpecIn(**body).to_spec("local")


def test_with_headers_replaces_every_line_of_a_name_and_keeps_the_rest():
    raw = (b"GET /x HTTP/1.1\r\nHost: api.example\r\nauthorization: mine\r\nAccept: */*\r\n"
           b"AUTHORIZATION: again\r\nX-Authorization: kept\r\n\r\n")
    head = httpstream.parse_head(raw)
    out = httpstream.with_headers(head, {"Authorization": "Bearer s"})
    assert out == (b"GET /x HTTP/1.1\r\nHost: api.example\r\nAccept: */*\r\nX-Authorization: kept\r\n"
                   b"Authorization: Bearer s\r\n\r\n")
    again = httpstream.parse_head(out)  # still one well-formed head, for the same host
    assert (again.host, again.length, again.chunked) == ("api.example", 0, False)


def test_secrets_are_read_on_the_host_and_errors_never_hold_them(tmp_path, monkeypatch):
    policy = EgressPolicy(hosts=("api.example", "other.example"), inspect_tls=True, inject={"api.example": {
        "Authorization": SecretRef("env:RR_TEST_SECRET", prefix="Bearer "), "X-Key": f"file:{tmp_path}/key"}})
    monkeypatch.setenv("RR_TEST_SECRET", "s3cr3t")
    (tmp_path / "key").write_text("filekey\n")
    injector = inject.Injector(policy)
    assert "s3cr3t" not in repr(injector) and "filekey" not in repr(injector)
    head = httpstream.parse_head(b"GET / HTTP/1.1\r\nHost: api.example\r\nX-KEY: mine\r\n\r\n")
    raw, names = injector.apply(head)
    assert names == ("Authorization", "X-Key")
    assert raw == b"GET / HTTP/1.1\r\nHost: api.example\r\nAuthorization: Bearer s3cr3t\r\nX-Key: filekey\r\n\r\n"
    other = httpstream.parse_head(b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n")
    assert injector.apply(other) == (other.raw, ())
    for value, why in (("two\nlines s3cr3t", "holds CR, LF or NUL"), ("", "is empty")):
        monkeypatch.setenv("RR_TEST_SECRET", value)
        with pytest.raises(SpecError, match=why) as e:
            inject.Injector(policy)
        assert e.value.field == "egress.inject.api.example.Authorization" and "s3cr3t" not in str(e.value)
    monkeypatch.delenv("RR_TEST_SECRET")
    with pytest.raises(SpecError, match="RR_TEST_SECRET is not set"):
        inject.Injector(policy)
    monkeypatch.setenv("RR_TEST_SECRET", "ok")
    (tmp_path / "key").unlink()
    with pytest.raises(SpecError, match="cannot read") as e:
        inject.Injector(policy)
    assert e.value.field == "egress.inject.api.example.X-Key"


def _handshake(authority: tlsinspect.Authority, name: str, cafile: str, alpn: list[str]):
    """A client verifying against ``cafile`` meets ``authority``'s leaf for ``name`` over a
    socket pair: (client's ALPN, or the client's error)."""
    async def run():
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_connection(sock=a)
        rb, wb = await asyncio.open_connection(sock=b)
        server = tlsinspect.TLSStream(authority.server_context(name), ra, wa, server_side=True)
        ctx = ssl.create_default_context(cafile=cafile)
        ctx.set_alpn_protocols(alpn)
        client = tlsinspect.TLSStream(ctx, rb, wb, server_side=False, server_hostname=name)
        try:
            got = await asyncio.gather(asyncio.wait_for(server.handshake(), 5), client.handshake(),
                                       return_exceptions=True)
            if isinstance(got[1], Exception):
                return type(got[1]).__name__
            client.write(b"ping")
            assert await server.read() == b"ping"
            client.write_eof()  # a close_notify: the other way still carries an answer
            assert await server.read() == b""
            server.write(b"pong")
            server.write_eof()
            assert (await client.read(), await client.read()) == (b"pong", b"")
            return client.alpn
        finally:
            wa.close()
            wb.close()
    return asyncio.run(run())


def test_the_sandbox_ca_signs_leaves_for_the_policys_names_only(tmp_path):
    authority = tlsinspect.Authority(("allowed.example", "*.wild.example"))
    ca = tmp_path / "ca.pem"
    ca.write_bytes(authority.cert_pem)
    assert _handshake(authority, "allowed.example", str(ca), ["h2", "http/1.1"]) == "http/1.1"
    assert _handshake(authority, "a.wild.example", str(ca), ["http/1.1"]) == "http/1.1"
    # a leaf for a name outside the policy: the CA's name constraints fail it at the client
    assert _handshake(authority, "evil.example", str(ca), ["http/1.1"]) == "SSLCertVerificationError"
    assert authority.server_context("allowed.example") is authority.server_context("allowed.example")  # cached
    bundle = tlsinspect.trust_bundle(authority.cert_pem)
    assert bundle.endswith(authority.cert_pem) and b"PRIVATE KEY" not in bundle
