"""The model service's admin token: where a sandbox opened here and now gets it from, and
how it travels. Where ``open_sandbox`` runs (the driver) it is ``$ROCKROLL_MODEL_TOKEN``; a
host that opens sandboxes for a driver elsewhere (the ray host actor, ``rockroll serve``)
gets the driver's with the create call (``TOKEN_HEADER`` from the remote SDK) and opens the
sandbox inside ``admin_token(token)``. See ``runtime/model_channel.py`` for the design."""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator

TOKEN_ENV = "ROCKROLL_MODEL_TOKEN"
TOKEN_HEADER = "X-Rockroll-Model-Token"  # how the remote SDK sends it to rockroll serve

_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("rockroll_model_token", default=None)


@contextlib.contextmanager
def admin_token(token: str | None) -> Iterator[None]:
    """Sandboxes opened inside this block get their keys with ``token`` (a driver's, sent
    with its create call) rather than this process's ``$ROCKROLL_MODEL_TOKEN``. ``None``
    changes nothing. Context-local: concurrent creates for different drivers do not mix."""
    reset = _TOKEN.set(token) if token else None
    try:
        yield
    finally:
        if reset is not None:
            _TOKEN.reset(reset)


def current_token() -> str | None:
    """The admin token a sandbox opened here and now would use (``admin_token`` block, else
    ``$ROCKROLL_MODEL_TOKEN``), or None."""
    return _TOKEN.get() or os.environ.get(TOKEN_ENV) or None
