"""Making an env from an :class:`EnvConfig`: a registered gymnasium id or an entry point."""

from __future__ import annotations

import importlib
from typing import Any

from .config import EnvConfig


def make_env(spec: EnvConfig, format_penalty: float | None = None) -> Any:
    """A fresh env: a gymnasium id (``rock/FrozenLake-v0``) or an entry point ``module:Class``."""
    kwargs = dict(spec.kwargs)
    if format_penalty is not None:
        kwargs["format_penalty"] = format_penalty
    if ":" in spec.id and "/" not in spec.id.split(":")[0]:
        module, name = spec.id.split(":", 1)
        return getattr(importlib.import_module(module), name)(**kwargs)
    import gymnasium  # the rock/* ids: registered by rockroll/__init__, run by any rockroll.* import

    return gymnasium.make(spec.id, **kwargs).unwrapped  # GEM envs truncate themselves
