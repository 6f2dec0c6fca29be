"""The trainer: ``rockroll.trainer.train(config)`` runs RL training as configured.

``config`` is a :class:`TrainConfig`, a dict, or the path of a YAML file (see ``examples/``).
The public names load lazily, so ``import rockroll.trainer`` does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "TrainConfig", "load_config", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from .controller import train

        return train
    if name in ("ConfigError", "TrainConfig", "load_config"):
        from . import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
