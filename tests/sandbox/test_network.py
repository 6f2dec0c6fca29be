"""A sandbox's own network and its egress policy, attacked from inside as an agent would.

Each test builds a lab (``_netlab.py``): "the host" is a network namespace the test makes
(no physical interface), "the internet" another, wired only to it; the sandboxes are made
by ``_netdriver.py`` running inside the host namespace. Nothing touches the machine's own
network namespace. Each attack must be refused *and* counted under its reason; what the
policy allows must work, ``pip install`` from the lab's package index included."""

from __future__ import annotations

import os

import pytest

from rockroll.sandbox import EgressPolicy, SandboxSpec, SpecError
from rockroll.sandbox.egress import HttpRule, address_class

from _netlab import NetLab, lab_available

why_not = lab_available()
needs_lab = pytest.mark.skipif(why_not is not None and os.environ.get("CI") != "true", reason=why_not or "")


@pytest.fixture
def lab(tmp_path):
    if why_not:
        pytest.fail(f"CI must run the network tests: {why_not}")
    with NetLab(tmp_path) as lab:
        yield lab


def refused(result) -> bool:
    """A probe's result when the connection or lookup was refused: an error, closed by
    the proxy before any byte (a reset when the client's bytes were still unread), or the
    gateway's own 4xx answer to an HTTP request (``httpstream.Refused.response``)."""
    return isinstance(result, str) and (result.startswith("error:") or result == "closed" or (
        result.startswith("HTTP/1.1 4") and "\r\n\r\nrockroll sandbox gateway: " in result))


# _netdriver.REQUEST_ATTACKS refused: (the gateway's answer, the reason it gives and counts)
REFUSED_REQUESTS = {
    "keepalive_second_host": (403, "http_host"), "pipelined": (403, "http_host"),
    "absolute_form": (403, "http_target"), "absolute_form_no_host": (403, "http_host"),
    "connect": (403, "http_host"), "cl_and_te": (400, "http_smuggling"), "two_lengths": (400, "http_smuggling"),
    "folding": (400, "http_folding"), "giant_header": (431, "http_head_size"), "slow_head": (408, "http_slow"),
    "upgrade_declined": (403, "http_host"), "upgrade_not_first": (403, "http_upgrade"),
    "other_method": (403, "http_host"), "silent_first": (403, "http_host"), "http2_preface": (400, "http_malformed"),
    "bare_lf": (400, "http_malformed"), "upgrade_then_http": (403, "http_host"),
    "upgrade_to_http2": (400, "http_malformed"), "connect_tunnel": (403, "http_host"),
    "blank_line_first": (400, "http_malformed"),
}


def check_every_request_judged(r: dict) -> None:
    """``_netdriver.requests``' result (root and unprivileged paths alike)."""
    attacks = r["attacks"]
    got = {name: (a["status"], a["reason"], a["counted"], a["evil"]) for name, a in attacks.items()
           if name in REFUSED_REQUESTS}
    want = {name: (status, reason, {reason: 1}, False) for name, (status, reason) in REFUSED_REQUESTS.items()}
    assert got == want, {name: attacks[name]["raw"] for name in got if got[name] != want[name]}
    # what came before a refused request on its connection was answered
    assert all(attacks[name]["allowed"] == 1 for name in (
        "keepalive_second_host", "pipelined", "absolute_form_no_host", "upgrade_declined", "slow_head")), attacks
    # allowed requests one after another, bodies by length and chunked, pass whole
    works = {name: tuple(attacks[name][k] for k in ("status", "allowed", "posted", "counted"))
             for name in ("two_allowed", "post_length_then_get", "post_chunked_then_get", "absolute_allowed")}
    assert works == {"two_allowed": (None, 2, [], {}), "post_length_then_get": (None, 2, ["posted=5"], {}),
                     "post_chunked_then_get": (None, 2, ["posted=5"], {}), "absolute_allowed": (None, 1, [], {})}, works
    # after a 101 the new protocol's bytes pass, to the server decided on (an echo here)
    upgraded = attacks["upgrade_accepted"]
    assert upgraded["echoed"] and not upgraded["evil"] and upgraded["counted"] == {}, upgraded


@needs_lab
def test_allow_list_holds_against_each_attack_and_counts_it(lab):
    r = lab.run_host("restricted")
    assert r["resolv"].startswith("nameserver 10.231.")
    assert r["allowed_http"] == "allowed-site"
    assert r["wildcard_http"] == "allowed-site"
    assert r["allowed_tls"] == "tls-site"  # HTTPS through the proxy, the test CA's certificate
    assert r["pip"][:2] == [0, "from-the-test-index"], r["pip"]
    for name, a in r["attacks"].items():
        assert refused(a["result"]), (name, a)
        assert a["counted"] >= 1, (name, a)
    assert r["raw_socket"].startswith("error:PermissionError"), r["raw_socket"]  # no CAP_NET_RAW
    assert r["own_loopback"].startswith("error:ConnectionRefused")  # its own lo, not the host's
    stats = r["stats"]
    assert stats["connections"] >= 4 and stats["bytes_in"] > 1000 and stats["bytes_out"] > 100


@needs_lab
def test_every_http_request_on_a_connection_is_judged(lab):
    """A CDN's edge holds allowed.test and evil.test on one address (the lab's 203.0.113.10
    routes each request by its own target or Host). Only allowed.test is allowed: a second
    request on a kept-alive connection, pipelined requests, an absolute-form target, a
    CONNECT, smuggling shapes (Content-Length with Transfer-Encoding, two lengths, folding),
    a giant head, a slow one, an Upgrade the server declines, an unknown method, a client
    silent past the sniff, HTTP/2's preface: each refused with the gateway's 4xx and
    counted under its reason, evil.test never answering; allowed requests and bodies pass."""
    check_every_request_judged(lab.run_host("requests"))


@needs_lab
def test_a_hosts_rule_holds_for_every_request(lab):
    """``rules`` for allowed.test (GET and HEAD, paths under /ok): each request is judged,
    the second on a kept-alive connection and an absolute-form one too, and each path a
    server could resolve outside the prefix (dot segments, encoded, Tomcat's ``..;``,
    backslashes, overlong UTF-8) is refused and counted, never answered by the server;
    another name on the same address has no rule; TLS to a host with a rule, not inspected,
    is refused (its requests would go unseen)."""
    from _netdriver import RULE_CASES

    r = lab.run_host("rules")
    for name, _, reason in RULE_CASES:
        case = r["cases"][name]
        if reason is None:
            assert (case["status"], case["counted"], case["answered"]) == (None, {}, 1), (name, case)
            assert [x[0] for x in case["records"]] == ["allowed"], (name, case)
        else:
            assert (case["status"], case["reason"], case["counted"]) == (403, reason, {reason: 1}), (name, case)
            assert case["records"][-1][:2] == ["refused", reason], (name, case)
            assert case["answered"] == (1 if name == "keepalive_second" else 0), (name, case)  # the first was /ok/1
    assert r["tls_counted"] == {"tls_rules": 1} and "tls-site" not in str(r["tls"]), r


def check_close_with_connections_open(r: dict) -> None:
    """``_netdriver.close_open``'s result (root and unprivileged paths alike)."""
    assert r["hold_out"] == ["holding\n"] * 2, r["hold_out"]
    assert min(r["open"]) >= 6, r  # each held connection had its handler running, at the reset and the close
    assert r["said"] == [], r["said"]  # no "Exception in callback ... CancelledError", nothing at all
    assert r["after"] == r["before"], r  # no task of the gateway's loop, no socket left


@needs_lab
def test_closing_a_sandbox_with_connections_open_prints_and_leaks_nothing(lab):
    """Connections kept alive idle, mid-download, mid-head, upgraded, waiting on a long poll
    and silent past the sniff, all open when the sandbox resets (its gateway closes, a new
    one starts) and when it closes: nothing is logged or printed (asyncio used to
    report each cancelled handler's CancelledError), and the gateway's loop and the process
    hold no task or socket more than before the sandbox was made."""
    check_close_with_connections_open(lab.run_host("close_open"))


@needs_lab
def test_open_network_is_the_public_internet_only_and_inbound_needs_expose(lab):
    r = lab.run_host("open")
    assert "other-site" in r["direct_public_ip"], r  # any public address, any Host
    assert r["any_name"] == "other-site"
    assert refused(r["metadata"])
    assert r["private_name"].startswith("error:") and r["rebind"].startswith("error:")
    assert r["listen"] == "listening"
    assert refused(r["other_sandbox"])
    assert r["host_before_expose"].startswith("error:")  # the host cannot open a connection in ...
    assert r["exposed"] == ["127.0.0.1", "from-the-sandbox"]  # ... until expose
    denied = r["a_stats"]["denied"]
    assert denied.get("metadata") == 1 and denied.get("sandbox") == 1 and denied.get("rebinding") == 2, denied


@needs_lab
def test_name_resolution_is_the_gateways_read_only_and_in_no_snapshot(lab):
    """A sandbox with network resolves through its gateway: a resolv.conf naming it (a
    restore wires a new namespace and names the new one), bound read-only, out of the
    snapshot; a sandbox without network, even one restored from that snapshot, knows
    localhost only."""
    r = lab.run_host("etc")
    want = {**r["no_network_etc"], "resolv.conf": f"nameserver {r['gateway']}\noptions attempts:3 timeout:2\n"}
    assert r["with_network"] == want
    assert all(code != 0 for code in r["attacks"]), r["attacks"]
    assert r["after_attacks"] == want
    files, gateway, resolved = r["after_restore"]
    assert files["resolv.conf"] == f"nameserver {gateway}\noptions attempts:3 timeout:2\n"
    assert resolved == "203.0.113.10"
    assert r["restored_without_network"] == ["kept\n", r["no_network_etc"]]
    # egress.bandwidth_mbit: a token bucket on each end of the veth; a CIDR opens its
    # addresses without a name, nothing else
    assert all("tbf" in q and "rate 8Mbit" in q for q in r["capped_qdiscs"]), r["capped_qdiscs"]
    assert "other-site" in r["capped_by_cidr"]
    assert refused(r["capped_outside_cidr"])


@needs_lab
def test_docker_sandbox_gets_the_same_network_and_policy(lab, client):
    """backend='docker': the container (network 'none') is wired to a gateway in the
    namespace of the process that made it, with the same policy and counters, a host's
    rules, and TLS inspection: openssl in the container completes a verified handshake
    against the sandbox's CA only, and each request inside TLS is judged (a path the rule
    does not name, and domain fronting, get a 403)."""
    r = lab.run_host("docker")
    assert r["resolv"].startswith(f"nameserver {r['gateway']}\n")
    assert "allowed-site" in r["allowed"], r
    for name, a in r["attacks"].items():
        assert "-site" not in a["stdout"] and a["counted"] >= 1, (name, a)
    # pipelined: allowed.test answered, the request for evil.test (on its address) refused
    assert "allowed-site" in r["pipelined"] and "evil-site" not in r["pipelined"], r["pipelined"]
    assert "403 Forbidden" in r["pipelined"] and r["stats"]["denied"].get("http_host", 0) >= 2, r["stats"]
    assert r["stats"]["connections"] >= 1
    # inspection's CA in the container's trust store and variables; a host's rule holds there
    inspected = r["inspected"]
    assert inspected["ca_in_bundle"] == 1 and inspected["env"].split() == ["/etc/ssl/certs/ca-certificates.crt"] * 5
    assert "403 Forbidden" in inspected["ruled_out"] and "http_path" in inspected["ruled_out"], inspected
    assert "allowed-site" not in inspected["ruled_out"]
    tls = r["tls"]
    assert tls["ok"]["exit_code"] == 0 and "allowed-site" in tls["ok"]["stdout"], tls["ok"]
    for refused_ in ("other_path", "fronting"):
        assert "403 Forbidden" in tls[refused_]["stdout"] and "-site" not in tls[refused_]["stdout"], tls[refused_]
    # trusting only the CA that signed the real server's certificate (a pinning client), the
    # handshake fails, and the gateway counts the client's refusal
    assert tls["untrusted"]["exit_code"] != 0 and "verify error" in tls["untrusted"]["stderr"], tls["untrusted"]
    assert "-site" not in tls["untrusted"]["stdout"]
    assert inspected["denied"] == {"http_path": 2, "http_host": 1, "tls_client": 1}, inspected


@needs_lab
def test_hub_build_setup_reaches_only_the_hosts_the_package_lists(lab):
    """A package's ``network = ["pypi.test"]``: its setup step pip-installs from the lab's
    index, another step finds other.test unresolvable and its address refused (the step
    fails the build otherwise); the built image's sandboxes have no network."""
    r = lab.run_host("build")
    assert r == {"imported": "from-the-test-index", "network": False}


@needs_lab
def test_an_address_is_granted_for_its_dns_ttl_only(lab):
    """The gateway honours TTLs: the sandbox's answer carries the grant's lifetime (the
    upstream TTL held within the floor, lowered to 2 s by the driver, and the 3600 s
    ceiling); when a name moves, its old address is refused once the grant ran out."""
    r = lab.run_host("ttl")
    assert r["ttls"] == {"moving.test": [0, [["203.0.113.20", 2]]],  # 1 s upstream: the floor
                         "allowed.test": [0, [["203.0.113.10", 30]]],  # as the lab's server said
                         "long.test": [0, [["203.0.113.10", 3600]]]}, r["ttls"]  # a day: the ceiling
    assert r["before_move"] == "other-site"
    assert refused(r["old_address"]) and r["old_address_counted"] == 1, r
    assert r["after_move"] == "allowed-site"  # looked up again: the new address, granted
    assert refused(r["old_after_move"])


@needs_lab
def test_a_scrape_reads_the_packet_filter_once_for_every_sandbox(lab):
    """/metrics of two networked sandboxes: each one's kernel drops exact and as its own
    detail says, read with one ``*-save -c`` a table (three commands, not three a sandbox)."""
    r = lab.run_host("scrape")
    assert sorted(r["commands_in_scrape"]) == ["ip6tables-save", "iptables-save", "iptables-save"], r
    for sid, sent, detail in zip(r["ids"], r["udp_sent"], r["detail"]):
        assert detail.get("udp") == sent and detail.get("ipv6", 0) >= 1, detail
        for reason, n in detail.items():
            line = f'rockroll_sandbox_network_denied_total{{reason="{reason}",sandbox="{sid}"}} {float(n)}'
            assert line in r["metrics"], (line, r["metrics"])


@needs_lab
def test_rules_of_an_owner_killed_with_9_are_reaped(lab):
    r = lab.run_host("leftovers")
    assert r["rules_while_alive"] > 0 and r["rules_after_kill"] == r["rules_while_alive"]
    assert r["reaped"] >= 1 and r["rules_after_reap"] == 0, r


@needs_lab
def test_counters_reach_the_services_metrics(lab):
    r = lab.run_host("service")
    assert r["ok"]["stdout"].strip() == "allowed-site", r["ok"]
    assert r["denied"]["stdout"].strip() == "0" or r["denied"]["exit_code"] != 0, r["denied"]  # closed, or reset
    assert r["exposed"] == ["127.0.0.1", "served"], r  # POST /v1/sandboxes/{id}/expose
    assert r["through_service"] == [200, "page-in-the-sandbox\n", 401], r  # /v1/sandboxes/{id}/ports/8001/...
    assert r["described"]["network"]["denied"]["address"] == 1, r["described"]  # what the dashboard shows
    lines = "\n".join(r["metrics"])
    sid = r["id"]
    assert f'rockroll_sandbox_network_denied_total{{reason="address",sandbox="{sid}"}} 1.0' in lines, lines
    assert f'rockroll_sandbox_network_connections_total{{sandbox="{sid}"}} 1.0' in lines, lines
    assert f'rockroll_sandbox_network_bytes_total{{direction="in",sandbox="{sid}"}}' in lines, lines


@pytest.mark.parametrize("policy, field", [
    (dict(hosts=["bad host"]), "egress.hosts"),
    (dict(hosts=["*"]), "egress.hosts"),
    (dict(hosts="index.example"), "egress.hosts"),
    (dict(cidrs=["10.0.0.0/33"]), "egress.cidrs"),
    (dict(cidrs=["127.0.0.0/8"]), "egress.cidrs"),
    (dict(cidrs=["0.0.0.0/0"]), "egress.cidrs"),
    (dict(ports=[0]), "egress.ports"),
    (dict(ports=["80"]), "egress.ports"),
    (dict(bandwidth_mbit=0), "egress.bandwidth_mbit"),
    (dict(nonsense=1), "egress.nonsense"),
    (dict(hosts=["a.example"], rules={"b.example": {}}), "egress.rules.b.example"),
    (dict(hosts=["*.a.example"], rules={"x.a.example": {}}), "egress.rules.x.a.example"),  # as hosts writes it
    (dict(hosts=["a.example"], rules={"a.example": {"methods": ["get"]}}), "egress.rules.a.example.methods"),
    (dict(hosts=["a.example"], rules={"a.example": {"methods": "GET"}}), "egress.rules.a.example.methods"),
    (dict(hosts=["a.example"], rules={"a.example": {"paths": ["v1/"]}}), "egress.rules.a.example.paths"),
    (dict(hosts=["a.example"], rules={"a.example": {"paths": ["/v1/../admin"]}}), "egress.rules.a.example.paths"),
    (dict(hosts=["a.example"], rules={"a.example": {"paths": ["/v1?x=1"]}}), "egress.rules.a.example.paths"),
    (dict(hosts=["a.example"], rules={"a.example": {"verbs": ["GET"]}}), "egress.rules.a.example"),
    (dict(hosts=["a.example"], rules=["a.example"]), "egress.rules"),
])
def test_bad_policies_are_refused_by_field(policy, field):
    with pytest.raises(SpecError) as e:
        SandboxSpec(network=True, egress=policy)
    assert e.value.field == field


def test_policy_needs_network_and_round_trips():
    with pytest.raises(SpecError, match="network=True"):
        SandboxSpec(egress=EgressPolicy(hosts=("index.example",)))
    spec = SandboxSpec(network=True, egress=EgressPolicy(hosts=("Index.Example.", "*.packages.example"), ports=(443,)))
    assert SandboxSpec.from_dict(spec.to_dict()) == spec
    p = spec.egress
    assert p.hosts == ("index.example", "*.packages.example")
    assert p.allows_name("files.packages.example") and p.allows_name("a.b.packages.example")
    assert not p.allows_name("packages.example") and not p.allows_name("evilpackages.example")
    assert not p.allows_name("index.example.evil.com")
    assert p.allows_port(443) and not p.allows_port(80)


@pytest.mark.parametrize("method, path, why", [
    ("GET", "/v1", None), ("GET", "/v1/", None), ("HEAD", "/v1/models/x", None), ("GET", "/v1/a.b/...", None),
    ("POST", "/v1/models", "http_method"), ("get", "/v1", "http_method"),
    ("GET", "/v1beta", "http_path"), ("GET", "/", "http_path"), ("GET", None, "http_path"),
    ("GET", "/v1/../admin", "http_path"), ("GET", "/v1/..", "http_path"), ("GET", "/v1/./x", "http_path"),
    ("GET", "/v1/%2e%2e/admin", "http_path"), ("GET", "/v1/%2E./admin", "http_path"),
    ("GET", "/v1%2fadmin", "http_path"), ("GET", "/v1/..;x=1/admin", "http_path"),
    ("GET", "/v1\\..\\admin", "http_path"), ("GET", "/v1/%5c../admin", "http_path"),
    ("GET", "/v1/%c0%ae%c0%ae/admin", "http_path"), ("GET", "/v1/%00", "http_path"),
])
def test_a_rule_takes_its_methods_and_paths_only(method, path, why):
    policy = EgressPolicy(hosts=("api.example", "*.example"), rules={
        "api.example": {"methods": ["GET", "HEAD"], "paths": ["/v1/"]}, "*.example": {"methods": ["GET"]}})
    assert policy.rule_for("API.example.").refusal(method, path) == why
    assert policy.rule_for("other.example") == HttpRule(methods=("GET",))  # the wildcard's, for the others
    assert policy.rule_for("example") is None and EgressPolicy(hosts=("x.example",)).rule_for("x.example") is None


def test_the_path_of_each_request_target_form():
    from rockroll.sandbox.deployment.httpstream import parse_head, path_of

    def path(line: str) -> str | None:
        return path_of(parse_head(f"{line}\r\nHost: a.example\r\n\r\n".encode()))

    assert path("GET /v1/x?q=/../y HTTP/1.1") == "/v1/x"
    assert path("GET http://a.example HTTP/1.1") == "/" and path("GET http://a.example/v1#f HTTP/1.1") == "/v1"
    assert path("GET http://a.example?q=1 HTTP/1.1") == "/"
    assert path("CONNECT a.example:443 HTTP/1.1") is None and path("OPTIONS * HTTP/1.1") is None


@pytest.mark.parametrize("ip, cls", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "loopback"),
    ("169.254.169.254", "metadata"), ("fe80::1", "metadata"), ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.1", "private"), ("100.64.0.1", "private"), ("fd00::1", "private"), ("224.0.0.1", "multicast"),
    ("203.0.113.10", None), ("8.8.8.8", None), ("2001:db8::1", None),
])
def test_address_classes(ip, cls):
    assert address_class(ip) == cls


@needs_lab
def test_the_suite_never_wires_the_namespace_it_started_in():
    """tests/conftest.py names the suite's own network namespace (the machine's) in
    ``ROCKROLL_SANDBOX_NETWORK_GUARD``: a sandbox with network made there is refused before
    any veth or rule is added; the lab's host namespace is another one."""
    from rockroll.sandbox import SandboxStartError, open_sandbox

    assert os.environ["ROCKROLL_SANDBOX_NETWORK_GUARD"] == os.readlink("/proc/self/ns/net")
    with pytest.raises(SandboxStartError, match="ROCKROLL_SANDBOX_NETWORK_GUARD"):
        open_sandbox(SandboxSpec(network=True, timeout_s=30))


def test_policy_travels_through_the_services_spec_model():
    """What the SDK sends (``to_dict`` as JSON) is what the service builds again: the policy
    reaches a remote or Ray sandbox whole, and a bad one is refused by its field there too."""
    import json

    from rockroll.sandbox.protocol.wire import SpecIn

    spec = SandboxSpec(network=True, egress=EgressPolicy(hosts=("index.example",), cidrs=("198.51.100.0/24",),
                                                         ports=(443,), bandwidth_mbit=50))
    body = json.loads(json.dumps(spec.to_dict()))
    assert SpecIn(**body).to_spec("local") == spec
    body["egress"]["hosts"] = ["not a name"]
    with pytest.raises(ValueError, match="egress.hosts: not a host name"):  # the service answers 422
        SpecIn(**body).to_spec("local")
