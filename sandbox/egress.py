"""Where a sandbox with a network may connect: the egress policy of a spec, and the
addresses no policy opens. Pure data and functions; the local deployment enforces them
(``deployment/network.py`` wires the sandbox, ``deployment/gateway.py`` answers its DNS and
carries its TCP).

``SandboxSpec(network=True)`` alone means the public internet: any name resolves, any
public address on any port. ``SandboxSpec(network=True, egress=EgressPolicy(...))`` narrows
it to the names (``*.`` wildcards), CIDRs and ports listed. Denied always: loopback, the
host's own addresses and every sandbox's (checked where the host is known), and, unless a
CIDR of the policy names them, link-local (169.254.0.0/16, the cloud metadata address),
private and ULA ranges.

``rules`` narrow what HTTP requests to a host may be: their methods and path prefixes
(``HttpRule``), judged on every request, plain or inside inspected TLS.

``inspect_tls=True`` (opt-in) makes the gateway terminate the TLS of connections to allowed
names with a CA of the sandbox's own (``deployment/tlsinspect.py``), so each request inside
is judged as plain HTTP's are; ``inject`` then names headers the gateway sets on each
request to a host, from secrets the sandbox never holds (``SecretRef``: an env var or a
file of the host that runs the gateway).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from .errors import SpecError

# Never reachable, whatever a policy says: the host itself (its loopback), unspecified,
# multicast and broadcast. The host's other addresses and the sandboxes' subnet are added
# by the gateway, which knows them.
LOOPBACK = tuple(ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"))
MULTICAST = tuple(ipaddress.ip_network(n) for n in ("224.0.0.0/4", "240.0.0.0/4", "ff00::/8"))
LINK_LOCAL = tuple(ipaddress.ip_network(n) for n in ("169.254.0.0/16", "fe80::/10"))
# RFC 1918, carrier-grade NAT (RFC 6598), IETF protocol assignments, ULA
PRIVATE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                  "100.64.0.0/10", "192.0.0.0/24", "fc00::/7"))

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP token (RFC 9110)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ENTRIES = 256
# Headers a secret may not set: they frame the request or route it, which the gateway has
# judged already (a Host or a length written after the check would undo it).
FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
                             "trailer", "keep-alive", "proxy-connection"})


def address_class(ip: str) -> str | None:
    """Why ``ip`` is not a public address (``"loopback"``, ``"multicast"``, ``"metadata"``
    for link-local, ``"private"``), or None. IPv4-mapped IPv6 is judged as its IPv4."""
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    for reason, nets in (("loopback", LOOPBACK), ("multicast", MULTICAST), ("metadata", LINK_LOCAL),
                         ("private", PRIVATE)):
        if any(addr in n for n in nets if n.version == addr.version):
            return reason
    return None


@dataclass(frozen=True)
class SecretRef:
    """Where the gateway reads a secret header's value, on the host that runs it (never in
    the sandbox): ``source`` is ``"env:NAME"`` (that process's environment variable) or
    ``"file:/absolute/path"`` (the file's text, one trailing newline dropped). The header is
    ``prefix`` + the secret (``prefix="Bearer "`` for a bare token). Read when the sandbox's
    network starts (again at each ``reset`` / ``restore``); the reference travels in the
    spec, the value never does."""

    source: str
    prefix: str = ""

    def __post_init__(self) -> None:
        where = "egress.inject"
        if not isinstance(self.source, str) or not isinstance(self.prefix, str):
            raise SpecError(where, "a secret reference is SecretRef(source='env:NAME' | 'file:/path', prefix='')")
        kind, _, name = self.source.partition(":")
        env_ok = kind == "env" and _ENV_NAME.match(name)
        if not (env_ok or (kind == "file" and name.startswith("/") and "\0" not in name)):
            raise SpecError(where, f"a secret source is 'env:NAME' or 'file:/absolute/path', not {self.source!r}")
        if any(c in self.prefix for c in "\r\n\0"):
            raise SpecError(where, "a secret's prefix may not hold CR, LF or NUL")

    @property
    def kind(self) -> str:
        return self.source.partition(":")[0]

    @property
    def name(self) -> str:
        """The variable's name or the file's path."""
        return self.source.partition(":")[2]

    @classmethod
    def from_value(cls, value: Any, where: str) -> "SecretRef":
        """A ``SecretRef`` from itself, its source string, or its dict (what ``to_dict`` gives)."""
        try:
            if isinstance(value, cls):
                return value
            if isinstance(value, str):
                return cls(value)
            if isinstance(value, Mapping) and set(value) <= {"source", "prefix"} and "source" in value:
                return cls(**value)
        except SpecError as e:
            raise SpecError(where, str(e).split(": ", 1)[1]) from None
        raise SpecError(where, "must be a SecretRef, 'env:NAME' or 'file:/path'")


_METHOD = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Z]+$")  # an HTTP token, upper case (methods are case-sensitive)
# In a path, what a server may read as something else than it looks: an encoded dot, slash,
# backslash or NUL, an overlong UTF-8 lead byte (%c0%ae was a dot to old decoders), a backslash.
_AMBIGUOUS = re.compile(r"%(2[eEfF]|5[cC]|00|[cC][01])|\\")


def plain_path(path: str) -> bool:
    """Whether ``path`` (a request's, without its query) reads one way only: no dot segment
    (``.``/``..``, also with ``;parameters`` as Tomcat reads ``..;``) and nothing in
    ``_AMBIGUOUS``. A prefix check on any other path could pass what the server then
    resolves outside the prefix (``/v1/../admin``, ``/v1/%2e%2e/admin``)."""
    return path.startswith("/") and not _AMBIGUOUS.search(path) and not any(
        seg.split(";", 1)[0] in (".", "..") for seg in path.split("/"))


@dataclass(frozen=True)
class HttpRule:
    """What HTTP requests to a host may be (``EgressPolicy.rules``). ``methods``: e.g.
    ``("GET", "HEAD")`` (empty: any). ``paths``: prefixes, ending at a segment boundary,
    that a request's path (its target without the query) must start with: ``"/v1"`` and
    ``"/v1/"`` take ``/v1/models``, neither takes ``/v1beta`` (empty: any path). Under
    ``paths``, a path that may read two ways (``plain_path``) is refused whatever it
    starts with, and so is a request with no path (``CONNECT``, ``OPTIONS *``)."""

    methods: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        methods, paths = _strings("egress.rules.methods", self.methods), _strings("egress.rules.paths", self.paths)
        for m in methods:
            if not _METHOD.match(m):
                raise SpecError("egress.rules.methods", f"not an upper-case HTTP method: {m!r}")
        for path in paths:
            if not plain_path(path) or "?" in path or "#" in path:
                raise SpecError("egress.rules.paths", f"not a plain absolute path (no dot segments, "
                                                      f"encoded dots or slashes, query): {path!r}")
        object.__setattr__(self, "methods", methods)
        object.__setattr__(self, "paths", paths)

    @classmethod
    def from_value(cls, value: Any, where: str) -> "HttpRule":
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping) or not set(value) <= {"methods", "paths"}:
            raise SpecError(where, "must be an HttpRule or {methods: [...], paths: [...]}")
        try:
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
        except SpecError as e:
            raise SpecError(where + e.field.removeprefix("egress.rules"), str(e).split(": ", 1)[1]) from None

    def refusal(self, method: str, path: str | None) -> str | None:
        """Why a request of ``method`` for ``path`` (None: its target has none) may not go:
        ``"http_method"``, ``"http_path"``; None when it may."""
        if self.methods and method not in self.methods:
            return "http_method"
        if self.paths and (path is None or not plain_path(path) or not any(
                path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in self.paths)):
            return "http_path"
        return None


@dataclass(frozen=True)
class EgressPolicy:
    """An allow-list for a sandbox's outbound traffic (``SandboxSpec.egress``).

    ``hosts``: names the sandbox may resolve and connect to (``index.example``; ``*.example.com``
    matches any name below example.com, not example.com itself). A connection to a name's
    address is allowed only if this sandbox's resolver gave it that address, and its TLS SNI
    or HTTP ``Host`` (when it speaks TLS or HTTP) names a host the address was resolved for.
    ``cidrs``: addresses the sandbox may reach directly (a private range listed here is
    opened; loopback, the host and other sandboxes never are). ``ports``: the TCP ports
    allowed, to names and CIDRs alike (empty: any). ``bandwidth_mbit``: a cap on each
    direction (None: none). Only TCP leaves the sandbox, and DNS to its own resolver.

    ``rules``: ``{host: HttpRule}`` (or ``{host: {methods, paths}}``), for entries of
    ``hosts`` (a wildcard entry covers the names below it; an exact entry wins over it):
    every HTTP request to that host must pass its rule, or it is answered 403 and counted
    (``http_method``, ``http_path``). Requests inside TLS are seen only with
    ``inspect_tls``: without it, TLS to a host with a rule is refused (``tls_rules``).

    ``inspect_tls``: terminate TLS to allowed names with a CA made for the sandbox (put in
    its trust stores), judge each request inside (its ``Host`` must be the server name),
    and connect upstream verifying the certificate against the host's trust store, or
    against ``upstream_ca`` (a PEM file on the gateway's host; for tests and private CAs).
    ``inject``: ``{host: {header: SecretRef}}``, headers set (replacing the client's) on each
    request to that exact allowed host, over inspected TLS only (it needs ``inspect_tls``;
    plain HTTP to the host goes without them: the value would cross the network in the
    clear to a server that proved nothing).
    """

    hosts: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    bandwidth_mbit: float | None = None
    inspect_tls: bool = False
    inject: Mapping[str, Mapping[str, Union[SecretRef, str]]] = field(default_factory=dict)
    upstream_ca: str | None = None
    rules: Mapping[str, Union[HttpRule, Mapping[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        hosts = _strings("egress.hosts", self.hosts)
        norm = []
        for h in hosts:
            name = h.lower().rstrip(".")
            labels = name[2:].split(".") if name.startswith("*.") else name.split(".")
            if not name or len(name) > 253 or not all(_LABEL.match(l) for l in labels):
                raise SpecError("egress.hosts", f"not a host name or *.wildcard: {h!r}")
            norm.append(name)
        cidrs = []
        for c in _strings("egress.cidrs", self.cidrs):
            try:
                net = ipaddress.ip_network(c, strict=False)
            except ValueError:
                raise SpecError("egress.cidrs", f"not a CIDR: {c!r}") from None
            if any(net.overlaps(n) for n in LOOPBACK + MULTICAST if n.version == net.version):
                raise SpecError("egress.cidrs", f"{c!r} covers loopback or multicast, which no policy opens")
            cidrs.append(str(net))
        if isinstance(self.ports, (str, bytes)) or not isinstance(self.ports, (list, tuple)) \
                or len(self.ports) > MAX_ENTRIES:
            raise SpecError("egress.ports", "must be a list of port numbers")
        for p in self.ports:
            if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
                raise SpecError("egress.ports", f"not a port number (1-65535): {p!r}")
        bw = self.bandwidth_mbit
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0.01 <= bw <= 100_000):
            raise SpecError("egress.bandwidth_mbit", f"must be a number of Mbit/s in [0.01, 100000], not {bw!r}")
        object.__setattr__(self, "hosts", tuple(norm))
        object.__setattr__(self, "cidrs", tuple(cidrs))
        object.__setattr__(self, "ports", tuple(self.ports))
        if not isinstance(self.inspect_tls, bool):
            raise SpecError("egress.inspect_tls", f"must be true or false, not {self.inspect_tls!r}")
        ca = self.upstream_ca
        if ca is not None and not (isinstance(ca, str) and ca.startswith("/")):
            raise SpecError("egress.upstream_ca", f"must be an absolute path to a PEM file, not {ca!r}")
        if ca is not None and not self.inspect_tls:
            raise SpecError("egress.upstream_ca", "verifies the upstream certificates of inspected TLS: "
                                                  "needs inspect_tls=True")
        object.__setattr__(self, "inject", self._inject())
        object.__setattr__(self, "rules", self._rules())

    def _rules(self) -> dict[str, HttpRule]:
        if not isinstance(self.rules, Mapping) or len(self.rules) > MAX_ENTRIES:
            raise SpecError("egress.rules", "must map entries of egress.hosts to {methods, paths}")
        out: dict[str, HttpRule] = {}
        for host, rule in self.rules.items():
            name = host.lower().rstrip(".") if isinstance(host, str) else host
            if name not in self.hosts:
                raise SpecError(f"egress.rules.{host}", "must be an entry of egress.hosts, as written there")
            out[name] = HttpRule.from_value(rule, f"egress.rules.{host}")
        return out

    def rule_for(self, host: str) -> HttpRule | None:
        """The rule the requests to ``host`` pass: its exact entry's, else the most specific
        wildcard's that covers it; None: any request."""
        host = host.lower().rstrip(".")
        if host in self.rules:
            return self.rules[host]
        covering = [h for h in self.rules if _below(host, h)]
        return self.rules[max(covering, key=len)] if covering else None

    def _inject(self) -> dict[str, dict[str, SecretRef]]:
        """``inject`` checked and normalized: exact allowed hosts, header tokens, ``SecretRef``s."""
        if not isinstance(self.inject, Mapping) or len(self.inject) > MAX_ENTRIES:
            raise SpecError("egress.inject", "must map host names to {header: secret reference}")
        if self.inject and not self.inspect_tls:
            raise SpecError("egress.inject", "injects headers into inspected TLS only: needs inspect_tls=True")
        out: dict[str, dict[str, SecretRef]] = {}
        for host, headers in self.inject.items():
            name = host.lower().rstrip(".") if isinstance(host, str) else host
            where = f"egress.inject.{host}"
            if not isinstance(name, str) or name.startswith("*.") or not self.allows_name(name):
                raise SpecError(where, "must be an exact host name that egress.hosts allows")
            if not isinstance(headers, Mapping) or not headers or len(headers) > MAX_ENTRIES:
                raise SpecError(where, "must map header names to secret references")
            refs: dict[str, SecretRef] = {}
            for header, ref in headers.items():
                if not isinstance(header, str) or not _HEADER_NAME.match(header):
                    raise SpecError(f"{where}.{header}", "not an HTTP header name")
                if header.lower() in FRAMING_HEADERS:
                    raise SpecError(f"{where}.{header}", "frames or routes the request: not a header to inject")
                if any(h.lower() == header.lower() for h in refs):
                    raise SpecError(f"{where}.{header}", "named twice")
                refs[header] = SecretRef.from_value(ref, f"{where}.{header}")
            out[name] = refs
        return out

    @classmethod
    def from_value(cls, value: Any) -> "EgressPolicy":
        """An ``EgressPolicy`` from itself or its dict (what ``to_dict`` and JSON carry)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise SpecError("egress", f"must be an EgressPolicy or a mapping, not {type(value).__name__}")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise SpecError(f"egress.{sorted(unknown)[0]}", "unknown field")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})

    def injects(self) -> bool:
        """Whether the gateway reads secrets of its host for this policy (``inject``): what
        a service client may not ask for (``protocol/wire.py``)."""
        return bool(self.inject)

    def allows_name(self, name: str) -> bool:
        name = name.lower().rstrip(".")
        return any(name == h or _below(name, h) for h in self.hosts)

    def cidr_allows(self, ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        return any(addr in ipaddress.ip_network(c) for c in self.cidrs)

    def allows_port(self, port: int) -> bool:
        return not self.ports or port in self.ports


def _below(name: str, pattern: str) -> bool:
    """Whether ``pattern`` is a ``*.`` wildcard and ``name`` a name below it."""
    return pattern.startswith("*.") and name.endswith(pattern[1:]) and len(name) > len(pattern) - 1


def _strings(field: str, value) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or len(value) > MAX_ENTRIES:
        raise SpecError(field, f"must be a list of at most {MAX_ENTRIES} strings")
    if not all(isinstance(v, str) for v in value):
        raise SpecError(field, "must be a list of strings")
    return tuple(value)
