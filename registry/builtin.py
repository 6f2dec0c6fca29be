"""Gymnasium ids of the environments that ship with rockroll.

``register_builtin()`` is idempotent: ids already in the gymnasium registry are left alone
(so calling it from ``import rockroll`` and again from a test is harmless). No
``max_episode_steps``: GEM envs truncate themselves at ``max_turns``.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium

__all__ = ["BUILTIN_ENVS", "register_builtin"]

BUILTIN_ENVS: dict[str, str] = {
    "rock/SWE-v0": "rockroll.gem.swe:SWEEnv",
    "rock/Math-v0": "rockroll.gem.mathenv:MathEnv",
    "rock/Sokoban-v0": "rockroll.gem.grid:SokobanEnv",
    "rock/FrozenLake-v0": "rockroll.gem.grid:FrozenLakeEnv",
    "rock/Terminal-v0": "rockroll.gem.terminal:TerminalEnv",
    "rock/TerminalTmux-v0": "rockroll.gem.tmux:TmuxTerminalEnv",
    "rock/Code-v0": "rockroll.gem.code:CodeEnv",
    "rock/Agent-v0": "rockroll.gem.agent_env:AgentEnv",
    "rock/WebShop-v0": "rockroll.gem.webshop:WebShopEnv",
}



def _make_vec(env_id: str, num_envs: int, **kwargs: Any):
    # Imported on use: registering ids must not import the sandbox engine.
    from rockroll.gem.vector import make_vec

    return make_vec(env_id, num_envs, **kwargs)


def register_builtin() -> list[str]:
    """Register the built-in ids that are not registered yet; return the ids it registered."""
    added = []
    for env_id, entry_point in BUILTIN_ENVS.items():
        if env_id in gymnasium.registry:
            continue
        # every id vectorises as a GemVectorEnv: sandbox envs step concurrently on one loop
        gymnasium.register(id=env_id, entry_point=entry_point,
                           vector_entry_point=functools.partial(_make_vec, env_id))
        added.append(env_id)
    return added
