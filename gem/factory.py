"""The one place an env is made from an id: the trainer, the vector env, the tokenizer builder
and the gem-llm bridge all call :func:`make_env`.

Id forms:

- ``gem:<id>``: an id of gem-llm's registry (``gem:game:GuessTheNumber-v0-easy``), through
  :class:`~rockroll.gem.gemllm.GemLLMEnv`;
- ``module:Class`` (module path without ``/``): an entry point, called with the kwargs;
- anything else: a gymnasium id (``rock/FrozenLake-v0``, hub envs), ``gymnasium.make``'d and
  unwrapped (GEM envs truncate themselves, gymnasium's wrappers would only get in the way).

Whatever comes out, a gem-llm ``Env`` (its ``reset`` takes no ``options``) is put behind the
adapter, so every caller sees rockroll's ``reset(seed, options)`` / ``step`` contract.
"""

from __future__ import annotations

import importlib
from typing import Any

from .gemllm import GEM_PREFIX, GemLLMEnv, is_gem_llm_env

__all__ = ["is_entry_point", "make_env"]


def is_entry_point(env_id: str) -> bool:
    """``module:Class``, as opposed to a gymnasium id (``rock/X-v0``) or a ``gem:`` id."""
    head, sep, _ = env_id.partition(":")
    return bool(sep) and "/" not in head and not env_id.startswith(GEM_PREFIX)


def make_env(env_id: str, **kwargs: Any) -> Any:
    """A fresh env for ``env_id`` (any form of the module docstring), made with ``kwargs``."""
    if env_id.startswith(GEM_PREFIX):
        return GemLLMEnv(env_id[len(GEM_PREFIX):], **kwargs)
    if is_entry_point(env_id):
        module, name = env_id.split(":", 1)
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        if is_gem_llm_env(obj):  # a gem-llm class: the adapter sorts its kwargs from rockroll's
            return GemLLMEnv(obj, **kwargs)
        env = obj(**kwargs)
    else:
        import gymnasium

        env = gymnasium.make(env_id, **kwargs).unwrapped
    return GemLLMEnv(env) if is_gem_llm_env(env) else env
