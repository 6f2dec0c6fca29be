"""TRL's ``environment_factory`` on rockroll envs: the model plays an episode by tool calls that
TRL's own loop parses, runs and renders in its chat template's tool format.

    from trl import GRPOConfig, GRPOTrainer
    from rockroll.integrations.trl_tools import ActEnv, tool_datasets

    train, held_out = tool_datasets("rock/FrozenLake-v0", list(range(80)), held_out=16)
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=train, eval_dataset=held_out,
                          environment_factory=ActEnv)

This is the other way in beside :mod:`rockroll.integrations.trl`'s ``rollout_func``, for models
that call tools (TRL needs a tokenizer whose chat template renders tools and whose replies it
can parse: Qwen2.5/3, Llama 3.x, ...). :class:`ActEnv` plays any rockroll env with one tool,
``act(action)``: the action is the text the env's ``step`` takes ("Down", "\\boxed{12}"), its
result the env's next observation. The episode's return is ``get_reward``'s; a model that stops
calling the tool before the episode ends is scored on the steps it took.

Each row's ``env_spec`` (:func:`tool_dataset`) names the env, its kwargs, task and seed;
``reset(**row)`` starts that episode. TRL pools env instances and resets them across batches:
an instance keeps its rockroll env while the row's id and kwargs stay the same (a sandbox env
gives its sandbox back to the warm pool and acquires a fresh one at each reset).

An infrastructure failure (``info["infra_error"]``, the env's ``InfraError``, a
``SandboxError``) makes ``get_reward`` return None: TRL leaves the rollout out of its group's
statistics (unscorable), not a zero. The tool call that met it raises, so TRL shows the model
an error. A tool called after its episode ended is told so and changes nothing.

TRL never closes its envs: each instance closes its env when it is collected, and rockroll's
engine reaps every sandbox at exit (and after a kill -9, at the next start).
"""

from __future__ import annotations

import json
import weakref
from typing import Any

from .episodes import EnvSpec, InfraFailure, held_out_split
from .trl import _INFRA, SPEC_KEY, datasets

__all__ = ["ActEnv", "tool_dataset", "tool_datasets"]

OVER = "The episode is over: answer without a tool call."


def tool_dataset(env_id: str, task_ids: list[Any], *, env_kwargs: dict[str, Any] | None = None,
                 seed: int | None = None, system_prompt: str | None = None) -> Any:
    """A ``datasets.Dataset`` with a row per task id for ``environment_factory``: ``env_spec``
    (JSON, :meth:`EnvSpec.to_row`) and ``prompt``, the optional system prompt then an empty user
    turn, which TRL fills with what ``reset`` returns. No env is started here."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return datasets.Dataset.from_list([
        {"prompt": [*system, {"role": "user", "content": ""}],
         SPEC_KEY: json.dumps(EnvSpec(env_id, dict(env_kwargs or {}), task_id, seed).to_row())}
        for task_id in task_ids])


def tool_datasets(env_id: str, task_ids: list[Any], held_out: int, **kwargs: Any) -> tuple[Any, Any]:
    """``(train, eval)`` of :func:`tool_dataset`, the last ``held_out`` task ids
    (:func:`~rockroll.integrations.episodes.held_out_split`) kept for evaluation only."""
    train_ids, eval_ids = held_out_split(task_ids, held_out)
    return tool_dataset(env_id, train_ids, **kwargs), tool_dataset(env_id, eval_ids, **kwargs)


def _close(env: Any) -> None:
    env.close()


class _Episode:
    """What a tool env keeps: the row's env, the running episode's return, and whether it
    ended or failed. Every name here is private: TRL makes each public method a tool."""

    def __init__(self):
        self._env: Any = None
        self._key: str | None = None
        self._finalizer: Any = None
        self._spec: EnvSpec | None = None
        self._return, self._done, self._failed = 0.0, True, None
        #: each step's (action, observation, reward) of the running episode, for callers to read
        self.steps: list[tuple[str, str, float]] = []

    def _start(self, blob: str | None) -> str | None:
        """Reset to the row's episode; its first observation, or None when the env failed."""
        if not blob:
            raise ValueError(f"the row has no {SPEC_KEY}: build the dataset with rockroll.integrations.trl_tools."
                             "tool_dataset")
        spec = EnvSpec.from_row(json.loads(blob))
        key = json.dumps([spec.env_id, spec.kwargs], sort_keys=True, default=str)
        self._return, self._done, self._failed, self.steps = 0.0, False, None, []
        self._spec = spec
        try:
            if key != self._key:
                self._drop_env()
                self._env = spec.make()
                self._finalizer = weakref.finalize(self, _close, self._env)
                self._key = key
            obs, _ = spec.reset(self._env)
        except _INFRA as e:
            self._fail(e)
            return None
        return obs

    def _step(self, text: str) -> str:
        if self._failed is not None:
            raise InfraFailure(self._spec.env_id, f"the episode had failed: {self._failed}")
        if self._done:
            return OVER
        try:
            obs, reward, terminated, truncated, info = self._env.step(text)
        except _INFRA as e:
            self._fail(e)
            raise InfraFailure(self._spec.env_id, str(e)) from e
        if info.get("infra_error"):
            self._fail(info["infra_error"])
            raise InfraFailure(self._spec.env_id, str(info["infra_error"]))
        self._return += float(reward)
        self._done = bool(terminated or truncated)
        self.steps.append((text, obs, float(reward)))
        return obs + ("\n" + OVER if self._done else "")

    def _fail(self, error: Any) -> None:
        self._failed, self._done = str(error), True

    def _drop_env(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the env now, once
        self._env = self._finalizer = self._key = None

    def _reward(self) -> float | None:
        return None if self._failed is not None else self._return


class ActEnv(_Episode):
    """Any rockroll env as a TRL tool env: one tool, :meth:`act` (see the module docstring)."""

    def reset(self, **row: Any) -> str:
        obs = self._start(row.get(SPEC_KEY))
        return obs if obs is not None else f"The environment failed to start: {self._failed}"

    def act(self, action: str) -> str:
        """Take your next action in the environment.

        Args:
            action: Your move or answer, written as the environment asks for it.

        Returns:
            What the environment says next.
        """
        return self._step(action)

    def get_reward(self) -> float | None:
        """The episode's return so far (every step's reward), None after an infrastructure failure."""
        return self._reward()
