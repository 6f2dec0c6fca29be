"""Gymnasium ids of the environments that ship with rockroll.

``register_builtin()`` is idempotent: ids already in the gymnasium registry are left alone
(so calling it from ``import rockroll`` and again from a test is harmless). No
``max_episode_steps``: GEM envs truncate themselves at ``max_turns``.
"""

from __future__ import annotations

import gymnasium

__all__ = ["BUILTIN_ENVS", "register_builtin"]

BUILTIN_ENVS: dict[str, str] = {
    "rock/Math-v0": "rockroll.gem.mathenv:MathEnv",
    "rock/Sokoban-v0": "rockroll.gem.grid:SokobanEnv",
    "rock/FrozenLake-v0": "rockroll.gem.grid:FrozenLakeEnv",
}


def register_builtin() -> list[str]:
    """Register the built-in ids that are not registered yet; return the ids it registered."""
    added = []
    for env_id, entry_point in BUILTIN_ENVS.items():
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(id=env_id, entry_point=entry_point)
        added.append(env_id)
    return added
