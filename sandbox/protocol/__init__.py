"""The ground floor of ``rockroll.sandbox``: what two sides must agree on, in one room
both import.

- ``frames.py``: the host <-> guest protocol (framing, the typed ``GuestConfig`` a
  deployment builds from a ``SandboxSpec``). Standard library only: the guest (pid 1 of a
  sandbox, ``guest/``) imports it before its root changes.
- ``wire.py``: the HTTP models ``rockroll serve`` (``server/``) and its SDK
  (``runtime/remote.py``) share, and the mapping of typed errors to HTTP statuses.
- ``tokens.py``: the model service's admin token, and how it travels.

Nothing is imported here, so the guest can import ``frames`` without pydantic.
"""
