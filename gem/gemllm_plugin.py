"""rockroll's envs under ``gem.make``. Importing this module imports gem-llm.

- :class:`RockEnv` is a gem-llm ``Env`` driving any rockroll env; :func:`register_rock_envs`
  puts every ``rock/<Name>`` gymnasium id (built-in and hub envs) into gem-llm's registry as
  ``rock:<Name>``, so ``gem.make("rock:FrozenLake-v0")``, ``gem.make_vec`` and gem-llm's
  wrappers work on them. ``import rockroll`` arranges the registration
  (:mod:`rockroll.registry.gemllm`); hub envs registered later need another
  :func:`register_rock_envs` call.
"""

from __future__ import annotations

import functools
from typing import Any

from .gemllm_load import load_gem_llm

load_gem_llm()

from gem.core import Env  # noqa: E402  (after the shadowing check)

from .factory import make_env  # noqa: E402

__all__ = ["RockEnv", "register_rock_envs"]


class RockEnv(Env):
    """A rockroll env as a gem-llm ``Env``: ``reset(seed)`` / ``step(action)`` as gem-llm calls them.

    ``seed`` (what ``gem.make_vec`` passes each env) seeds the first reset that gets none, so
    the envs of a vector env play different episodes; later resets continue the env's RNG.
    ``get_state``/``set_state`` are rockroll's ``save_state`` / ``reset(options={"state": ...})``.
    """

    def __init__(self, rock_id: str, seed: int | None = None, **kwargs: Any):
        super().__init__()
        self.rock_id, self.kwargs = rock_id, dict(kwargs)
        self.env = make_env(rock_id, **kwargs)
        self._first_seed = seed

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if seed is None:
            seed, self._first_seed = self._first_seed, None
        return self.env.reset(seed=seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.env.step(action)

    def sample_random_action(self) -> str:
        return self.env.action_space.sample()

    def get_state(self) -> dict[str, Any]:
        return self.env.save_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.reset(options={"state": state})

    def spawn(self, same_state: bool = False, **kwargs: Any) -> "RockEnv":
        child = RockEnv(self.rock_id, **{**self.kwargs, **kwargs})
        if same_state:
            child.set_state(self.get_state())
        return child

    def close(self) -> None:
        self.env.close()


def register_rock_envs() -> list[str]:
    """Every ``rock/<Name>`` gymnasium id not yet in gem-llm's registry, as ``rock:<Name>``; the ids added."""
    import gymnasium
    from gem.envs.registration import ENV_REGISTRY, register

    added = []
    for rock_id in sorted(gymnasium.registry):
        if rock_id.startswith("rock/") and "rock:" + rock_id[5:] not in ENV_REGISTRY:
            register("rock:" + rock_id[5:], functools.partial(RockEnv, rock_id))
            added.append("rock:" + rock_id[5:])
    return added
