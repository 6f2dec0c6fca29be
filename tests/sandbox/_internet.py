"""The "internet" of the network tests, run inside a network namespace the test made
(``_netlab.py``): a DNS server, HTTP servers (one holding two names on one address, as
a CDN's edge does), an HTTPS server (a test CA's certificate), a
package index and a fake cloud metadata service, each on an address of that namespace.
``python _internet.py DIR``: ``DIR`` holds the certificate, the
key and the index's files; prints "ready" once every server listens; runs until killed."""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import ssl
import sys
import threading
import time
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from rockroll.sandbox.deployment import wire  # the DNS wire helpers the gateway uses

DNS_SERVER = "198.51.100.2"
NAMES = {
    "allowed.test": "203.0.113.10", "other.test": "203.0.113.20", "pypi.test": "203.0.113.30",
    "tls.test": "203.0.113.40", "rebind.test": "127.0.0.1", "meta.test": "169.254.169.254",
    "hostaddr.test": "198.51.100.1", "private.test": "10.0.0.5", "sub.wild.test": "203.0.113.10",
    "moving.test": "203.0.113.10", "long.test": "203.0.113.10", "evil.test": "203.0.113.10",
    "api.test": "203.0.113.10", "wrongname.test": "203.0.113.40", "rogue.test": "203.0.113.50",
}
# TTLs other than 30 s; moving.test's address is DIR/moving.txt's when that file exists
# (a test moves the name while a sandbox holds its old answer)
TTLS = {"moving.test": 1, "long.test": 86400}
BODIES = {"203.0.113.20": b"other-site", "169.254.169.254": b"cloud-credentials"}


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def page(body: bytes):
    class Page(Quiet):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    return Page


class SharedAddress(Quiet):
    """203.0.113.10, as a CDN's edge: allowed.test and evil.test on one address, each
    request routed by its own target (absolute form) or ``Host``, on keep-alive
    connections (HTTP/1.1). ``POST`` answers the size of the body it read (by
    Content-Length, or chunked); ``Upgrade`` is declined (a page, the connection kept)
    except on /echo, which switches (101) and echoes what comes after, as ``CONNECT``
    does after its 200; /hang answers after a minute."""

    protocol_version = "HTTP/1.1"

    def _host(self) -> str:
        target = urlsplit(self.path)
        return (target.hostname if target.scheme else (self.headers.get("Host") or "").split(":")[0]).lower()

    def _page(self, extra: bytes = b"") -> None:
        body = (b"evil-site" if self._host() == "evil.test" else b"allowed-site") + extra
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _echo(self) -> None:
        """The rest of the connection: what comes, sent back."""
        self.end_headers()
        self.wfile.flush()
        while data := self.rfile.read1(4096):
            self.wfile.write(data)
            self.wfile.flush()
        self.close_connection = True

    def do_GET(self):
        if self.path == "/hang":  # a long poll: the answer comes late, a client's EOF unheard
            time.sleep(60)
        if self.path == "/echo" and self.headers.get("Upgrade"):
            self.send_response(101)
            self.send_header("Upgrade", self.headers["Upgrade"])
            self.send_header("Connection", "Upgrade")
            self._echo()
            return
        self._page()

    def do_CONNECT(self):  # a tunnel (to itself, as far as the test can tell): an echo
        self.send_response(200, "Connection established")
        self._echo()

    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            size = 0
            while n := int(self.rfile.readline().split(b";")[0], 16):
                size += len(self.rfile.read(n))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):  # trailers
                pass
        else:
            size = len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self._page(f":posted={size}".encode())


class SharedTLS(SharedAddress):
    """203.0.113.10:443, the same edge over HTTPS (one certificate for allowed.test,
    evil.test and api.test): each request's host and headers are written to
    ``DIR/seen.jsonl`` (what reached the far end: the test reads it on the host), and
    evil.test, as a site of the attacker's, answers each request with its headers."""

    folder: Path
    lock = threading.Lock()

    def _page(self, extra: bytes = b"") -> None:
        host = self._host()
        with self.lock, open(self.folder / "seen.jsonl", "a") as f:
            f.write(json.dumps({"host": host, "path": self.path, "headers": self.headers.items()}) + "\n")
        if host == "evil.test":
            extra += b"\n" + bytes(self.headers)
        elif host == "api.test":
            extra += b":api"
        super()._page(extra)


class Bulk(Quiet):
    """GET /<megabytes>: that many MiB of zeros (throughput benchmarks)."""

    def do_GET(self):
        mib = int(self.path.strip("/") or 1)
        self.send_response(200)
        self.send_header("Content-Length", str(mib << 20))
        self.end_headers()
        chunk = bytes(1 << 20)
        for _ in range(mib):
            self.wfile.write(chunk)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def dns(folder: Path) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((DNS_SERVER, 53))
    moved = folder / "moving.txt"

    def serve():
        while True:
            data, addr = sock.recvfrom(4096)
            q = wire.parse_query(data)
            if q is None:
                continue
            ip = NAMES.get(q.name)
            if q.name == "moving.test" and moved.exists():
                ip = moved.read_text().strip()
            if q.qtype == wire.QTYPE_A and ip:
                sock.sendto(wire.answer(q, [ip], ttl=TTLS.get(q.name, 30)), addr)
            else:
                sock.sendto(wire.answer(q, rcode=wire.NOERROR if ip else wire.NXDOMAIN), addr)
    threading.Thread(target=serve, daemon=True).start()


def main(folder: Path) -> None:
    dns(folder)
    servers = [Server((ip, 80), page(body)) for ip, body in BODIES.items()]
    servers.append(Server(("203.0.113.10", 80), SharedAddress))
    servers.append(Server(("203.0.113.30", 80), partial(Quiet, directory=str(folder / "index"))))
    servers.append(Server(("203.0.113.10", 8080), Bulk))
    tls = Server(("203.0.113.40", 443), page(b"tls-site"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(folder / "tls.pem", folder / "tls.key")
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    servers.append(tls)
    SharedTLS.folder = folder
    for ip, handler, name in (("203.0.113.10", SharedTLS, "shared"), ("203.0.113.50", page(b"rogue-site"), "rogue")):
        server = Server((ip, 443), handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(folder / f"{name}.pem", folder / f"{name}.key")
        # the handshake in the handler's thread: a client stuck in one holds no other's
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        servers.append(server)
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
