"""A sandbox's gateway, on the host side of its veth (``network.py``): the only thing the
sandbox's packets reach. One asyncio loop per process (a thread) serves every sandbox of
the process; each sandbox has its own listeners, bound to its own gateway address.

- **Resolver** (UDP, the sandbox's ``nameserver``): a name the policy does not allow is
  answered NXDOMAIN; an allowed one is asked of the host's name servers (A only: the
  sandbox has no IPv6 egress), and every address that is not public (loopback, the host's
  own, link-local such as 169.254.169.254, private, the sandboxes' subnet) is taken out of
  the answer and counted as ``rebinding``. Each address given is *granted* to its name,
  for this sandbox only, for the answer's TTL held within [``MIN_TTL_S``, ``MAX_TTL_S``];
  the sandbox's answer carries that lifetime, and once it passes a new connection to the
  address is refused (``address``) until a lookup grants it again. A name that moved
  does not leave its old address open, and a rebinding that swaps a public address for
  a private one is refused on both counts. Connections already open are not cut.
  The floor: answers a few seconds long (CDNs, load balancers) would otherwise lapse
  between a client's lookup and its connect, and clients that cache (Java, nscd) reuse an
  answer for about that long; the ceiling: a day-long TTL should not keep an address a
  name left open for a day. The upstream question is sent by the gateway itself (the C
  library's resolver tells no TTL), to the name servers of ``/etc/resolv.conf``;
  ``/etc/hosts`` is not read (what it names on a host is local: loopback, the host's own,
  private service addresses, none of which a sandbox may reach anyway).
- **Proxy** (TCP, every connection the sandbox opens, whatever its destination, redirected
  here by the filter): the original destination (``SO_ORIGINAL_DST``) must be public or in
  the policy's CIDRs, its port allowed, and, under a host allow-list, an address this
  sandbox's resolver gave for an allowed name. Then, unless the address came from a CIDR,
  the client's bytes are read: a TLS ClientHello must carry a server name that is allowed
  *and* was resolved to this address for this sandbox (so a name cannot be fronted
  through another's address); on plain HTTP *every* request is read and judged so
  (``httpstream.py``: keep-alive, pipelining, absolute and authority targets, smuggling
  shapes), a refused one answered with its 4xx and the connection closed. Other
  protocols pass on the address alone, a server-first one too (nothing sent within
  ``SNIFF_S``): the client's first bytes are judged whenever they come. The proxy
  connects from the host, so the far end sees the host's address, as behind NAT. What
  passes inside TLS it cannot see (domain fronting: docs/security.md), unless the policy
  says ``inspect_tls``: then a ClientHello whose name passed is answered with a certificate
  of the sandbox's own CA (``tlsinspect.py``), each request inside is judged as plain HTTP's
  are and must name that server name (``http_sni``), the connection upstream verifies the
  far end's certificate for it (``tls_upstream``), and the policy's secret headers are set
  on the requests to their host (``inject.py``). TLS it cannot inspect (inside a tunnel, or
  after the server spoke first) is refused (``tls_tunnel``); a client that does not accept
  the sandbox's CA (one that pins its server's certificate) fails its handshake
  (``tls_client``).

Bytes that need no reading (a connection decided by its address or its server name, a
tunnel, the rest of a response body of known length: ``egresslog.Connection.ahead``) are
forwarded in the kernel, socket to socket through a pipe (``splice.py``), each counted as it
arrives. The client's side of an HTTP connection is always read: its requests are judged.

``close`` ends every connection still open (each handler returns, its sockets closed)
before it returns: nothing is left of a sandbox's gateway, nothing printed.

Why a proxy and not forwarding + NAT: the decision needs the name a connection is for,
which only the resolver's memory and the first bytes tell; a packet filter sees neither.
A proxy also means no packet of a sandbox is ever routed by the host: a mistake in the
rules can lose a sandbox its network, not open the host's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import math
import re
import secrets
import socket
import ssl
import struct
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from ..egress import EgressPolicy, address_class
from ..errors import SandboxError, SpecError
from . import egresslog, httpstream, inject, network, splice, tlsinspect, wire
from .network import DNS_PORT, EXPOSE_MARK, PROXY_PORT, SUBNET

if TYPE_CHECKING:
    from ..spec import SandboxSpec

SO_ORIGINAL_DST = 80
SNIFF_S = 3.0  # how long the proxy waits for a client's first bytes
SNIFF_MAX = 16384  # and how many it reads at most before judging them
CONNECT_S = 10.0
HEAD_S = 10.0  # how long a request head may take once its first byte came (httpstream.py)
CLOSE_S = 5.0  # how long close() waits for the connections it ends
REFUSED_GRACE_S = 2.0  # how long the answers to requests before a refused one may take to end
# How long an address a lookup gave stays granted: the upstream TTL within these bounds
# (the module doc says why). A process may lower the floor before its sandboxes start.
MIN_TTL_S, MAX_TTL_S = 30, 3600
READ = 65536  # bytes read at once where the proxy reads; a full read of a decided stream: bulk, spliced
UPSTREAM_TIMEOUT_S, UPSTREAM_ATTEMPTS = 2.0, 2
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def gateway_loop() -> asyncio.AbstractEventLoop:
    """The process's gateway loop, on a daemon thread, started on first use."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rockroll-gateway", daemon=True).start()
            _loop = loop
        return _loop


def _call(coro):
    return asyncio.run_coroutine_threadsafe(coro, gateway_loop()).result(timeout=30)


class Traffic:
    """One sandbox's counters, over all its guests (a restore wires a new namespace)."""

    def __init__(self) -> None:
        self.bytes_in = 0  # to the sandbox
        self.bytes_out = 0  # from the sandbox
        self.bytes_spliced = 0  # of both, those forwarded in the kernel (splice.py)
        self.connections = 0  # allowed TCP connections
        self.dns_queries = 0
        self.denied: collections.Counter[str] = collections.Counter()
        self.log = egresslog.EgressLog()  # a record per request and connection (egresslog.py)

    def snapshot(self, kernel: dict[str, int] | None = None) -> dict:
        denied = collections.Counter(self.denied)
        denied.update({k: v for k, v in (kernel or {}).items() if v})
        return {"bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "bytes_spliced": self.bytes_spliced,
                "connections": self.connections,
                "dns_queries": self.dns_queries, "denied": dict(denied), "log": self.log.stats()}


def host_address(ip: str) -> bool:
    """Whether ``ip`` is an address of this network namespace (binding to it works)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
            return True
        except OSError:
            return False


class Gateway:
    """The resolver and proxy of one sandbox's current guest (``start``/``close``), and its
    ``expose``d ports."""

    def __init__(self, gateway_ip: str, address: str, policy: EgressPolicy | None, traffic: Traffic,
                 resolve: Callable[[str], tuple[list[str], int]] | None = None,
                 new_socket: Callable[[], socket.socket] | None = None,
                 authority: tlsinspect.Authority | None = None, injector: inject.Injector | None = None):
        self.gateway_ip, self.address, self.policy, self.traffic = gateway_ip, address, policy, traffic
        # inspect_tls: the sandbox's CA, and the secret headers read for this guest
        self.authority, self.injector = authority, injector
        self.resolve = resolve or resolve_upstream
        # a TCP socket that reaches the sandbox's listeners (``expose``): one of this
        # namespace, marked, or one made in the sandbox's (``usernet.py``)
        self.new_socket = new_socket or _marked_socket
        # address -> {name it was given for: when that grant ends (time.monotonic())}
        self.grants: dict[str, dict[str, float]] = {}
        self._servers: list = []
        self._tasks: set[asyncio.Task] = set()

    # -- life -------------------------------------------------------------------------
    def start(self, listeners: tuple[socket.socket, socket.socket] | None = None) -> None:
        """Listen on the gateway's address, or on ``listeners`` (TCP bound and listening,
        UDP bound: the proxy's and the resolver's, made elsewhere), which it then owns."""
        _call(self._start(listeners))

    async def _start(self, listeners) -> None:
        if listeners is None:
            server = await asyncio.start_server(self._tracked(self._proxy_one), self.gateway_ip, PROXY_PORT,
                                                reuse_address=True)
            udp = {"local_addr": (self.gateway_ip, DNS_PORT)}
        else:
            server = await asyncio.start_server(self._tracked(self._proxy_one), sock=listeners[0])
            udp = {"sock": listeners[1]}
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: _Resolver(self), **udp)
        self._servers += [server, transport]

    def close(self) -> None:
        try:
            _call(self._close())
        except (RuntimeError, TimeoutError):
            pass

    async def _close(self) -> None:
        for s in self._servers:
            s.close()
        self._servers = []
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:  # each closes its sockets as it ends: none is left open once close returns
            await asyncio.wait(tasks, timeout=CLOSE_S)

    def expose(self, port: int) -> int:
        """Listen on 127.0.0.1 (a free port, returned) and carry each connection to the
        sandbox's ``port``; only these connections may open one to the sandbox."""
        return _call(self._expose(port))

    async def _expose(self, port: int) -> int:
        async def carry(reader, writer):
            try:
                sock = await asyncio.get_running_loop().run_in_executor(None, self.new_socket)
            except OSError:
                writer.close()
                return
            sock.setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (self.address, port)), CONNECT_S)
                up_r, up_w = await asyncio.open_connection(sock=sock)
            except (OSError, asyncio.TimeoutError):
                sock.close()
                return
            sandbox = _Upstream(up_r, up_w, writer, self.traffic, inbound=True)
            try:
                await sandbox.pipe_from(reader)
            finally:
                await sandbox.close()

        server = await asyncio.start_server(self._tracked(carry), "127.0.0.1", 0)
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    def _tracked(self, handler):
        """``handler`` as a server's connection callback that ``close`` can end."""
        async def run(reader, writer):
            task = asyncio.current_task()
            self._tasks.add(task)
            try:
                await handler(reader, writer)
            except (OSError, asyncio.IncompleteReadError):
                pass
            except asyncio.CancelledError:
                # ``close`` cancels what is still open. asyncio's server then calls
                # ``task.exception()``, which raises (and prints a traceback) for a task
                # that ended cancelled: this one ends as a normal return instead.
                pass
            finally:
                self._tasks.discard(task)
                writer.close()
        return run

    # -- policy -----------------------------------------------------------------------
    def refuse_address(self, ip: str) -> str | None:
        """Why the sandbox may not reach ``ip`` at all, or None."""
        addr = ipaddress.ip_address(ip)
        reason = address_class(ip)
        if reason == "loopback" or reason == "multicast":
            return reason
        if host_address(ip) or ip == self.gateway_ip:
            return "host"
        if addr.version == 4 and addr in SUBNET:
            return "sandbox"
        if self.policy is not None and self.policy.cidr_allows(ip):
            return None
        return reason

    async def _proxy_one(self, reader, writer) -> None:
        sock = writer.get_extra_info("socket")
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, ip = struct.unpack(">H", raw[2:4])[0], socket.inet_ntoa(raw[4:8])
        reason = self.refuse_address(ip)
        policy = self.policy
        if reason is None and policy is not None and not policy.allows_port(port):
            reason = "port"
        by_cidr = policy is not None and policy.cidr_allows(ip)
        if reason is None and policy is not None and not by_cidr and not self.granted(ip):
            reason = "address"  # not an address this sandbox's resolver gave for an allowed name, or no longer
        if reason is not None:
            self.traffic.denied[reason] += 1
            self.traffic.log.add(time=time.time(), kind="tcp", ip=ip, port=port, decision="refused", reason=reason)
            return
        conn = egresslog.Connection(self.traffic.log, time.time, ip, port)  # its records, written as it goes
        try:
            if policy is None or by_cidr:  # an address alone decides
                if (upstream := await self._connect(ip, port, writer, conn)) is not None:
                    try:
                        await upstream.pipe_from(reader)
                    finally:
                        await upstream.close()
                return
            first = await _sniff(reader)
            upstream = None
            if not first:
                # Nothing within SNIFF_S: a protocol whose server speaks first (SMTP, MySQL).
                # The client's first bytes, whenever they come, are still judged: a client
                # that waits before sending an HTTP request or a ClientHello gains nothing.
                if (upstream := await self._connect(ip, port, writer, conn)) is None:
                    return
            await self._judged(ip, port, first, reader, writer, upstream, conn)
        finally:
            conn.close()

    async def _judged(self, ip: str, port: int, first: bytes, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, upstream: "_Upstream | None",
                      conn: egresslog.Connection) -> None:
        """The client's stream from ``first`` on (more is read while it is a head or a
        ClientHello cut short, or empty), judged by what it is: HTTP request by request, a
        ClientHello by its server name, anything else passed on the address alone. A
        connection's start, and the stream after a protocol switch the server agreed to
        (a tunnel's or an upgrade's contents are judged so in turn). Closes ``upstream``
        (the one given, or one it makes). ``conn`` takes the records."""
        try:
            first = await _sniff(reader, first or await reader.read(SNIFF_MAX))
            name = wire.tls_server_name(first) if wire.is_tls(first) else None
            if wire.is_http(first):
                conn.as_http()
                await self._http(ip, port, first, reader, writer, upstream, conn)
            elif wire.is_tls(first) and not self._name_granted(ip, name):
                self.traffic.denied["sni"] += 1
                conn.refuse("sni", kind="tls", host=name)
            elif wire.is_tls(first) and self.authority is None and self.policy.rule_for(name) is not None:
                self.traffic.denied["tls_rules"] += 1  # its requests would go unseen: the rule could not hold
                conn.refuse("tls_rules", kind="tls", host=name)
            elif wire.is_tls(first) and self.authority is not None:
                if upstream is not None and upstream.heard:  # inside a tunnel, or a server spoke first
                    self.traffic.denied["tls_tunnel"] += 1
                    conn.refuse("tls_tunnel", kind="tls", host=name)
                    return
                if upstream is not None:  # a client silent past the sniff: its upstream is made anew, in TLS
                    await upstream.close()
                    upstream = None
                await self._inspected(ip, port, name, first, reader, writer, conn)
            elif first and (upstream is not None or (upstream := await self._connect(ip, port, writer, conn))):
                conn.named("tls" if wire.is_tls(first) else "tcp", name)
                upstream.send(first)
                await upstream.pipe_from(reader)
        finally:
            if upstream is not None:
                await upstream.close()

    async def _inspected(self, ip: str, port: int, name: str, first: bytes, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, conn: egresslog.Connection) -> None:
        """A TLS connection for the allowed ``name``, terminated here with the sandbox's CA
        (``first``: its ClientHello) and read request by request as plain HTTP is, every
        request for ``name``, each carrying the policy's secret headers for it; upstream,
        once a first request passed, TLS verified for ``name``."""
        client = tlsinspect.TLSStream(self.authority.server_context(name), reader, writer, server_side=True,
                                      first=first)
        try:
            await asyncio.wait_for(client.handshake(), HEAD_S)
        except (OSError, asyncio.TimeoutError):  # ssl.SSLError too: it does not trust the CA, or pins a certificate
            self.traffic.denied["tls_client"] += 1
            conn.refuse("tls_client", kind="tls", host=name)
            return
        conn.as_http("https")
        try:
            await self._http(ip, port, b"", client, client, None, conn, sni=name,
                             connect=lambda: self._connect_tls(ip, port, name, client, conn))
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                client.write_eof()
                await client.drain()

    async def _connect_tls(self, ip: str, port: int, name: str, client: tlsinspect.TLSStream,
                           conn: egresslog.Connection) -> "_Upstream | None":
        """``_connect`` for an inspected connection: TLS to ``name``, its certificate verified
        (chain and name); ``Refused`` (``tls_upstream``, a 502 to the client) if it is not."""
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(ip, port), CONNECT_S)
        except (OSError, asyncio.TimeoutError):
            self.traffic.denied["unreachable"] += 1
            return None
        tls = tlsinspect.TLSStream(self.authority.upstream_context(), up_r, up_w, server_side=False,
                                   server_hostname=name)
        try:
            await asyncio.wait_for(tls.handshake(), CONNECT_S)
        except ssl.SSLCertVerificationError as e:
            tls.close()
            raise httpstream.Refused("tls_upstream", f"{name}: {e.verify_message}") from None
        except (OSError, asyncio.TimeoutError) as e:
            tls.close()
            raise httpstream.Refused("tls_upstream", f"{name}: the TLS handshake failed ({type(e).__name__})") from None
        self.traffic.connections += 1
        return _Upstream(tls, tls, client, self.traffic, meter=conn)

    async def _connect(self, ip: str, port: int, client: asyncio.StreamWriter,
                       conn: egresslog.Connection) -> "_Upstream | None":
        """A connection to the destination, counted (its bytes metered into ``conn``'s
        records), whose bytes are copied to ``client`` from now on (None: unreachable,
        counted so; for a connection's record here, for a request's by the caller)."""
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(ip, port), CONNECT_S)
        except (OSError, asyncio.TimeoutError):
            self.traffic.denied["unreachable"] += 1
            if conn.kind != "http":
                conn.refuse("unreachable", kind=conn.kind)
            return None
        self.traffic.connections += 1
        return _Upstream(up_r, up_w, client, self.traffic, meter=conn)

    async def _http(self, ip: str, port: int, first: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, upstream: "_Upstream | None", conn: egresslog.Connection,
                    sni: str | None = None, connect: Callable[[], Awaitable["_Upstream | None"]] | None = None) -> None:
        """A plain-HTTP stream, request by request (``httpstream``): each head judged before
        a byte of it goes on; a refused one is answered with its status and reason, counted,
        and the connection ends. The upstream connection is made once a first head is
        allowed (closed here, as is ``upstream``, whatever ends this). After a ``CONNECT``
        or ``Upgrade`` the server agreed to, the rest is judged anew (``_judged``): a
        tunnel carries requests too, and an upgrade to HTTP/2 starts with its preface,
        which is refused. Each request is a record of ``conn``, a refused one too.
        Inside inspected TLS (``sni``: its server name; ``connect``: how its upstream is
        made) each request must be for ``sni``, and gets the policy's secret headers; the
        contents of a tunnel or an upgrade never do (judged by ``_judged``, which passes
        neither)."""
        stream, head, judged = httpstream.RequestReader(), None, None
        try:
            events = collections.deque(await _next_events(reader, stream, first))
            while events:
                event = events.popleft()
                if isinstance(event, httpstream.Head):
                    judged = event
                    if not self._name_granted(ip, event.host):
                        raise httpstream.Refused("http_host", f"{event.host} is not allowed here")
                    if sni is not None and event.host != sni:  # the upstream proved it is sni, nothing else
                        raise httpstream.Refused("http_sni", f"{event.host} is not {sni}")
                    if self.policy is not None and (rule := self.policy.rule_for(event.host)) is not None and (
                            why := rule.refusal(event.method, httpstream.path_of(event))):
                        raise httpstream.Refused(why, f"{event.method} {event.target[:200]} to {event.host}")
                    if upstream is None and (upstream := await (
                            connect() if connect else self._connect(ip, port, writer, conn))) is None:
                        conn.refuse("unreachable", method=event.method, host=event.host, path=event.target)
                        return
                    judged = None
                    raw, injected = (self.injector.apply(event) if sni is not None and self.injector
                                     else (event.raw, ()))
                    conn.request(event.method, event.host, event.target, injected)
                    upstream.send(raw)
                    head = event
                elif event is httpstream.SWITCH:  # the first request's: its answer tells
                    agreed = httpstream.switched(head, await upstream.first_bytes())
                    events.extend(stream.decide(agreed))
                    if agreed:  # another protocol now, to the server already decided on
                        conn.switched()
                        await self._judged(ip, port, b"".join(events), reader, writer, upstream, conn)
                        return
                else:
                    upstream.send(event)
                if not events:
                    if stream.between_requests():
                        conn.request_done()
                    await upstream.drain()
                    events.extend(await _next_events(reader, stream, b""))
            conn.request_done()
            if upstream is not None:  # the client is done sending: the answer still comes
                upstream.end()
                await upstream.finished()
        except httpstream.Refused as e:
            self.traffic.denied[e.reason] += 1
            conn.refuse(e.reason, status=e.status, method=judged.method if judged else None,
                        host=judged.host if judged else None, path=judged.target if judged else None)
            if upstream is not None:  # nothing more of the client goes on; what it was sent is answered
                await upstream.settle(REFUSED_GRACE_S)
            with contextlib.suppress(RuntimeError):  # the client's write side is closed already
                writer.write(e.response())
                await writer.drain()
        finally:
            if upstream is not None:
                await upstream.close()

    def _name_granted(self, ip: str, name: str | None) -> bool:
        """Whether ``name`` is allowed and was resolved to ``ip`` for this sandbox."""
        return bool(name) and self.policy.allows_name(name) and self.granted(ip, name)

    def granted(self, ip: str, name: str | None = None) -> bool:
        """Whether a lookup of this sandbox gave ``ip`` (for ``name``, if given) and its
        grant still holds."""
        now = time.monotonic()
        names = self.grants.get(ip, {})
        return any(until > now for n, until in names.items() if name is None or n == name)

    def grant(self, name: str, addresses: list[str], seconds: float) -> None:
        """Grant ``addresses`` to ``name`` for ``seconds`` (a grant never shrinks); grants
        that ended are dropped, so the table holds only what a sandbox may still use."""
        now = time.monotonic()
        for ip in addresses:
            names = self.grants.setdefault(ip, {})
            names[name] = max(names.get(name, 0.0), now + seconds)
        for ip in list(self.grants):
            live = {n: until for n, until in self.grants[ip].items() if until > now}
            if live:
                self.grants[ip] = live
            else:
                del self.grants[ip]

    def answer(self, query: bytes, reply: Callable[[bytes], None]) -> None:
        q = wire.parse_query(query)
        log = self.traffic.log
        if q is None:
            self.traffic.denied["dns"] += 1
            log.add(time=time.time(), kind="dns", decision="refused", reason="dns")
            return
        self.traffic.dns_queries += 1
        qtype = {wire.QTYPE_A: "A", 28: "AAAA"}.get(q.qtype, str(q.qtype))  # a record's "method"
        if self.policy is not None and not self.policy.allows_name(q.name):
            self.traffic.denied["dns"] += 1
            log.add(time=time.time(), kind="dns", method=qtype, host=q.name, decision="refused", reason="dns")
            reply(wire.answer(q, rcode=wire.NXDOMAIN))
            return
        if q.qtype != wire.QTYPE_A:
            log.add(time=time.time(), kind="dns", method=qtype, host=q.name, decision="allowed")
            reply(wire.answer(q))  # NODATA: no IPv6 egress, nothing but addresses
            return
        asked = time.time()

        async def lookup():
            try:
                found, ttl = await asyncio.get_running_loop().run_in_executor(None, self.resolve, q.name)
            except OSError:
                reply(wire.answer(q, rcode=wire.NXDOMAIN))
                return
            good = [a for a in found if self.refuse_address(a) is None]
            if len(good) < len(found):
                self.traffic.denied["rebinding"] += 1
            log.add(time=asked, kind="dns", method=qtype, host=q.name, ip=",".join(good) or None,
                    decision="refused" if found and not good else "allowed",
                    reason="rebinding" if found and not good else None)
            seconds = min(max(ttl, MIN_TTL_S), MAX_TTL_S)
            self.grant(q.name, good, seconds)
            reply(wire.answer(q, good, rcode=wire.NOERROR if good else wire.NXDOMAIN, ttl=int(seconds)))

        task = asyncio.ensure_future(lookup())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Resolver(asyncio.DatagramProtocol):
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.gateway.answer(data, lambda out: self.transport.sendto(out, addr))


_NAMESERVER = re.compile(r"^\s*nameserver\s+(\S+)", re.M)


def nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The name servers the host's resolver asks, in its order."""
    try:
        text = resolv_conf.read_text()
    except OSError:
        return []
    return _NAMESERVER.findall(text)[:3]  # as many as the C library uses


def resolve_upstream(name: str) -> tuple[list[str], int]:
    """``name``'s IPv4 addresses and their TTL in seconds, asked of the host's name servers
    (blocking: seconds at most). ``OSError`` when the name does not exist or no server
    answers. With no name server configured, the C library's answer and ``MIN_TTL_S``."""
    servers = nameservers()
    if not servers:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        return sorted({info[4][0] for info in infos}), MIN_TTL_S
    failures = []
    for _ in range(UPSTREAM_ATTEMPTS):
        for server in servers:
            qid = secrets.randbits(16)
            try:
                data = _ask(server, wire.encode_query(qid, name), qid)
                rcode, records = wire.answer_records(data)
            except (OSError, ValueError) as e:
                failures.append(f"{server}: {e}")
                continue
            if rcode == wire.NXDOMAIN:
                raise OSError(f"{name}: no such name")
            if rcode != wire.NOERROR:
                failures.append(f"{server}: rcode {rcode}")
                continue
            # a truncated answer still holds true addresses: the gateway needs no more than some
            return sorted({a for a, _ in records}), min((t for _, t in records), default=MIN_TTL_S)
    raise OSError(f"{name}: no name server answered ({'; '.join(failures[-3:])})")


def _ask(server: str, query: bytes, qid: int) -> bytes:
    """One UDP exchange with ``server``: its response to ``qid`` (a connected socket takes
    datagrams from that server only; others' ids are skipped until the timeout)."""
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    deadline = time.monotonic() + UPSTREAM_TIMEOUT_S
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((server, 53))
        sock.send(query)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            data = sock.recv(4096)
            if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid and data[2] & 0x80:
                return data
    raise TimeoutError("no answer")


async def _sniff(reader: asyncio.StreamReader, data: bytes = b"") -> bytes:
    """The client's first bytes (``data``, what came already, and more): to the end of an
    HTTP request head or of the TLS record of a ClientHello, which may come in several
    segments (bash writes a request line by line; a ClientHello with post-quantum key
    shares outgrows one segment), within ``SNIFF_S`` and ``SNIFF_MAX``. What came by then is
    judged as it is (a ClientHello cut short names no host; a head, ``HEAD_S`` bounds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SNIFF_S
    while (not data or wire.incomplete_head(data)) and len(data) < SNIFF_MAX and (left := deadline - loop.time()) > 0:
        try:
            chunk = await asyncio.wait_for(reader.read(SNIFF_MAX - len(data)), left)
        except asyncio.TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


async def _next_events(reader: asyncio.StreamReader, stream: httpstream.RequestReader, data: bytes) -> list:
    """The next events of a client's HTTP stream, ``data`` first, read as they come; []
    once the client is done sending. A head begun must be whole within ``HEAD_S``
    (``Refused``: ``http_slow``): a client trickling one in holds nothing of the gateway's
    for long. Between requests a kept-alive connection may idle (its server's limit)."""
    loop = asyncio.get_running_loop()
    deadline = None
    while not (events := stream.feed(data)):
        if stream.in_head():
            deadline = deadline or loop.time() + HEAD_S
            try:
                data = await asyncio.wait_for(reader.read(65536), max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise httpstream.Refused("http_slow") from None
        else:
            deadline = None
            data = await reader.read(65536)
        if not data:
            return []
    return events


def _marked_socket() -> socket.socket:
    """A TCP socket whose packets the sandbox's filter lets in (``network.EXPOSE_MARK``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, EXPOSE_MARK)
    return sock


class _Upstream:
    """A connection the gateway opened for a client's: the client's bytes go on through
    ``send`` / ``pipe_from``, the far end's come back to the client from the start (the
    first of them kept: the answer to a CONNECT or an Upgrade), every byte counted
    (``inbound``: the client is the host's, an ``expose``d port's, and the far end the
    sandbox)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client: asyncio.StreamWriter, traffic: Traffic, inbound: bool = False,
                 meter: egresslog.Connection | None = None):
        self.reader, self.writer, self.client, self.traffic, self.inbound = reader, writer, client, traffic, inbound
        self.meter = meter  # the records its forwarded bytes are counted into (egresslog.py)
        self._first: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.heard = 0  # bytes the far end sent so far
        self._eof_to_client = True
        self._back = asyncio.ensure_future(self._copy_back())

    def _count(self, n: int, to_client: bool) -> None:
        if to_client != self.inbound:
            self.traffic.bytes_in += n
        else:
            self.traffic.bytes_out += n

    async def _copy_back(self) -> None:
        first, bulk = b"", False
        try:
            while True:
                # what the far end sends next, when nothing need read it (a body of known
                # length, a decided stream once a full read shows bulk: a short answer
                # costs less copied), goes to the client in the kernel (splice.py)
                ahead = self._ahead() if self._first.done() else 0
                if ahead >= splice.MIN and (ahead < math.inf or bulk) and splice.plain(self.reader, self.writer,
                                                                                       self.client):
                    held, ended = await splice.take_over(self.reader, self.writer.transport)
                    if held:
                        self._back_to_client(held)
                        await self.client.drain()
                    if not ended and (ahead := self._ahead()):
                        await splice.flushed(self.client)
                        ended = await splice.forward(self._socket(self.writer), self._socket(self.client), ahead,
                                                     self._moved_back)
                    if ended:
                        break
                    self.writer.transport.resume_reading()
                    continue
                if not (data := await self.reader.read(READ)):
                    break
                bulk = len(data) == READ
                if not self._first.done():
                    first += data
                    if len(first) >= 12 or b"\n" in first:  # a status line's start
                        self._first.set_result(first)
                self._back_to_client(data)
                await self.client.drain()
            if self._eof_to_client and self.client.can_write_eof():
                self.client.write_eof()
        except (OSError, RuntimeError):
            pass
        finally:
            if not self._first.done():
                self._first.set_result(first)

    def _ahead(self) -> float:
        """How many of the far end's next bytes need not be read (``egresslog``)."""
        return math.inf if self.meter is None else self.meter.ahead()

    @staticmethod
    def _socket(writer: asyncio.StreamWriter) -> socket.socket:
        return writer.get_extra_info("socket")

    def _back_to_client(self, data: bytes) -> None:
        self.heard += len(data)
        self.client.write(data)
        self._count(len(data), to_client=True)
        if self.meter is not None:
            self.meter.received(data)

    def _moved_back(self, n: int) -> None:
        self.heard += n
        self.traffic.bytes_spliced += n
        self._count(n, to_client=True)
        if self.meter is not None:
            self.meter.received_unseen(n)

    def send(self, data: bytes) -> None:
        self.writer.write(data)
        self._sent(len(data))

    def _sent(self, n: int) -> None:
        self._count(n, to_client=False)
        if self.meter is not None:
            self.meter.sent(n)

    def _moved_on(self, n: int) -> None:
        self.traffic.bytes_spliced += n
        self._sent(n)

    async def drain(self) -> None:
        await self.writer.drain()

    async def first_bytes(self) -> bytes:
        """The far end's first bytes (at least a status line's start, or all it sent)."""
        return await self._first

    def end(self) -> None:
        """The client is done sending: so is this end (a half close), the answer goes on."""
        if self.writer.can_write_eof() and not self.writer.is_closing():
            self.writer.write_eof()

    async def finished(self) -> None:
        """Until the far end is done answering."""
        await asyncio.shield(self._back)

    async def pipe_from(self, reader: asyncio.StreamReader) -> None:
        """Copy the client's bytes on until it is done sending, then until the far end is
        done answering. Nothing of them is read any more: between plain sockets, once a
        full read shows bulk, the rest goes on in the kernel (``splice.py``)."""
        try:
            while data := await reader.read(READ):
                self.send(data)
                await self.writer.drain()
                if len(data) == READ and splice.plain(reader, self.client, self.writer):  # bulk: the rest spliced
                    held, ended = await splice.take_over(reader, self.client.transport)
                    if held:
                        self.send(held)
                    if not ended:
                        await splice.flushed(self.writer)
                        await splice.forward(self._socket(self.client), self._socket(self.writer), math.inf,
                                             self._moved_on)
                    break
            self.end()
        except (OSError, RuntimeError):
            pass
        await self.finished()

    async def settle(self, grace_s: float) -> None:
        """End this connection but keep the client's: nothing more is sent, the far end may
        finish answering what it was sent (until it closes, within ``grace_s``)."""
        self._eof_to_client = False
        self.end()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.finished(), grace_s)
        await self.close()

    async def close(self) -> None:
        self.writer.close()
        if not self._back.done():
            self._back.cancel()
        await asyncio.wait([self._back])


class SandboxNetwork:
    """A sandbox's network across its guests, as a deployment holds it: ``prepare`` takes a
    veth pair before a guest starts (its gateway address goes into the sandbox's
    ``resolv.conf``), ``attach(pid)`` wires the namespace of ``pid`` and starts the
    gateway, ``detach`` undoes both (a restore wires the next guest anew); the counters
    and the exposed ports' owner live as long as the sandbox. As root; without root,
    ``usernet.UserNetwork`` wires the same gateway another way."""

    def __init__(self, policy: EgressPolicy | None):
        self.policy = policy
        self.traffic = Traffic()
        self.link: network.Link | None = None
        self.gateway: Gateway | None = None
        self._kernel_drops: collections.Counter[str] = collections.Counter()  # of earlier guests
        # inspect_tls: the sandbox's CA, made with its first guest and kept across the
        # others (the trust store a snapshot's files were made with stays true)
        self.authority: tlsinspect.Authority | None = None
        self._injector: inject.Injector | None = None

    def prepare(self) -> str:
        """A veth pair for the next guest; returns its gateway address (the name server)."""
        self.detach()
        self._prepare_inspection()
        self.link = network.allocate()
        return self.link.gateway

    def _prepare_inspection(self) -> None:
        """Before a guest starts: the CA (once), and the policy's secrets read anew (a
        ``SpecError`` naming the header if one cannot be: the start fails, no guest made)."""
        if self.policy is None or not self.policy.inspect_tls:
            return
        if self.authority is None:
            self.authority = tlsinspect.Authority(self.policy.hosts, self.policy.upstream_ca)
            self.authority.upstream_context()  # a bad upstream_ca fails the start, not each connection
        self._injector = inject.Injector(self.policy) if self.policy.inject else None

    def trust_bundle(self) -> bytes | None:
        """What the guest's ``tlsinspect.BUNDLE_PATH`` holds (the host's roots and the
        sandbox's CA), or None without inspection (the image's own file stays)."""
        return tlsinspect.trust_bundle(self.authority.cert_pem) if self.authority is not None else None

    def guest_env(self) -> dict[str, str]:
        """Variables every process of the guest gets: ``tlsinspect.TRUST_ENV`` with inspection."""
        return dict(tlsinspect.TRUST_ENV) if self.authority is not None else {}

    def _new_gateway(self, gateway_ip: str, address: str, **kw) -> Gateway:
        """This sandbox's gateway for a new guest: its policy, counters, CA and secrets."""
        return Gateway(gateway_ip, address, self.policy, self.traffic, authority=self.authority,
                       injector=self._injector, **kw)

    def attach(self, pid: int) -> None:
        network.plumb(self.link, pid, self.policy.bandwidth_mbit if self.policy else None)
        self.gateway = self._new_gateway(self.link.gateway, self.link.address)
        self.gateway.start()

    def _wired(self) -> bool:
        return self.link is not None

    def _kernel_now(self) -> dict[str, int]:
        """The current guest's kernel drops (its wiring is up)."""
        return network.kernel_drops(self.link)

    def _unwire(self) -> dict[str, int]:
        """Take the current guest's wiring down; its kernel drops until then."""
        link, self.link = self.link, None
        return network.unplumb(link)

    def detach(self) -> None:
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            gateway.close()
        if self._wired():
            self._kernel_drops.update(self._unwire())

    def stats(self) -> dict:
        kernel = collections.Counter(self._kernel_drops)
        if self._wired():
            kernel.update(self._kernel_now())
        return self.traffic.snapshot(kernel)

    def egress_log(self, since: int | None = None) -> list[dict]:
        return self.traffic.log.records(since)

    def expose(self, port: int) -> tuple[str, int]:
        if self.gateway is None:
            raise SandboxError("the sandbox's network is not up (its guest is restarting)")
        return "127.0.0.1", self.gateway.expose(port)


class NetworkedDeployment:
    """What a deployment that holds a ``SandboxNetwork`` as ``self.network`` (None: no
    network) answers for it (local and docker alike)."""

    network: SandboxNetwork | None
    spec: "SandboxSpec"

    def guest_env(self) -> dict[str, str]:
        """The guest's environment: the network's (``SandboxNetwork.guest_env``), then the spec's."""
        return {**(self.network.guest_env() if self.network is not None else {}), **self.spec.env}

    def network_stats(self) -> dict | None:
        """Bytes, connections and denied attempts by reason (``Traffic``), or None without a network."""
        return self.network.stats() if self.network is not None else None

    def egress_log(self, since: int | None = None) -> list[dict]:
        """The gateway's records (``egresslog.py``) after ``since``; [] without a network."""
        return self.network.egress_log(since) if self.network is not None else []

    def expose(self, port: int) -> tuple[str, int]:
        if self.network is None:
            raise SpecError("network", "expose() needs a sandbox with network=True")
        return self.network.expose(port)
