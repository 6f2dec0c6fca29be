"""The secret headers a sandbox's gateway sets (``EgressPolicy.inject``), read on the host
that runs the gateway, where the sandbox cannot look: its environment (``env:NAME``) or a
file (``file:/path``). Only ``gateway.py`` holds the values, in its memory, and only on
requests over inspected TLS (``tlsinspect.py``) to the exact host named, whose certificate
the gateway verified: never on plain HTTP, where the value would cross the network in the
clear to a server that proved nothing, never inside a tunnel or an upgraded stream (its
bytes are another protocol, which a server may echo back), never on a request the gateway
refused. The audit log names the headers set, never their values (``egresslog.py``).

What it cannot stop: a server of the named host that reflects a request's headers in its
answer (an echo endpoint, a debugging page) hands the value to the sandbox; inject only
for hosts whose answers do not.
"""

from __future__ import annotations

import os

from ..egress import EgressPolicy, SecretRef
from ..errors import SpecError
from .httpstream import Head, with_headers


def read_secret(ref: SecretRef, where: str) -> str:
    """The header value ``ref`` names (its prefix included), read now. ``SpecError`` naming
    ``where`` if it cannot be had; the message never holds any of the value."""
    if ref.kind == "env":
        value = os.environ.get(ref.name)
        if value is None:
            raise SpecError(where, f"the environment variable {ref.name} is not set on the gateway's host")
    else:
        try:
            with open(ref.name, encoding="utf-8") as f:
                value = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(where, f"cannot read {ref.name} on the gateway's host: "
                                   f"{getattr(e, 'strerror', None) or type(e).__name__}") from None
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise SpecError(where, f"{ref.source} is empty")
    if any(c in value for c in "\r\n\0"):
        raise SpecError(where, f"{ref.source} holds CR, LF or NUL: not a header value")
    value = ref.prefix + value
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise SpecError(where, f"{ref.source}: a header value is Latin-1 text") from None
    return value


class Injector:
    """A policy's ``inject``, its secrets read (``read_secret``): ``apply`` sets them on a
    request head."""

    def __init__(self, policy: EgressPolicy):
        self._headers = {host: {name: read_secret(ref, f"egress.inject.{host}.{name}") for name, ref in refs.items()}
                         for host, refs in policy.inject.items()}

    def __repr__(self) -> str:  # the values stay out of any log or traceback that prints this
        return f"Injector({ {h: sorted(v) for h, v in self._headers.items()} })"

    def apply(self, head: Head) -> tuple[bytes, tuple[str, ...]]:
        """``head``'s bytes to forward, the secrets of its host set (replacing any the
        client sent under those names), and the names set."""
        headers = self._headers.get(head.host)
        if not headers:
            return head.raw, ()
        return with_headers(head, headers), tuple(headers)
