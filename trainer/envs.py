"""Making an env from an :class:`EnvConfig`, through the one factory (:func:`rockroll.gem.factory.make_env`)."""

from __future__ import annotations

from typing import Any

from rockroll.gem.factory import make_env as _make

from .config import EnvConfig


def make_env(spec: EnvConfig, format_penalty: float | None = None) -> Any:
    """A fresh env for ``spec``: a gymnasium id (``rock/FrozenLake-v0``), a gem-llm id
    (``gem:game:GuessTheNumber-v0-easy``) or an entry point ``module:Class``."""
    kwargs = dict(spec.kwargs)
    if format_penalty is not None:
        kwargs["format_penalty"] = format_penalty
    return _make(spec.id, **kwargs)
