"""TLS inspection for a sandbox's gateway (``EgressPolicy(inspect_tls=True)``): the sandbox's
own CA, the certificates it signs for the names the sandbox connects to, and TLS over the
gateway's asyncio streams, both ways. ``gateway.py`` decides what passes; this module only
speaks TLS.

- **A CA per sandbox** (``Authority``), made when its network is (``SandboxNetwork``), kept in
  the gateway's memory and gone with the sandbox. Per sandbox rather than per policy: a
  policy is data that travels (to a service, a Ray node) and is shared by every sandbox made
  from it; a key in it would travel too, and one sandbox's key would vouch for the names every
  other sandbox of the policy trusts. Per sandbox, its key vouches for nothing outside the
  one sandbox whose trust store holds its certificate; and a key that is never stored needs
  no rotation or cleanup. It costs a P-256 key and one signature at start (about a
  millisecond). The CA is name-constrained to the policy's hosts: were its key ever out, it
  still could not vouch for another name, in that sandbox or anywhere.
- **Its key is never on a filesystem**, the sandbox's or the host's: certificates are signed
  with ``cryptography`` in memory, and a leaf's key reaches OpenSSL through a ``memfd``
  (``ssl`` loads a chain from a path only), closed once loaded. The sandbox gets the CA's
  certificate only (``trust_bundle``, ``TRUST_ENV``).
- **Leaves** per server name (the ClientHello's SNI, which the gateway has judged already),
  one key for all of a sandbox's leaves, cached (``LEAF_CACHE`` names, least recently used
  dropped).
- **ALPN**: ``http/1.1`` only, to the client and upstream. HTTP/2 is refused by not being
  offered: a client that offers h2 and http/1.1 gets http/1.1; one that speaks h2 anyway
  sends its preface, which the request reader refuses (``http_malformed``).
- **Upstream**: full verification, chain and host name, against the host's trust store
  (``ssl.create_default_context()``: OpenSSL's default paths, ``$SSL_CERT_FILE`` of the
  gateway's process) or a policy's ``upstream_ca``.
- ``TLSStream``: one end of a TLS connection over a raw stream pair, with ``ssl.SSLObject``
  on memory BIOs, so a connection whose first bytes (the ClientHello) were read already
  can still be terminated. It reads like an ``asyncio.StreamReader`` (``read``) and writes
  like a ``StreamWriter`` (``write``, ``drain``, ``write_eof``: a close_notify then a half
  close, ``close``), so the gateway's HTTP reading and its upstream copy take either.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import ipaddress
import os
import ssl

from ..errors import SandboxStartError

LEAF_CACHE = 256  # server names whose leaf context a sandbox keeps
VALID_DAYS = 825  # the CA's and leaves' lifetime; they live in memory, as long as a sandbox
ALPN = ["http/1.1"]
# Where the sandbox's trust store is, and the variables that point clients at it: OpenSSL
# (Python's ssl, curl built on it), requests, pip, Node (extra CAs: it keeps its own too),
# curl's own.
BUNDLE_PATH = "/etc/ssl/certs/ca-certificates.crt"
TRUST_ENV = {name: BUNDLE_PATH for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT",
                                            "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE")}


def _crypto():
    try:
        from cryptography import x509  # noqa: PLC0415
        from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415
    except ImportError as e:
        raise SandboxStartError("EgressPolicy(inspect_tls=True) needs the 'cryptography' package on the host "
                                "that runs the gateway (pip install cryptography)") from e
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


class Authority:
    """One sandbox's CA (the module docstring): ``cert_pem`` for its trust store,
    ``server_context(name)`` to terminate a client's TLS for ``name``, ``upstream_context``
    to verify the far end's."""

    def __init__(self, hosts: tuple[str, ...], upstream_ca: str | None = None):
        x509, hashes, serialization, ec, _, NameOID = _crypto()
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rockroll sandbox egress CA"),
                                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rockroll")])
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
                   .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False,
                                                key_agreement=False, key_cert_sign=True, crl_sign=True,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False))
        # Name constraints: the CA vouches for the policy's names only (a wildcard's domain
        # covers the names below it). No hosts: nothing is inspected, no constraint to draw.
        domains = sorted({h[2:] if h.startswith("*.") else h for h in hosts})
        if domains:
            builder = builder.add_extension(x509.NameConstraints(
                permitted_subtrees=[x509.DNSName(d) for d in domains], excluded_subtrees=None), critical=True)
        self._cert = builder.sign(self._key, hashes.SHA256())
        self.cert_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self._leaves: collections.OrderedDict[str, ssl.SSLContext] = collections.OrderedDict()
        self._upstream_ca = upstream_ca
        self._upstream: ssl.SSLContext | None = None

    def _leaf_pem(self, name: str) -> bytes:
        x509, hashes, serialization, _, ExtendedKeyUsageOID, NameOID = _crypto()
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(self._name).public_key(self._leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                .add_extension(x509.SubjectAlternativeName([_general_name(x509, name)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                               critical=False)
                .sign(self._key, hashes.SHA256()))
        key = self._leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        return key + cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem

    def server_context(self, name: str) -> ssl.SSLContext:
        """The context that answers a client's ClientHello for ``name`` (cached)."""
        ctx = self._leaves.get(name)
        if ctx is not None:
            self._leaves.move_to_end(name)
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_RENEGOTIATION  # a renegotiation would hand the stream to a new handshake mid-request
        ctx.set_alpn_protocols(ALPN)
        _load_chain(ctx, self._leaf_pem(name))
        self._leaves[name] = ctx
        while len(self._leaves) > LEAF_CACHE:
            self._leaves.popitem(last=False)
        return ctx

    def upstream_context(self) -> ssl.SSLContext:
        """The context that verifies a far end: chain and host name, against the host's
        trust store or ``upstream_ca`` (loaded once)."""
        if self._upstream is None:
            try:
                ctx = ssl.create_default_context(cafile=self._upstream_ca)
            except (OSError, ssl.SSLError) as e:
                raise SandboxStartError(f"egress.upstream_ca: cannot load {self._upstream_ca}: {e}") from e
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.options |= ssl.OP_NO_RENEGOTIATION
            ctx.set_alpn_protocols(ALPN)
            self._upstream = ctx
        return self._upstream


def _general_name(x509, name: str):
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _load_chain(ctx: ssl.SSLContext, pem: bytes) -> None:
    """``ctx.load_cert_chain`` from memory: through a memfd (no file on any filesystem),
    closed once OpenSSL has read it."""
    fd = os.memfd_create("rockroll-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def trust_bundle(ca_pem: bytes, system: str | None = None) -> bytes:
    """What the sandbox's ``BUNDLE_PATH`` holds: the host's CA bundle (the roots a sandbox
    meets where it is not inspected: an address a CIDR opens) and the sandbox's CA."""
    path = system or ssl.get_default_verify_paths().cafile
    try:
        with open(path, "rb") as f:
            roots = f.read()
    except (OSError, TypeError):
        roots = b""
    if roots and not roots.endswith(b"\n"):
        roots += b"\n"
    return roots + b"# rockroll: this sandbox's egress CA (EgressPolicy(inspect_tls=True))\n" + ca_pem


class TLSStream:
    """One end of TLS over a raw ``reader`` / ``writer`` pair (the module docstring).
    ``first``: bytes of the peer's read already (a ClientHello). ``handshake`` first."""

    def __init__(self, ctx: ssl.SSLContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 server_side: bool, server_hostname: str | None = None, first: bytes = b""):
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._ssl = ctx.wrap_bio(self._in, self._out, server_side=server_side, server_hostname=server_hostname)
        self._in.write(first)
        self.raw_reader, self.raw_writer = reader, writer
        self._ended = False

    def _flush(self) -> None:
        data = self._out.read()
        if data and not self.raw_writer.is_closing():
            self.raw_writer.write(data)

    async def _more(self) -> bool:
        """Feed the next raw bytes to OpenSSL; False at the raw stream's end."""
        self._flush()
        await self.raw_writer.drain()
        data = await self.raw_reader.read(65536)
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()
        return bool(data)

    async def handshake(self) -> None:
        """Raises ``ssl.SSLError`` (``SSLCertVerificationError``: the peer's certificate)
        or ``ConnectionError`` (the peer left)."""
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                if not await self._more():
                    self._flush()
                    raise ConnectionResetError("the peer closed the connection during the TLS handshake") from None
            except ssl.SSLError:
                self._flush()  # the alert, so the peer learns why
                raise
        self._flush()
        await self.raw_writer.drain()

    @property
    def alpn(self) -> str | None:
        return self._ssl.selected_alpn_protocol()

    async def read(self, n: int = 65536) -> bytes:
        """Up to ``n`` bytes of plaintext; b"" at the end (a close_notify, or the raw end)."""
        ended = False
        while True:
            try:
                data = self._ssl.read(n)
            except ssl.SSLWantReadError:
                if ended:
                    return b""
                ended = not await self._more()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            self._flush()  # a read may answer (a key update)
            return data

    def write(self, data: bytes) -> None:
        if self._ended:
            raise RuntimeError("write after the TLS stream's end")
        view = memoryview(data)
        while view:
            n = self._ssl.write(view)
            view = view[n:]
        self._flush()

    async def drain(self) -> None:
        await self.raw_writer.drain()

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self._ended or self.raw_writer.is_closing()

    def write_eof(self) -> None:
        """Done sending: a close_notify, then the raw stream's half close (reading goes on)."""
        if self._ended:
            return
        self._ended = True
        try:
            self._ssl.unwrap()
        except (ssl.SSLWantReadError, ssl.SSLError):
            pass  # the peer's close_notify is not here yet: reading goes on until it is
        self._flush()
        if self.raw_writer.can_write_eof() and not self.raw_writer.is_closing():
            self.raw_writer.write_eof()

    def close(self) -> None:
        self._ended = True
        self.raw_writer.close()

    def get_extra_info(self, name: str, default=None):
        return self.raw_writer.get_extra_info(name, default)
