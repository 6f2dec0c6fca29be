"""The host side of the network tests: run by ``_netlab.NetLab.run_host`` inside the lab's
host namespace (never the machine's own). Makes sandboxes on the local backend, attacks
from inside them as an agent would, and prints one JSON line of what happened and what
was counted. ``python _netdriver.py LABDIR SCENARIO``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

from rockroll.sandbox import EgressPolicy, SandboxSpec, open_sandbox
from rockroll.sandbox.deployment.usernet import ADDRESS

# Runs inside the sandbox (its python3): one probe per call, one line of result.
PROBE = r'''
import json, socket, ssl, sys, urllib.request
kind, args = sys.argv[1], sys.argv[2:]
def out(x): print(json.dumps(x)); sys.exit(0)
try:
    if kind == "resolve":
        out(sorted({i[4][0] for i in socket.getaddrinfo(args[0], 80, socket.AF_INET, socket.SOCK_STREAM)}))
    if kind == "dns":  # name: ask the sandbox's name server itself; [rcode, [[address, ttl], ...]]
        import random, struct
        ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
        qid = random.randrange(65536)
        q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + b"".join(
            bytes([len(l)]) + l.encode() for l in args[0].split(".")) + b"\0" + struct.pack(">HH", 1, 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
        s.sendto(q, (ns, 53))
        d = s.recv(4096); i, recs = len(q), []  # the question comes back as sent
        for _ in range(struct.unpack(">H", d[6:8])[0]):
            i += 2  # the name: a pointer to the question's (the gateway answers so)
            t, _, ttl, n = struct.unpack(">HHIH", d[i:i + 10]); i += 10
            if t == 1: recs.append([socket.inet_ntoa(d[i:i + n]), ttl])
            i += n
        out([d[3] & 15, recs])
    if kind == "http":  # url [Host header]
        req = urllib.request.Request(args[0], headers={"Host": args[1]} if len(args) > 1 else {})
        out(urllib.request.urlopen(req, timeout=5).read().decode())
    if kind == "raw_http":  # ip port host: a request whose Host we choose, to an address we choose
        s = socket.create_connection((args[0], int(args[1])), timeout=5)
        s.sendall(f"GET / HTTP/1.0\r\nHost: {args[2]}\r\n\r\n".encode())
        data = b""  # to the end (HTTP/1.0 closes): under a bandwidth cap the body comes apart
        try:
            while chunk := s.recv(4096): data += chunk
        except OSError:
            if not data: raise
        out(data.decode(errors="replace") or "closed")
    if kind == "converse":  # host port steps shut: one connection; steps: JSON [[text, until, sleep_s], ...]
        import time
        s = socket.create_connection((args[0], int(args[1])), timeout=8)
        data = b""
        try:
            for text, until, pause in json.loads(args[2]):
                time.sleep(pause)
                s.sendall(text.encode("latin-1"))
                while until and until.encode() not in data and (chunk := s.recv(65536)):
                    data += chunk
            if args[3] == "1":
                s.shutdown(socket.SHUT_WR)  # done sending: the answers still come
            while chunk := s.recv(65536): data += chunk
        except OSError as e:
            data += f"|{type(e).__name__}".encode()
        out(data.decode("latin-1"))
    if kind == "tls":  # host (a name: resolved first) sni cafile
        ctx = ssl.create_default_context(cafile=args[2])
        if not args[1]: ctx.check_hostname = False
        s = ctx.wrap_socket(socket.create_connection((args[0], 443), timeout=5), server_hostname=args[1] or None)
        s.sendall(f"GET / HTTP/1.0\r\nHost: {args[1]}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096): data += chunk
        out(data.decode(errors="replace").split("\r\n\r\n", 1)[-1])
    if kind == "tcp":  # ip port: connect and read what comes back
        s = socket.create_connection((args[0], int(args[1])), timeout=3)
        s.sendall(b"hello\r\n\r\n")
        out(s.recv(100).decode(errors="replace") or "closed")
    if kind == "tcp6":
        s = socket.create_connection((args[0], int(args[1])), timeout=3)
        out("connected")
    if kind == "udp":  # ip port: send, wait for a reply
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
        s.sendto(b"x", (args[0], int(args[1])))
        out(s.recv(100).decode(errors="replace"))
    if kind == "ping":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); s.settimeout(2)
        s.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01pingdata", (args[0], 0))
        out(s.recv(100).hex())
    if kind == "raw":
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
        out("opened")
    if kind == "listen":  # port: serve one line forever, in the background
        import os
        if os.fork() == 0:
            os.setsid()
            srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("0.0.0.0", int(args[0]))); srv.listen()
            while True:
                c, _ = srv.accept(); c.sendall(b"from-the-sandbox"); c.close()
        out("listening")
except Exception as e:
    out("error:" + type(e).__name__ + ":" + str(getattr(e, "errno", "") or ""))
'''

CA = "/workspace/ca.pem"


def probe(sb, *args: str) -> object:
    res = sb.run("python3 /workspace/probe.py " + " ".join(shlex.quote(a) for a in args), timeout=60)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return f"probe failed: {res.stdout} {res.stderr}"


def prepare(sb, lab: Path) -> None:
    sb.write_file("/workspace/probe.py", PROBE)
    sb.write_file(CA, (lab / "ca.pem").read_bytes())


def host_connect(ip: str, port: int) -> str:
    try:
        with socket.create_connection((ip, port), timeout=2) as s:
            return s.recv(100).decode() or "closed"
    except OSError as e:
        return f"error:{type(e).__name__}"


def restricted(lab: Path) -> dict:
    """A sandbox with a host allow-list: what works, and each attack."""
    policy = EgressPolicy(hosts=("allowed.test", "tls.test", "pypi.test", "rebind.test", "meta.test",
                                 "hostaddr.test", "private.test", "*.wild.test"), ports=(80, 443))
    r: dict = {}
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=512, timeout_s=60)) as sb:
        prepare(sb, lab)
        gw = sb.aio._deploy.network.gateway.gateway_ip  # the veth's host end; without root, lo's address
        r["resolv"] = sb.read_file("/etc/resolv.conf").decode()
        r["allowed_http"] = probe(sb, "http", "http://allowed.test/")
        r["wildcard_http"] = probe(sb, "http", "http://sub.wild.test/")
        r["allowed_tls"] = probe(sb, "tls", "tls.test", "tls.test", CA)
        pip = sb.run("python3 -m pip install -q --no-cache-dir --index-url http://pypi.test/simple/ "
                     "--trusted-host pypi.test --target /workspace/site rrnetpkg && "
                     "PYTHONPATH=/workspace/site python3 -c 'import rrnetpkg; print(rrnetpkg.VALUE)'", timeout=120)
        r["pip"] = [pip.exit_code, pip.stdout.strip(), pip.stderr[-500:]]
        steps = [  # (name, probe args, the reason it must be counted under)
            ("dns_not_allowed", ("resolve", "other.test"), "dns"),
            ("direct_ip", ("tcp", "203.0.113.20", "80"), "address"),
            ("rebind_loopback", ("resolve", "rebind.test"), "rebinding"),
            ("rebind_metadata", ("resolve", "meta.test"), "rebinding"),
            ("rebind_host", ("resolve", "hostaddr.test"), "rebinding"),
            ("rebind_private", ("resolve", "private.test"), "rebinding"),
            ("host_header", ("raw_http", "allowed.test", "80", "other.test"), "http_host"),
            ("sni", ("tls", "tls.test", "other.test", CA), "sni"),
            ("no_sni", ("tls", "tls.test", "", CA), "sni"),
            ("port", ("tcp", "203.0.113.10", "8080"), "port"),
            ("metadata_ip", ("tcp", "169.254.169.254", "80"), "metadata"),
            ("host_address", ("tcp", "198.51.100.1", "8111"), "host"),
            ("gateway", ("tcp", gw, "8111"), "host"),
            ("udp", ("udp", "203.0.113.10", "9999"), "udp"),
            ("dns_bypass", ("udp", "198.51.100.2", "53"), "udp"),
            ("icmp", ("ping", "203.0.113.10"), "icmp"),
            ("ipv6", ("tcp6", "2001:db8::10", "80"), "ipv6"),
        ]
        r["attacks"] = {}
        for name, args, reason in steps:
            before = sb.network_stats()["denied"].get(reason, 0)
            result = probe(sb, *args)
            time.sleep(0.05)  # the proxy counts as it closes
            after = sb.network_stats()["denied"].get(reason, 0)
            r["attacks"][name] = {"result": result, "reason": reason, "counted": after - before}
        r["raw_socket"] = probe(sb, "raw")
        r["own_loopback"] = probe(sb, "tcp", "127.0.0.1", "8111")
        r["stats"] = sb.network_stats()
    return r


def get(host: str | None, target: str = "/", version: str = "1.1", extra: str = "") -> str:
    """An HTTP request head (``host`` None: no Host header)."""
    return f"GET {target} HTTP/{version}\r\n" + (f"Host: {host}\r\n" if host else "") + extra + "\r\n"


UPGRADE = "Connection: Upgrade\r\nUpgrade: echo\r\n"
# One connection each, to allowed.test's address, which evil.test shares (a CDN's edge in
# the lab, routing each request by its own target or Host): (name, steps, shut the write
# side at the end, the reason it must be counted under; None: it must work). A step is
# [what to send, what to read up to first (or null), seconds to wait before sending].
REQUEST_ATTACKS = [
    ("keepalive_second_host", [[get("allowed.test"), "allowed-site", 0], [get("evil.test"), None, 0]], True,
     "http_host"),
    ("pipelined", [[get("allowed.test") + get("evil.test"), None, 0]], True, "http_host"),
    ("absolute_form", [["GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", None, 0]], True, "http_target"),
    ("absolute_form_no_host", [[get("allowed.test") + get(None, "http://evil.test/", "1.0"), None, 0]], True,
     "http_host"),
    ("connect", [["CONNECT evil.test:80 HTTP/1.1\r\nHost: evil.test:80\r\n\r\n" + get("evil.test"), None, 0]], True,
     "http_host"),
    ("cl_and_te", [["POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "0\r\n\r\n" + get("evil.test"), None, 0]], True, "http_smuggling"),
    ("two_lengths", [["POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 0\r\nContent-Length: 35\r\n\r\n"
                      + get("evil.test"), None, 0]], True, "http_smuggling"),
    ("folding", [[get("allowed.test", extra="X-A: 1\r\n x\r\n") + get("evil.test"), None, 0]], True, "http_folding"),
    ("giant_header", [[get("allowed.test", extra="X-Big: " + "a" * 40000 + "\r\n") + get("evil.test"), None, 0]], True,
     "http_head_size"),
    ("slow_head", [[get("allowed.test"), "allowed-site", 0], ["GET / HTTP/1.1\r\nHost: evil.test\r\n", None, 0]], False,
     "http_slow"),
    ("upgrade_declined", [[get("allowed.test", extra=UPGRADE) + get("evil.test"), None, 0]], True, "http_host"),
    ("upgrade_not_first", [[get("allowed.test") + get("allowed.test", "/echo", extra=UPGRADE), None, 0]], True,
     "http_upgrade"),
    # after a switch the server agreed to, what the client sends is judged anew
    ("upgrade_then_http", [[get("allowed.test", "/echo", extra=UPGRADE), "\r\n\r\n", 0], [get("evil.test"), None, 0]],
     True, "http_host"),
    ("upgrade_to_http2", [[get("allowed.test", "/echo", extra="Connection: Upgrade\r\nUpgrade: h2c\r\n"),
                           "\r\n\r\n", 0], ["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None, 0]], True, "http_malformed"),
    ("connect_tunnel", [["CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n", "\r\n\r\n", 0],
                        [get("evil.test"), None, 0]], True, "http_host"),
    ("blank_line_first", [["\r\n" + get("evil.test"), None, 0]], True, "http_malformed"),
    ("other_method", [["PROPFIND / HTTP/1.1\r\nHost: allowed.test\r\n\r\n" + get("evil.test"), None, 0]], True,
     "http_host"),
    ("silent_first", [[get("evil.test"), None, 1.5]], True, "http_host"),  # past SNIFF_S, lowered to 1 s
    ("http2_preface", [["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None, 0]], True, "http_malformed"),
    ("bare_lf", [["GET / HTTP/1.1\nHost: allowed.test\n\nGET / HTTP/1.1\nHost: evil.test\n\n", None, 0]], True,
     "http_malformed"),
    ("two_allowed", [[get("allowed.test") + get("allowed.test"), None, 0]], True, None),
    ("post_length_then_get", [["POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello"
                               + get("allowed.test"), None, 0]], True, None),
    ("post_chunked_then_get", [["POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "5\r\nhello\r\n0\r\n\r\n" + get("allowed.test"), None, 0]], True, None),
    ("absolute_allowed", [["GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", None, 0]], True, None),
    ("upgrade_accepted", [[get("allowed.test", "/echo", extra=UPGRADE), "\r\n\r\n", 0],
                          ["\x81\x05hello", "hello", 0]], True, None),  # a frame of the new protocol
]
_GATEWAY_ANSWER = re.compile(r"HTTP/1\.1 (\d{3}) [^\r]*\r\n(?:[^\r]+\r\n)*\r\nrockroll sandbox gateway: (\w+)")


def requests(lab: Path) -> dict:
    """HTTP request by request: each attack of ``REQUEST_ATTACKS`` from inside a sandbox
    whose allow-list names allowed.test only; what came back and what was counted."""
    from rockroll.sandbox.deployment import gateway

    gateway.SNIFF_S, gateway.HEAD_S = 1.0, 1.0  # this process's gateway: the slow cases wait 1 s, not 3 and 10
    policy = EgressPolicy(hosts=("allowed.test",), ports=(80,))
    r: dict = {"attacks": {}}
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=256, timeout_s=120)) as sb:
        prepare(sb, lab)
        for name, steps, shut, reason in REQUEST_ATTACKS:
            before = sb.network_stats()["denied"]
            got = probe(sb, "converse", "allowed.test", "80", json.dumps(steps), "1" if shut else "0")
            time.sleep(0.05)  # the proxy counts as it closes
            after = sb.network_stats()["denied"]
            answer = _GATEWAY_ANSWER.search(got) if isinstance(got, str) else None
            r["attacks"][name] = {
                "status": int(answer.group(1)) if answer else None, "reason": answer.group(2) if answer else None,
                "counted": {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)},
                "evil": "evil-site" in str(got), "allowed": str(got).count("allowed-site"),
                "posted": re.findall(r"posted=\d+", str(got)),
                "echoed": "101 Switching" in str(got) and str(got).endswith("\x81\x05hello"), "raw": str(got)[-300:]}
        r["stats"] = sb.network_stats()
    return r


RULE_CASES = [  # (name, what the client sends, the reason it is refused: None, answered)
    ("allowed", get("allowed.test", "/ok/page"), None),
    ("allowed_exact", get("allowed.test", "/ok"), None),
    ("query_is_not_path", get("allowed.test", "/ok?next=/../admin"), None),
    ("method", "POST /ok/x HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 0\r\n\r\n", "http_method"),
    ("lower_case_method", "get /ok/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_method"),
    ("path", get("allowed.test", "/admin"), "http_path"),
    ("prefix_is_not_a_segment", get("allowed.test", "/okay"), "http_path"),
    ("dot_dot", get("allowed.test", "/ok/../admin"), "http_path"),
    ("encoded_dot_dot", get("allowed.test", "/ok/%2e%2E/admin"), "http_path"),
    ("encoded_slash", get("allowed.test", "/ok%2F..%2Fadmin"), "http_path"),
    ("tomcat_dot_dot", get("allowed.test", "/ok/..;/admin"), "http_path"),
    ("backslash", get("allowed.test", "/ok\\..\\admin"), "http_path"),
    ("overlong_dot", get("allowed.test", "/ok/%c0%ae%c0%ae/admin"), "http_path"),
    ("absolute_form", "GET http://allowed.test/admin HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_path"),
    ("keepalive_second", get("allowed.test", "/ok/1") + get("allowed.test", "/admin"), "http_path"),
    ("connect", "CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n", "http_method"),
    ("other_host_no_rule", get("api.test", "/anything"), None),  # same address, resolved first
]


def rules(lab: Path) -> dict:
    """A policy's ``rules`` (methods and path prefixes for allowed.test, a rule for tls.test
    without TLS inspection, none for api.test): each request of ``RULE_CASES`` from inside,
    what came back and what was counted, and a TLS connection to tls.test."""
    policy = EgressPolicy(hosts=("allowed.test", "api.test", "tls.test"), ports=(80, 443), rules={
        "allowed.test": {"methods": ["GET", "HEAD"], "paths": ["/ok"]}, "tls.test": {"paths": ["/"]}})
    r: dict = {"cases": {}}
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=256, timeout_s=120)) as sb:
        prepare(sb, lab)
        probe(sb, "resolve", "api.test")  # granted for the shared address too
        for name, request, _ in RULE_CASES:
            before, seq = sb.network_stats()["denied"], (sb.egress_log() or [{"seq": 0}])[-1]["seq"]
            got = probe(sb, "converse", "allowed.test", "80", json.dumps([[request, None, 0]]), "1")
            records, _ = _log_since(sb, seq)
            after = sb.network_stats()["denied"]
            answer = _GATEWAY_ANSWER.search(got) if isinstance(got, str) else None
            r["cases"][name] = {"status": int(answer.group(1)) if answer else None,
                                "reason": answer.group(2) if answer else None,
                                "counted": {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)},
                                "answered": str(got).count("HTTP/1.0 200") + str(got).count("HTTP/1.1 200"),
                                "records": [(x["decision"], x["reason"], x["method"], x["path"]) for x in records],
                                "raw": str(got)[-300:]}
        before = sb.network_stats()["denied"]
        r["tls"] = probe(sb, "tls", "tls.test", "tls.test", CA)
        r["tls_counted"] = {k: n - before.get(k, 0) for k, n in sb.network_stats()["denied"].items()
                            if n != before.get(k, 0)}
    return r


# Runs in a sandbox, in the background: connections through the gateway in each state
# it holds one in, kept open until killed.
HOLD = r'''
import socket, time
ip = socket.gethostbyname("allowed.test")
held = []
def connect(port=80, send=b"", answer=False):
    s = socket.create_connection((ip, port), timeout=10)
    held.append(s)
    s.sendall(send)
    if answer:
        s.recv(4096)
connect(send=b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", answer=True)  # kept alive, idle
connect(8080, b"GET /500 HTTP/1.0\r\nHost: allowed.test\r\n\r\n", answer=True)  # a download not read on
connect(send=b"GET / HTTP/1.1\r\nHost: allowed.test\r\n")  # a head not finished
connect(send=b"GET /echo HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: echo\r\n\r\n", answer=True)  # upgraded
connect(send=b"GET /hang HTTP/1.1\r\nHost: allowed.test\r\n\r\n")  # its answer far off
connect()  # silent: past the sniff by the time of close
print("holding", flush=True)
time.sleep(600)
'''


def close_open(lab: Path) -> dict:
    """Close a sandbox while its gateway holds connections in every state (``HOLD``):
    what is logged or printed meanwhile (asyncio reports a handler task's traceback through
    logging; Python's unraisable errors go to stderr), and the gateway loop's tasks and
    this process's sockets against a baseline taken before the sandbox was made."""
    import asyncio
    import io
    import logging

    from rockroll.sandbox.deployment import gateway

    gateway.SNIFF_S = 1.0
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(self.format(record))

    class Tee(io.TextIOBase):
        def write(self, text):
            said.append(text)
            return len(text)

    logging.getLogger().addHandler(Keep())  # what Python's last-resort handler would print: warnings and up
    real_stderr, sys.stderr = sys.stderr, Tee()

    def loop_tasks() -> int:
        async def count():
            return len(asyncio.all_tasks()) - 1  # but this one
        return asyncio.run_coroutine_threadsafe(count(), gateway.gateway_loop()).result(10)

    spec = SandboxSpec(network=True, egress=EgressPolicy(hosts=("allowed.test",), ports=(80, 8080)),
                       memory_mb=256, timeout_s=120)
    r: dict = {}
    try:
        with open_sandbox(spec):  # the gateway's loop, its thread and executor exist from here on
            pass
        r["before"] = {"tasks": loop_tasks(), "sockets": _sockets()}
        with open_sandbox(spec) as sb:
            r["hold_out"], r["open"] = [], []
            for _ in range(2):  # held open across a reset (a new guest: the old gateway closes), then a close
                sb.write_file("/workspace/hold.py", HOLD)
                sb.run("setsid python3 /workspace/hold.py > /workspace/hold.out 2>&1 &")
                for _ in range(100):
                    if "holding" in sb.run("cat /workspace/hold.out").stdout:
                        break
                    time.sleep(0.1)
                r["hold_out"].append(sb.run("cat /workspace/hold.out").stdout)
                time.sleep(1.5)  # the silent one past SNIFF_S: connected on, waiting for its first bytes
                r["open"].append(len(sb.aio._deploy.network.gateway._tasks))
                if len(r["open"]) == 1:
                    sb.reset()
        r["after"] = {"tasks": loop_tasks(), "sockets": _sockets()}  # as close returns: it waits for them
        time.sleep(1.0)  # what the loop would still report after close
    finally:
        sys.stderr = real_stderr
    r["said"] = said
    return r


def open_net(lab: Path) -> dict:
    """``network=True`` alone: the public internet, nothing private; other sandboxes,
    listeners and ``expose``."""
    r: dict = {}
    spec = SandboxSpec(network=True, memory_mb=256, timeout_s=60)
    with open_sandbox(spec) as a, open_sandbox(spec) as b:
        prepare(a, lab)
        prepare(b, lab)
        b_addr = b.aio._deploy.network.link.address
        r["direct_public_ip"] = probe(a, "raw_http", "203.0.113.20", "80", "any.example")
        r["any_name"] = probe(a, "http", "http://other.test/")
        r["metadata"] = probe(a, "tcp", "169.254.169.254", "80")
        r["private_name"] = probe(a, "resolve", "private.test")
        r["rebind"] = probe(a, "resolve", "rebind.test")
        r["listen"] = probe(b, "listen", "8000")
        r["other_sandbox"] = probe(a, "tcp", b_addr, "8000")
        r["host_before_expose"] = host_connect(b_addr, 8000)
        host, port = b.expose(8000)
        r["exposed"] = [host, host_connect(host, port)]
        r["a_stats"], r["b_stats"] = a.network_stats(), b.network_stats()
    return r


# Runs on the host and in sandboxes alike: connect latency (connect, one request, its
# answer) and download throughput to the lab's internet, one JSON line.
MEASURE = r'''
import json, socket, sys, time
ip, n, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lat = []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection((ip, 80), timeout=10)
    s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
    while s.recv(65536): pass
    s.close()
    lat.append(time.perf_counter() - t)
t = time.perf_counter()
s = socket.create_connection((ip, 8080), timeout=10)
s.sendall(f"GET /{mib} HTTP/1.0\r\nHost: allowed.test\r\n\r\n".encode())
got = 0
while data := s.recv(1 << 20): got += len(data)
dt = time.perf_counter() - t
lat.sort()
print(json.dumps({"connect_p50_ms": lat[len(lat) // 2] * 1e3, "connect_p90_ms": lat[int(len(lat) * 0.9)] * 1e3,
                  "throughput_mib_s": got / dt / (1 << 20), "bytes": got}))
'''


BULK = r'''
import json, socket, sys
way, mib = sys.argv[1], int(sys.argv[2])
ip = socket.gethostbyname("allowed.test") if len(sys.argv) > 3 else "203.0.113.10"
if way == "down":  # the lab's bulk server: that many MiB of zeros, Content-Length, then it closes
    s = socket.create_connection((ip, 8080), timeout=30)
    request = f"GET /{mib} HTTP/1.1\r\nHost: allowed.test\r\n\r\n".encode()
else:  # a POST of that many MiB of ones: the server answers with the size it read
    s = socket.create_connection((ip, 80), timeout=30)
    request = (f"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: {mib << 20}\r\n"
               "Connection: close\r\n\r\n").encode() + b"\x01" * (mib << 20)
s.sendall(request)
data = bytearray()
while chunk := s.recv(1 << 20):
    data += chunk
head, _, body = bytes(data).partition(b"\r\n\r\n")
print(json.dumps({"sent": len(request), "got": len(data), "head": len(head) + 4, "body": len(body),
                  "zeros": body.count(0), "answer": body[-40:].decode(errors="replace") if way == "up" else ""}))
'''


def bulk(lab: Path) -> dict:
    """Bulk bytes each way through the gateway, where it forwards them in the kernel
    (``splice.py``): a download and an upload on an open network (decided by the address),
    a download under an allow-list (a response body of known length, framed around), each
    with the records and counters it left."""
    r: dict = {}
    for name, egress, ways in (("open", None, ("down", "up")),
                               ("allow_list", EgressPolicy(hosts=("allowed.test",), ports=(8080,)), ("down",))):
        with open_sandbox(SandboxSpec(network=True, egress=egress, memory_mb=512, timeout_s=300)) as sb:
            sb.write_file("/workspace/bulk.py", BULK)
            seq = 0
            for way in ways:
                before = sb.network_stats()
                out = sb.run(f"python3 /workspace/bulk.py {way} 16" + (" allowed" if egress else ""), timeout=300)
                records, seq = _log_since(sb, seq)
                after = sb.network_stats()
                r[f"{name}_{way}"] = {"client": json.loads(out.stdout) if out.exit_code == 0 else out.stderr[-500:],
                                      "records": records,
                                      "stats": {k: after[k] - before[k] for k in ("bytes_in", "bytes_out", "bytes_spliced")}}
    return r


def bench(lab: Path, n: str = "200", mib: str = "200", path: str = "root") -> dict:
    """The same measurement from sandboxes (open network, and an allow-list that names the
    server) and, on the root path, from the host itself, in this one run. ``path`` names the
    rows: ``root`` (the driver runs as root: ``host``, ``root_open``, ``root_allow_list``) or
    ``unprivileged`` (run as nobody: ``unprivileged_open``, ``unprivileged_allow_list``;
    no host row, whose user is the bench's business, and the lab is not nobody's to write)."""
    import subprocess

    r: dict = {}
    if path == "root":
        script = lab / "measure.py"
        script.write_text(MEASURE)
        host = subprocess.run(["python3", str(script), "203.0.113.10", n, mib], capture_output=True, text=True, check=True)
        r["host"] = json.loads(host.stdout)
    for name, egress in ((f"{path}_open", None),
                         (f"{path}_allow_list", EgressPolicy(hosts=("allowed.test",)))):
        with open_sandbox(SandboxSpec(network=True, egress=egress, memory_mb=512, timeout_s=600)) as sb:
            sb.write_file("/workspace/measure.py", MEASURE)
            ip = "203.0.113.10"
            if egress is not None:
                ip = sb.run("python3 -c \"import socket; print(socket.gethostbyname('allowed.test'))\"").stdout.strip()
            out = sb.run(f"python3 /workspace/measure.py {ip} {n} {mib}", timeout=600)
            r[name] = json.loads(out.stdout) if out.exit_code == 0 else {"error": out.stderr[-500:]}
    return r


def etc(lab: Path) -> dict:
    """The sandbox's name resolution: its gateway's, read-only, in no snapshot."""
    from rockroll.sandbox.deployment.rootfs import NO_NETWORK_ETC

    def files(sb):
        return {name: sb.read_file(f"/etc/{name}").decode() for name in NO_NETWORK_ETC}

    r: dict = {"no_network_etc": NO_NETWORK_ETC}
    with open_sandbox(SandboxSpec(network=True, timeout_s=30)) as sb:
        r["gateway"] = sb.aio._deploy.network.link.gateway
        r["with_network"] = files(sb)
        # overwrite, delete, unmount, remount read-write: each refused by the read-only bind
        # and the dropped CAP_SYS_ADMIN (the files are read back after the attack)
        r["attacks"] = [sb.run(cmd, timeout=10).exit_code for cmd in (
            "echo 'nameserver 192.0.2.1' > /etc/resolv.conf", "rm -f /etc/hosts",
            "umount /etc/resolv.conf", "mount -o remount,rw,bind /etc/hosts")]
        r["after_attacks"] = files(sb)
        sb.run("echo kept > /etc/rockroll-net-test", timeout=10)
        snap = sb.snapshot()
        sb.restore(snap)  # a new guest: a new namespace, wired again
        r["after_restore"] = [files(sb), sb.aio._deploy.network.link.gateway,
                              sb.run("python3 -c \"import socket; print(socket.gethostbyname('allowed.test'))\"").stdout.strip()]
    with open_sandbox(SandboxSpec(timeout_s=30), snapshot=snap) as sb:
        r["restored_without_network"] = [sb.read_file("/etc/rockroll-net-test").decode(), files(sb)]
    import subprocess

    capped = EgressPolicy(cidrs=("203.0.113.0/24",), bandwidth_mbit=8)
    with open_sandbox(SandboxSpec(network=True, egress=capped, timeout_s=60)) as sb:
        prepare(sb, lab)
        link, pid = sb.aio._deploy.network.link, sb.aio._deploy.guest.init_pid
        r["capped_qdiscs"] = [
            subprocess.run(["tc", "qdisc", "show", "dev", link.host_if], capture_output=True, text=True).stdout,
            subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "tc", "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True).stdout]
        r["capped_by_cidr"] = probe(sb, "raw_http", "203.0.113.20", "80", "anything")
        r["capped_outside_cidr"] = probe(sb, "tcp", "198.51.100.2", "53")
    return r


def docker(lab: Path) -> dict:
    """The docker backend: the container keeps network 'none' and is wired to the gateway
    here (the image has bash, not python: probes use bash's /dev/tcp and /dev/udp)."""
    from rockroll.sandbox.deployment.images import ensure_docker_image

    def tcp(target: str, host: str) -> str:
        return (f"timeout 8 bash -c 'exec 3<>/dev/tcp/{target} && printf \"GET / HTTP/1.0\\r\\nHost: {host}"
                f"\\r\\n\\r\\n\" >&3 && cat <&3'")

    policy = EgressPolicy(hosts=("allowed.test",), ports=(80,))
    spec = SandboxSpec(backend="docker", image=ensure_docker_image(), network=True, egress=policy,
                       memory_mb=256, timeout_s=60)
    r: dict = {"attacks": {}}
    with open_sandbox(spec) as sb:
        r["resolv"] = sb.read_file("/etc/resolv.conf").decode()
        r["gateway"] = sb.aio._deploy.network.link.gateway
        r["allowed"] = sb.run(tcp("allowed.test/80", "allowed.test")).stdout
        # two requests in one write, the second for evil.test (allowed.test's address holds it too)
        r["pipelined"] = sb.run("timeout 8 bash -c 'exec 3<>/dev/tcp/allowed.test/80 && printf \"GET / HTTP/1.1\\r\\n"
                                "Host: allowed.test\\r\\n\\r\\nGET / HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n\" >&3 "
                                "&& cat <&3'").stdout
        for name, cmd, reason in (
                ("direct_ip", tcp("203.0.113.20/80", "other.test"), "address"),
                ("dns_not_allowed", tcp("other.test/80", "other.test"), "dns"),
                ("host_header", tcp("allowed.test/80", "other.test"), "http_host"),
                ("metadata", tcp("169.254.169.254/80", "x"), "metadata"),
                ("host_address", tcp("198.51.100.1/80", "x"), "host"),
                ("udp", "echo x > /dev/udp/203.0.113.10/9999; sleep 0.5", "udp")):
            before = sb.network_stats()["denied"].get(reason, 0)
            out = sb.run(cmd, timeout=30)
            time.sleep(0.05)
            r["attacks"][name] = {"stdout": out.stdout, "reason": reason,
                                  "counted": sb.network_stats()["denied"].get(reason, 0) - before}
        r["stats"] = sb.network_stats()
    # a host's rule and TLS inspection in a container: its trust store and variables, a plain-HTTP
    # request the rule refuses, and TLS handshakes by the host's own openssl (the image has no TLS
    # client; image and host are both Debian bookworm, so the binary and its two libraries run there)
    inspected = EgressPolicy(hosts=("allowed.test",), ports=(80, 443), inspect_tls=True,
                             upstream_ca=str(lab / "ca.pem"), rules={"allowed.test": {"paths": ["/ok"]}})
    with open_sandbox(SandboxSpec(backend="docker", image=ensure_docker_image(), network=True, egress=inspected,
                                  memory_mb=256, timeout_s=60)) as sb:
        ca = sb.aio._deploy.network.authority.cert_pem.decode().strip()
        r["inspected"] = {
            "ca_in_bundle": sb.read_file("/etc/ssl/certs/ca-certificates.crt").decode().count(ca),
            "env": sb.run("printenv SSL_CERT_FILE REQUESTS_CA_BUNDLE PIP_CERT NODE_EXTRA_CA_CERTS CURL_CA_BUNDLE").stdout,
            "ruled_out": sb.run(tcp("allowed.test/80", "allowed.test"), timeout=30).stdout}
        for path in _openssl_files():
            sb.write_file(f"/opt/tls/{Path(path).name}", Path(path).read_bytes(), mode=0o755)
        sb.write_file("/opt/tls/lab-ca.pem", (lab / "ca.pem").read_bytes())  # signed the server's, not the gateway's

        def tls(host: str, path: str, cafile: str = "/etc/ssl/certs/ca-certificates.crt") -> dict:
            out = sb.run(f"printf 'GET {path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n' | LD_LIBRARY_PATH=/opt/tls "
                         f"timeout 10 /opt/tls/openssl s_client -quiet -verify_return_error -CAfile {cafile} "
                         "-servername allowed.test -connect allowed.test:443", timeout=30)
            return {"stdout": out.stdout, "stderr": out.stderr[-600:], "exit_code": out.exit_code}

        r["tls"] = {"ok": tls("allowed.test", "/ok"), "other_path": tls("allowed.test", "/other"),
                    "fronting": tls("evil.test", "/ok"),
                    # the sandbox's CA is the only one that vouches for the gateway's certificate
                    "untrusted": tls("allowed.test", "/ok", cafile="/opt/tls/lab-ca.pem")}
        r["inspected"]["denied"] = sb.network_stats()["denied"]
    return r


def _openssl_files() -> list[str]:
    """The host's openssl binary and the libssl/libcrypto it loads."""
    import shutil
    import subprocess

    binary = shutil.which("openssl")
    libs = re.findall(r"=> (\S*lib(?:ssl|crypto)\.so\S*)", subprocess.run(["ldd", binary], capture_output=True,
                                                                         text=True, check=True).stdout)
    return [binary, *libs]


def build(lab: Path) -> dict:
    """``rockroll hub build``: setup steps reach the hosts the package lists, nothing else."""
    from rockroll.envhub.build import build as build_package

    pkg = lab / "pkg"
    pkg.mkdir()
    (pkg / "rockenv.toml").write_text("\n".join((
        'name = "netbuild"', 'version = "1.0.0"', 'network = ["pypi.test"]', "setup = [",
        '  "python3 -m pip install -q --no-cache-dir --index-url http://pypi.test/simple/ --trusted-host pypi.test '
        '--target /opt/lib rrnetpkg",',
        # a name the package does not list resolves to nothing, its address refuses
        '  "! getent hosts other.test && ! timeout 5 bash -c \'exec 3<>/dev/tcp/203.0.113.20/80 && cat <&3 | grep -q site\'",',
        "]", "")))
    result = build_package(pkg)
    from rockroll.envhub.publish import publish
    from rockroll.envhub.pull import pull
    from rockroll.envhub.store import HubStore

    hub = f"file://{lab / 'hub'}"
    publish(result.manifest, HubStore(hub))
    pull("netbuild@1.0.0", hub=hub)
    with open_sandbox(SandboxSpec(image="hub:netbuild@1.0.0", timeout_s=60)) as sb:
        out = sb.run("PYTHONPATH=/opt/lib python3 -c 'import rrnetpkg; print(rrnetpkg.VALUE)'")
        return {"imported": out.stdout.strip(), "network": sb.spec.network}


def leftovers(lab: Path) -> dict:
    """An owner killed with -9 while its sandbox had a network: the veth dies with the
    sandbox's namespace, its rules stay until the reaper sweeps them."""
    import os
    import signal
    import subprocess

    from rockroll.sandbox.deployment.reaper import reap_dead_runs

    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from rockroll.sandbox import SandboxSpec, open_sandbox\n"
        "sb = open_sandbox(SandboxSpec(network=True, timeout_s=30))\n"
        "print(sb.aio._deploy.network.link.index, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    index = int(child.stdout.readline())
    rules = lambda: subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.count(f"RR{index}-")
    r = {"rules_while_alive": rules()}
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    for _ in range(100):  # the namespace (and the veth) goes once the guest is gone
        if not os.path.exists(f"/sys/class/net/rrh{index}"):
            break
        time.sleep(0.1)
    r["rules_after_kill"] = rules()
    r["reaped"] = len(reap_dead_runs())
    r["rules_after_reap"] = rules()
    return r


def service(lab: Path) -> dict:
    """The counters in the service's /metrics, for a sandbox made through the API."""
    from fastapi.testclient import TestClient

    from rockroll.sandbox.server.app import create_app

    app = create_app(token="t")
    auth = {"Authorization": "Bearer t"}
    with TestClient(app) as client:
        made = client.post("/v1/sandboxes", headers=auth, json={
            "network": True, "memory_mb": 256, "egress": {"hosts": ["allowed.test"]}})
        made.raise_for_status()
        sid = made.json()["id"]
        run = lambda cmd: client.post(f"/v1/sandboxes/{sid}/run", headers=auth, json={"cmd": cmd, "timeout": 30}).json()
        ok = run("python3 -c \"import urllib.request; print(urllib.request.urlopen('http://allowed.test/', timeout=5).read().decode())\"")
        denied = run("python3 -c \"import socket; print(len(socket.create_connection(('203.0.113.20', 80), timeout=3).recv(1)))\"")
        listening = run("python3 -c \"import os,socket\nif os.fork()==0:\n os.setsid(); s=socket.socket(); s.bind(('0.0.0.0',8000)); s.listen()\n while True: c,_=s.accept(); c.sendall(b'served'); c.close()\"")
        exposed = client.post(f"/v1/sandboxes/{sid}/expose", headers=auth, json={"port": 8000}).json()
        exposed = [exposed["host"], host_connect(exposed["host"], exposed["port"])]
        run("mkdir -p /workspace/site && echo page-in-the-sandbox > /workspace/site/hello.txt && "
            "(setsid python3 -m http.server 8001 --directory /workspace/site >/dev/null 2>&1 &) && sleep 1")
        through = client.get(f"/v1/sandboxes/{sid}/ports/8001/hello.txt", headers=auth)
        through = [through.status_code, through.text,
                   client.get(f"/v1/sandboxes/{sid}/ports/8001/hello.txt").status_code]  # no token
        time.sleep(0.1)
        metrics = client.get("/metrics", headers=auth).text
        described = client.get(f"/v1/sandboxes/{sid}", headers=auth, params={"detail": True}).json()
        client.delete(f"/v1/sandboxes/{sid}", headers=auth)
    return {"id": sid, "ok": ok, "denied": denied, "listening": listening, "described": described["stats"],
            "through_service": through,
            "exposed": exposed,
            "metrics": [line for line in metrics.splitlines() if "network" in line and not line.startswith("#")]}


def scrape(lab: Path) -> dict:
    """A /metrics scrape of two networked sandboxes: the packet filter's drops of both, read
    with one ``*-save`` a table (every command the network module runs is counted here)."""
    from fastapi.testclient import TestClient

    from rockroll.sandbox.deployment import network
    from rockroll.sandbox.server.app import create_app

    ran: list[str] = []
    real_run = network._run

    def counted_run(argv, *args, **kwargs):
        ran.append(argv[0])
        return real_run(argv, *args, **kwargs)

    network._run = counted_run
    auth = {"Authorization": "Bearer t"}
    r: dict = {"ids": [], "udp_sent": [1, 3]}
    with TestClient(create_app(token="t")) as client:
        for n in r["udp_sent"]:
            made = client.post("/v1/sandboxes", headers=auth, json={"network": True, "memory_mb": 256})
            made.raise_for_status()
            sid = made.json()["id"]
            r["ids"].append(sid)
            cmd = f"for i in $(seq {n}); do echo x > /dev/udp/203.0.113.10/9999; done; " \
                  "timeout 1 bash -c 'echo > /dev/tcp/2001:db8::10/80'; true"
            client.post(f"/v1/sandboxes/{sid}/run", headers=auth, json={"cmd": cmd, "timeout": 30}).raise_for_status()
        r["detail"] = [client.get(f"/v1/sandboxes/{sid}", headers=auth, params={"detail": True}).json()["stats"]
                       ["network"]["denied"] for sid in r["ids"]]
        ran.clear()
        metrics = client.get("/metrics", headers=auth).text
        r["commands_in_scrape"] = list(ran)
        r["metrics"] = [line for line in metrics.splitlines() if "network_denied" in line and not line.startswith("#")]
        for sid in r["ids"]:
            client.delete(f"/v1/sandboxes/{sid}", headers=auth)
    return r


def ttl(lab: Path) -> dict:
    """DNS TTLs: an address is granted to its name for the answer's TTL, held within the
    gateway's bounds (the floor lowered to 2 s in this process, so the test waits 2 s, not
    30); once a name moved and its grant ran out, its old address is refused."""
    from rockroll.sandbox.deployment import gateway

    gateway.MIN_TTL_S = 2
    moved = lab / "moving.txt"
    moved.write_text("203.0.113.20")  # moving.test: other-site's address, TTL 1 s upstream
    policy = EgressPolicy(hosts=("moving.test", "allowed.test", "long.test"), ports=(80,))
    r: dict = {}
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=256, timeout_s=60)) as sb:
        prepare(sb, lab)
        r["ttls"] = {name: probe(sb, "dns", name) for name in ("moving.test", "allowed.test", "long.test")}
        r["before_move"] = probe(sb, "http", "http://moving.test/")  # resolves again: a new 2 s grant
        moved.write_text("203.0.113.10")
        time.sleep(gateway.MIN_TTL_S + 0.5)  # past the grant
        before = sb.network_stats()["denied"].get("address", 0)
        r["old_address"] = probe(sb, "raw_http", "203.0.113.20", "80", "moving.test")
        time.sleep(0.05)  # the proxy counts as it closes
        r["old_address_counted"] = sb.network_stats()["denied"].get("address", 0) - before
        r["after_move"] = probe(sb, "http", "http://moving.test/")
        r["old_after_move"] = probe(sb, "raw_http", "203.0.113.20", "80", "moving.test")
        r["stats"] = sb.network_stats()
    return r


def ray_net(lab: Path) -> dict:
    """``backend="ray"``: a one-node Ray cluster started here, in the lab's host namespace
    (node address 127.0.0.1 on that namespace's own loopback, so none of its ports is the
    machine's), whose host actor makes the sandbox; the policy travels in the spec, the
    counters and ``expose`` come back through Ray. Ray is shut down before this returns."""
    import os
    import shutil
    import tempfile

    import ray

    from rockroll.sandbox.deployment import ray as raycluster

    os.environ.pop("RAY_ADDRESS", None)  # a cluster of the suite's would be another namespace's
    home = lab / "rayhome"
    home.mkdir()
    # Ray asks cloud metadata what it runs on unless $HOME holds a cluster config (test_ray.py)
    (home / "ray_bootstrap_config.yaml").write_text("provider: {type: local}\n")
    os.environ.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    temp = tempfile.mkdtemp(prefix="rrn-")  # Ray's unix sockets want a short path
    raycluster.keep_loopback()
    policy = EgressPolicy(hosts=("allowed.test",), ports=(80,))
    r: dict = {"attacks": {}}
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False,
                 object_store_memory=100_000_000, _temp_dir=temp, namespace=raycluster.NAMESPACE,
                 log_to_driver=False)
        with open_sandbox(SandboxSpec(backend="ray", network=True, egress=policy, memory_mb=256,
                                      timeout_s=60)) as sb:
            r["client"] = type(sb.aio).__name__
            r["resolv"] = sb.read_file("/etc/resolv.conf").decode()
            prepare(sb, lab)
            r["allowed_http"] = probe(sb, "http", "http://allowed.test/")
            for name, args, reason in (
                    ("direct_ip", ("tcp", "203.0.113.20", "80"), "address"),
                    ("dns_not_allowed", ("resolve", "other.test"), "dns"),
                    ("metadata", ("tcp", "169.254.169.254", "80"), "metadata"),
                    ("udp", ("udp", "203.0.113.10", "9999"), "udp")):
                before = sb.network_stats()["denied"].get(reason, 0)
                result = probe(sb, *args)
                time.sleep(0.05)  # the proxy counts as it closes
                after = sb.network_stats()["denied"].get(reason, 0)
                r["attacks"][name] = {"result": result, "reason": reason, "counted": after - before}
            # the gateway on the Ray node judges each request: a second one pipelined is refused
            r["pipelined"] = probe(sb, "converse", "allowed.test", "80",
                                   json.dumps([[get("allowed.test") + get("evil.test"), None, 0]]), "1")
            r["listen"] = probe(sb, "listen", "8000")
            host, port = sb.expose(8000)
            r["exposed"] = [host, host_connect(host, port)]
            r["stats"] = sb.network_stats()
        r["stats_after_close"] = sb.aio.network_stats()
        # TLS inspection and a host's rule on the Ray node's gateway: the CA made there, in
        # the sandbox's trust store; fronting and a method the rule does not take refused
        inspected = EgressPolicy(hosts=("allowed.test",), ports=(443,), inspect_tls=True,
                                 upstream_ca=str(lab / "ca.pem"), rules={"allowed.test": {"methods": ["GET"]}})
        with open_sandbox(SandboxSpec(backend="ray", network=True, egress=inspected, memory_mb=1024,
                                      timeout_s=60)) as sb:
            fetch = ("python3 -c \"import sys, urllib.request, urllib.error\n"
                     "req = urllib.request.Request('https://allowed.test/', method=sys.argv[1], headers={'Host': sys.argv[2]})\n"
                     "try: print(urllib.request.urlopen(req, timeout=10).read().decode())\n"
                     "except urllib.error.HTTPError as e: print(e.code, e.read().decode().split(': ')[1])\" ")
            r["inspected"] = {name: sb.run(fetch + args, timeout=30).stdout.strip() for name, args in (
                ("get", "GET allowed.test"), ("fronting", "GET evil.test"), ("post", "POST allowed.test"))}
            r["inspected_denied"] = sb.network_stats()["denied"]
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    return r


def _helpers(parent: int | None = None) -> list[int]:
    """Processes of the unprivileged network's helper (``nshelper.py``) on this host (whose
    parent is ``parent``, if given)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"nshelper.py" in Path(f"/proc/{pid}/cmdline").read_bytes() and (
                    parent is None or f"\nPPid:\t{parent}\n" in Path(f"/proc/{pid}/status").read_text()):
                found.append(int(pid))
        except OSError:
            pass
    return found


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def unprivileged(lab: Path) -> dict:
    """Run as an unprivileged user (``NetLab.run_host_unprivileged``): what only that path
    has to show (the policy's attacks are ``restricted``'s). The host's own loopback, the
    open network, expose, and what is left after a close and after a kill -9."""
    import signal
    import subprocess
    import threading

    r: dict = {"euid": os.geteuid()}
    hits: list = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 8111))
    srv.listen()

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            hits.append(1)
            c.sendall(b"host-loopback")
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    r["host_loopback_from_host"] = host_connect("127.0.0.1", 8111)
    spec = SandboxSpec(network=True, memory_mb=256, timeout_s=60)
    with open_sandbox(spec):  # the gateway's loop and its sockets exist from here on
        pass
    sockets_before = _sockets()
    with open_sandbox(spec) as sb:
        prepare(sb, lab)
        r["interfaces"] = sb.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
        r["resolv"] = sb.read_file("/etc/resolv.conf").decode()
        r["helpers_while_open"] = len(_helpers(os.getpid()))
        r["host_loopback"] = probe(sb, "tcp", "127.0.0.1", "8111")
        r["host_loopback_hits"] = len(hits) - 1
        r["direct_public_ip"] = probe(sb, "raw_http", "203.0.113.20", "80", "any.example")
        r["any_name"] = probe(sb, "http", "http://other.test/")
        r["metadata"] = probe(sb, "tcp", "169.254.169.254", "80")
        r["lab_host"] = probe(sb, "tcp", "198.51.100.1", "8111")
        r["rebind"] = probe(sb, "resolve", "rebind.test")
        r["flush_rules"] = sb.run("iptables -F OUTPUT; iptables -t nat -F OUTPUT; ip link add x type dummy; "
                                  "ip route del default", timeout=10).exit_code
        r["cap_net_admin"] = int(sb.run("grep CapEff /proc/self/status").stdout.split()[1], 16) >> 12 & 1
        r["metadata_after_flush"] = probe(sb, "tcp", "169.254.169.254", "80")
        r["listen"] = probe(sb, "listen", "8000")
        r["host_before_expose"] = host_connect(ADDRESS, 8000)
        host, port = sb.expose(8000)
        r["exposed"] = [host, host_connect(host, port)]
        r["stats"] = sb.network_stats()
    capped = EgressPolicy(cidrs=("203.0.113.0/24",), bandwidth_mbit=8)
    with open_sandbox(SandboxSpec(network=True, egress=capped, timeout_s=60)) as sb:
        prepare(sb, lab)
        r["capped_by_cidr"] = probe(sb, "raw_http", "203.0.113.20", "80", "anything")
        classes = sb.aio._deploy.network.helper.run("tc -s class show dev lo")
        r["capped_classes"] = [int(m) for m in re.findall(r"rate 8Mbit.*?\n Sent (\d+) bytes", classes, re.S)]
    r["helpers_after_close"] = len(_helpers(os.getpid()))
    r["sockets_left"] = _sockets() - sockets_before
    srv.close()

    child = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from rockroll.sandbox import SandboxSpec, open_sandbox\n"
        "sb = open_sandbox(SandboxSpec(network=True, timeout_s=30))\n"
        "print(sb.aio._deploy.network.helper.proc.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, cwd="/")
    helper = int(child.stdout.readline())
    r["helper_alive"] = os.path.exists(f"/proc/{helper}")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    for _ in range(100):
        if helper not in _helpers():
            break
        time.sleep(0.1)
    r["helper_after_kill"] = helper in _helpers()
    return r


AUDIT_MARK = "/audit-marker-7f3a"


def _log_since(sb, seq: int) -> tuple[list[dict], int]:
    """The audit records after ``seq`` (DNS queries left out: the probes resolve as they go), and the last seq."""
    time.sleep(0.1)  # the proxy writes a connection's last records as it closes
    records = sb.egress_log(since=seq)
    last = records[-1]["seq"] if records else seq
    return [x for x in records if x["kind"] != "dns"], last


def audit_cases(sb) -> dict:
    """Requests and connections of each kind from inside ``sb`` (allow-list: allowed.test
    and tls.test), each with what the client got and the audit records it made."""
    r: dict = {}
    seq = 0

    def case(name: str, *args: str) -> None:
        nonlocal seq
        got = probe(sb, *args)
        records, seq = _log_since(sb, seq)
        r[name] = {"got": got, "records": records}

    two = get("allowed.test", AUDIT_MARK) + get("allowed.test", "/second?q=1")
    case("keepalive", "converse", "allowed.test", "80", json.dumps([[two, None, 0]]), "1")
    case("refused", "converse", "allowed.test", "80", json.dumps([[get("evil.test"), None, 0]]), "1")
    case("tunnel", "converse", "allowed.test", "80", json.dumps(
        [["CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n", "\r\n\r\n", 0], ["hello", "hello", 0]]), "1")
    case("tls", "tls", "tls.test", "tls.test", CA)
    case("direct_ip", "tcp", "203.0.113.20", "80")
    forged = '/a"},{"seq":1,"decision":"allowed","host":"evil.test"}\\'
    case("forged_path", "converse", "allowed.test", "80", json.dumps([[get("allowed.test", forged), None, 0]]), "1")
    case("newline_path", "converse", "allowed.test", "80", json.dumps(
        [['GET /x\n{"decision":"allowed","host":"evil.test"} HTTP/1.1\r\nHost: allowed.test\r\n\r\n', None, 0]]), "1")
    case("forged_host", "converse", "allowed.test", "80", json.dumps(
        [['GET / HTTP/1.1\r\nHost: evil.test","decision":"allowed\r\n\r\n', None, 0]]), "1")
    before = len(sb.egress_log())
    probe(sb, "resolve", "other.test")
    r["dns"] = sb.egress_log()[before:]
    r["all"] = sb.egress_log()
    r["stats"] = sb.network_stats()
    return r


def audit(lab: Path) -> dict:
    """The egress audit log on the local backend: each kind of record, what the sandbox can
    see of it, and its bound under a flood."""
    from rockroll.sandbox.deployment import egresslog

    policy = EgressPolicy(hosts=("allowed.test", "tls.test"), ports=(80, 443))
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=256, timeout_s=120)) as sb:
        prepare(sb, lab)
        r = audit_cases(sb)
        # what the sandbox sees of it: no file holding a record, no process of the host
        found = sb.run(f"grep -rlF '\"path\":\"{AUDIT_MARK}\"' /tmp /workspace /run /var /etc /dev/shm /proc/self "
                       "2>/dev/null | head; grep -l _netdriver /proc/[0-9]*/cmdline 2>/dev/null | head", timeout=60)
        r["inside_sees"] = found.stdout.strip()
        # the same look finds a record where the sandbox could read one (a control: the look can see)
        sb.write_file("/workspace/control.jsonl", json.dumps(next(x for x in sb.egress_log() if x["path"] == AUDIT_MARK), separators=(",", ":")) + "\n")
        control = sb.run(f"grep -rlF '\"path\":\"{AUDIT_MARK}\"' /tmp /workspace 2>/dev/null", timeout=60)
        r["control_sees"] = control.stdout.strip()
        r["marker_on_host"] = sum(AUDIT_MARK in json.dumps(x) for x in sb.egress_log())
    egresslog.MAX_BYTES, n = 4096, 60  # a small bound, then a flood of requests on one connection
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=256, timeout_s=120)) as sb:
        prepare(sb, lab)
        got = probe(sb, "converse", "allowed.test", "80", json.dumps([[get("allowed.test") * n, None, 0]]), "1")
        time.sleep(0.2)
        r["flood"] = {"answers": str(got).count("allowed-site"), "n": n, "records": sb.egress_log(),
                      "log": sb.network_stats()["log"]}
    return r


def audit_remote(lab: Path) -> dict:
    """The same cases through a real ``rockroll serve`` (in this namespace) and the SDK
    (``backend="remote"``), and the route's own answer."""
    from _server import Server

    from rockroll.sandbox.runtime.remote import configure

    server = Server()
    try:
        configure(server.url, server.token)
        policy = EgressPolicy(hosts=("allowed.test", "tls.test"), ports=(80, 443))
        with open_sandbox(SandboxSpec(backend="remote", network=True, egress=policy, memory_mb=256,
                                      timeout_s=120)) as sb:
            prepare(sb, lab)
            r = audit_cases(sb)
            route = server.http.get(f"/v1/sandboxes/{sb.id}/egress", params={"since": 2})
            r["route"] = [route.status_code, route.json()]
            r["bad_since"] = server.http.get(f"/v1/sandboxes/{sb.id}/egress", params={"since": -1}).status_code
            r["openapi"] = "/v1/sandboxes/{sandbox_id}/egress" in server.http.get("/openapi.json").json()["paths"]
    finally:
        server.stop()
    return r


if __name__ == "__main__":
    lab, scenario = Path(sys.argv[1]), sys.argv[2]
    print(json.dumps({"restricted": restricted, "requests": requests, "close_open": close_open,
                      "open": open_net, "etc": etc, "service": service,
                      "bench": bench, "docker": docker, "build": build,
                      "leftovers": leftovers, "ray": ray_net, "ttl": ttl, "scrape": scrape,
                      "unprivileged": unprivileged, "audit": audit, "bulk": bulk, "rules": rules,
                      "audit_remote": audit_remote}[scenario](lab, *sys.argv[3:])))

