"""``train(config)``: the entry point. It picks where the roles run (this process, or Ray
actors when ``ray.enabled``) and runs :func:`~rockroll.trainer.loop.run` over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from rockroll.sandbox.lifecycle import install_exit_handlers

from .config import EnvConfig, TrainConfig, load_config
from .envs import resolve_envs
from .loop import run
from .roles.local import LocalRoles

__all__ = ["train"]


def train(config: TrainConfig | dict | str | Path, *,
          env_factory: Callable[[EnvConfig], Any] | None = None) -> dict[str, Any]:
    """Run RL training as configured; return a summary (final step, metrics history, and in
    this process the ``policy``, ``generator`` and ``tokenizer``; no policy object comes back
    from Ray actors)."""
    # SIGTERM -> a normal exit, so the run's sandboxes are closed (they are opened on the
    # rollout's threads, where no signal handler can be set)
    install_exit_handlers()
    cfg = config if isinstance(config, TrainConfig) else load_config(config)
    if env_factory is None:  # ids are made by the one factory: check them before anything is built
        resolve_envs(cfg)
    if cfg.ray.enabled:
        from .roles.ray import RayRoles  # ray is an optional extra

        return run(cfg, RayRoles.open, env_factory)
    return run(cfg, LocalRoles, env_factory)
