"""Making an env from an :class:`EnvConfig`, through the one factory (:func:`rockroll.gem.factory.make_env`)."""

from __future__ import annotations

from typing import Any

from rockroll.gem.factory import make_env as _make

from .config import ConfigError, EnvConfig, TrainConfig


def resolve_envs(cfg: TrainConfig) -> None:
    """Check every env id of ``cfg`` before anything is built, and note the hub each one
    was found on (``envs[i].hub``) so every process that makes it registers that hub first.
    Raises ``ConfigError("envs[i].id", ...)`` naming the id, the hubs searched and how to add
    one (:func:`rockroll.registry.lookup.find_env`)."""
    from rockroll.registry.lookup import EnvIdNotFound, find_env

    for i, spec in enumerate(cfg.envs):
        try:
            spec.hub = find_env(spec.id, [spec.hub] if spec.hub else cfg.hubs) or spec.hub
        except EnvIdNotFound as e:
            raise ConfigError(f"envs[{i}].id", str(e)) from None


def make_env(spec: EnvConfig, format_penalty: float | None = None) -> Any:
    """A fresh env for ``spec``: a gymnasium id (``rock/FrozenLake-v0``), a gem-llm id
    (``gem:game:GuessTheNumber-v0-easy``) or an entry point ``module:Class``; a hub env's hub
    (``spec.hub``) is registered in this process first."""
    if spec.hub:
        from rockroll.registry.lookup import ensure_hub

        ensure_hub(spec.hub)
    kwargs = dict(spec.kwargs)
    if format_penalty is not None:
        kwargs["format_penalty"] = format_penalty
    return _make(spec.id, **kwargs)
