"""Vector GEM envs: many episodes stepped together, sandbox envs concurrently on one loop.

``make_vec(env_id, num_envs)`` (also ``gymnasium.make_vec(id, num_envs=n,
vectorization_mode="vector_entry_point")`` for every built-in id) builds a
:class:`GemVectorEnv`. For envs with an async core (:class:`~rockroll.gem.tools.SandboxToolEnv`)
every call awaits all sub-envs together on the sandbox engine's one event loop -- no
thread per env, so 64 envs waiting on 64 sandboxes cost 64 coroutines. Other envs (math,
grids) are cheap and are simply stepped one after another.

Observations are a tuple of strings (one per env); rewards, terminations and truncations
are numpy arrays; infos follow gymnasium's vector convention (``info[key]`` array plus a
``info["_" + key]`` mask).

Subsets: an LLM trainer rarely has every env's next action at once, so
:meth:`GemVectorEnv.step_some` steps only the envs at ``indices`` and returns results for
those, in that order (arrays of ``len(indices)``); :meth:`GemVectorEnv.step` is
``step_some`` over all envs.

Autoreset follows gymnasium 1.x ``AutoresetMode.NEXT_STEP``: the step that ends an episode
returns its final observation as usual; the *next* step of that env ignores its action,
resets it and returns the first observation of the new episode with reward 0,
``terminated = truncated = False`` and the reset's info. ``autoreset=False``
(``AutoresetMode.DISABLED``): the caller resets ended envs with
``reset(options={"reset_mask": mask})``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from rockroll.sandbox.sync import run_sync

from .core import GemEnv

__all__ = ["GemVectorEnv", "batch_infos", "make_vec"]


class _InfoBatcher(VectorEnv):
    """Just enough of a VectorEnv to reuse gymnasium's own info batching for ``n`` entries."""

    def __init__(self, n: int):
        self.num_envs = n


def batch_infos(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-env info dicts as one vector info dict (gymnasium's ``key``/``_key`` convention)."""
    batcher, out = _InfoBatcher(len(infos)), {}
    for i, info in enumerate(infos):
        out = batcher._add_info(out, info, i)
    return out


class GemVectorEnv(VectorEnv):
    """``num_envs`` GEM envs behind the gymnasium vector API; see the module docstring."""

    def __init__(self, envs: Sequence[GemEnv], *, autoreset: bool = True):
        if not envs:
            raise ValueError("a vector env needs at least one env")
        self.envs = list(envs)
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = gymnasium.spaces.Tuple([first.observation_space] * self.num_envs)
        self.action_space = gymnasium.spaces.Tuple([first.action_space] * self.num_envs)
        self.autoreset = bool(autoreset)
        mode = AutoresetMode.NEXT_STEP if self.autoreset else AutoresetMode.DISABLED
        self.metadata = {**first.metadata, "autoreset_mode": mode}
        self.render_mode = first.render_mode
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)  # needs an autoreset at its next step
        # Envs with an async core run concurrently; the rest are stepped in turn.
        self._concurrent = any(hasattr(env, "astep") for env in self.envs)

    # ---- running calls on every selected env ------------------------------------------------
    def _call_all(self, calls: list[tuple[GemEnv, str, tuple, dict]]) -> list[Any]:
        """Run ``getattr(env, name)(*args, **kwargs)`` for each call: sandbox envs together
        on the engine loop (their ``a``-prefixed twins), others one after another."""
        if not self._concurrent:
            return [getattr(env, name)(*args, **kwargs) for env, name, args, kwargs in calls]
        return run_sync(self._gather(calls))

    @staticmethod
    async def _gather(calls: list[tuple[GemEnv, str, tuple, dict]]) -> list[Any]:
        async def one(env: GemEnv, name: str, args: tuple, kwargs: dict) -> Any:
            if hasattr(env, "a" + name):
                return await getattr(env, "a" + name)(*args, **kwargs)
            return getattr(env, name)(*args, **kwargs)

        results = await asyncio.gather(*(one(*call) for call in calls), return_exceptions=True)
        # Every env finished its call before a failure propagates, so no env is left mid-step.
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    # ---- gymnasium vector API ------------------------------------------------------------------
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset the envs (all, or those in ``options["reset_mask"]``, a bool array).

        ``seed``: None, an int (env ``i`` gets ``seed + i``) or one seed per env.
        ``options``: one dict for every env, or a sequence of per-env dicts (e.g. a
        ``task_id`` each). Returns the observations of the envs reset, in env order, and
        their batched infos.
        """
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        per_env = list(options) if isinstance(options, (list, tuple)) else [dict(options or {})] * self.num_envs
        if len(seeds) != self.num_envs or len(per_env) != self.num_envs:
            raise ValueError(f"seed and options lists must have one entry per env ({self.num_envs})")
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if isinstance(options, dict) and "reset_mask" in options:
            mask = np.asarray(options["reset_mask"], dtype=np.bool_)
            per_env = [{k: v for k, v in options.items() if k != "reset_mask"}] * self.num_envs
        indices = [i for i in range(self.num_envs) if mask[i]]
        results = self._call_all(
            [(self.envs[i], "reset", (), {"seed": seeds[i], "options": per_env[i]}) for i in indices]
        )
        self._ended[indices] = False
        return tuple(obs for obs, _ in results), batch_infos([info for _, info in results])

    def step_some(
        self, indices: Sequence[int], actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step only the envs at ``indices`` (distinct), with ``actions[k]`` for env
        ``indices[k]``; results come back for those envs, in that order."""
        indices = [int(i) for i in indices]
        if len(set(indices)) != len(indices) or len(actions) != len(indices):
            raise ValueError("step_some needs distinct indices and one action per index")
        calls = [
            (self.envs[i], "reset", (), {}) if self.autoreset and self._ended[i] else (self.envs[i], "step", (a,), {})
            for i, a in zip(indices, actions)
        ]
        results = self._call_all(calls)
        obs, rewards, terms, truncs, infos = [], [], [], [], []
        for (_, name, _, _), result in zip(calls, results):
            if name == "reset":  # NEXT_STEP autoreset: the action was ignored
                result = (result[0], 0.0, False, False, result[1])
            obs.append(result[0])
            rewards.append(result[1])
            terms.append(result[2])
            truncs.append(result[3])
            infos.append(result[4])
        terms_a, truncs_a = np.array(terms, dtype=np.bool_), np.array(truncs, dtype=np.bool_)
        self._ended[indices] = terms_a | truncs_a
        return tuple(obs), np.array(rewards, dtype=np.float64), terms_a, truncs_a, batch_infos(infos)

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env (``actions[i]`` for env ``i``)."""
        return self.step_some(range(self.num_envs), actions)

    def render(self) -> tuple[str | None, ...]:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        self._call_all([(env, "close", (), {}) for env in self.envs])


def make_vec(env_id: str, num_envs: int, *, autoreset: bool = True, **kwargs: Any) -> GemVectorEnv:
    """``num_envs`` envs of ``env_id`` (any id form of :func:`rockroll.gem.factory.make_env`,
    ``gem:`` ids included; made with ``kwargs``) as one :class:`GemVectorEnv`.

    Sandbox envs share one warm pool, grown to ``num_envs`` so that every autoreset finds a
    ready sandbox.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    from .factory import make_env

    envs = [make_env(env_id, **kwargs) for _ in range(num_envs)]
    for env in envs:
        if hasattr(env, "pool_size"):
            env.pool_size = max(env.pool_size, num_envs)
    return GemVectorEnv(envs, autoreset=autoreset)
