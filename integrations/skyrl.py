"""SkyRL on rockroll's envs: every rockroll id as a ``skyrl_gym`` text env.

SkyRL's generator (skyrl-train, ``skyrl/train/generators/skyrl_gym_generator.py``) makes one
env per trajectory from a dataset row: ``skyrl_gym.make(row["env_class"], env_config=...,
extras=<every other column of the row>)`` with ``extras["max_turns"]`` set to its
``generator.max_turns``; then ``env.init(row["prompt"])``, ``env.step(reply)`` until ``done``,
``env.get_metrics()`` and ``env.close()``. This module supplies each piece:

- :class:`RockrollTextEnv` -- a ``BaseTextEnv`` driving any rockroll env (``rock/...``, a hub
  env, ``gem:...``, ``module:Class``). The env, its kwargs, task and seed come from the row's
  ``rockroll`` column (:meth:`~rockroll.integrations.episodes.EnvSpec.to_row`, as JSON) and from
  what :func:`register` bound to the id.
- :func:`register` / :func:`register_all` -- skyrl_gym ids for rockroll ids. The skyrl id is
  the rockroll id itself (``env_class: rock/Math-v0``): skyrl_gym's registry is a plain dict
  that takes any string, SkyRL's own ids have no ``/`` so nothing collides, and one id then
  names the env in ``gymnasium.make``, rockroll's configs and SkyRL's dataset alike.
- :func:`dataset_rows` / :func:`write_dataset` -- the train and held-out rows
  (:func:`~rockroll.integrations.episodes.held_out_split`) in SkyRL's dataset format.

An infrastructure failure (``info["infra_error"]``) must not become a zero reward. SkyRL has no
path to drop one sample: the generator scores whatever ``step`` returns, and an exception from
``step`` fails the whole generation batch. So by default (``on_infra_error="raise"``) the env
closes itself and raises :class:`~rockroll.integrations.episodes.InfraFailure` -- loud, never
learnt from. ``on_infra_error="mark"`` ends the episode instead (reward 0.0, ``done``,
``metadata["infra_error"]``) and reports ``infra_error: 1.0`` in :meth:`get_metrics`, which
SkyRL logs per env class and hands a generator subclass as ``TrajectoryOutput.env_metrics``
(where ``_post_process_agent_loop_output`` can zero the loss mask): for runs that would rather
drop than stop.

``skyrl_gym`` is imported when the env class is first used (``pip install 'rockroll[skyrl]'``);
the dataset helpers need only pyarrow for parquet.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .episodes import EnvSpec, InfraFailure, held_out_split, require, write_rows

__all__ = ["ROW_KEY", "RockrollTextEnv", "dataset_rows", "register", "register_all", "write_dataset"]

#: The dataset column (so the ``extras`` key) holding the row's :class:`EnvSpec` as JSON text:
#: text, because parquet would turn per-row kwargs dicts into one struct for all rows.
ROW_KEY = "rockroll"
#: The string entry point skyrl_gym loads (JSON-serialisable, unlike a callable).
ENTRY_POINT = "rockroll.integrations.skyrl:RockrollTextEnv"
#: The prompt text of a row: a placeholder, :meth:`RockrollTextEnv.init` puts the env's first
#: observation in its place (the env, not the dataset, knows the task).
PLACEHOLDER = "(the rockroll env writes this turn's prompt)"
_ON_INFRA_ERROR = ("raise", "mark")


def _setting(config: Any, key: str, default: Any = None) -> Any:
    """``key`` of SkyRL's per-env config: a dict, an OmegaConf node or a dataclass, or None."""
    if config is None:
        return default
    if isinstance(config, Mapping) or hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


def _spec_of(extras: Mapping[str, Any], env_id: str | None, env_kwargs: Mapping[str, Any] | None) -> EnvSpec:
    """The episode a trajectory plays: the row's ``rockroll`` entry over what the id was
    registered with. A row naming another env than its ``env_class`` is a dataset bug."""
    row = extras.get(ROW_KEY)
    if isinstance(row, str):
        row = json.loads(row)
    if not row:
        if env_id is None:
            raise ValueError(f"no env: the row has no {ROW_KEY!r} entry and the skyrl id was registered without one")
        return EnvSpec(env_id, dict(env_kwargs or {}))
    spec = EnvSpec.from_row(row)
    if env_id is not None and spec.env_id != env_id:
        raise ValueError(f"the row's {ROW_KEY} entry names {spec.env_id!r} but its env_class is {env_id!r}")
    spec.kwargs = {**(env_kwargs or {}), **spec.kwargs}
    return spec


@functools.cache
def _text_env_class() -> type:
    """RockrollTextEnv, defined on first use: its base class is skyrl_gym's."""
    base_text_env = require("skyrl_gym.envs.base_text_env", "skyrl")

    class RockrollTextEnv(base_text_env.BaseTextEnv):
        """A rockroll env as a skyrl_gym ``BaseTextEnv``.

        ``RockrollTextEnv(env_config, extras, *, env_id, env_kwargs, on_infra_error)``: the first
        two are what SkyRL's generator passes every env; the keyword ones are what
        :func:`register` binds to a skyrl id (``env_config`` may override ``on_infra_error``).

        - ``init(prompt)`` resets the env on the row's task and seed and returns ``prompt`` with
          its last user message replaced by the env's first observation (system and few-shot
          messages before it are kept).
        - ``step(reply)`` steps the env once: ``observations`` is the next observation as one
          user message (``[]`` once ``done``, which SkyRL would cut anyway), ``reward`` the
          env's (a malformed reply gets the env's format penalty), ``done`` the env's
          ``terminated or truncated`` or SkyRL's ``max_turns`` reached (SkyRL's loop stops only
          on ``done``), ``metadata`` the env's ``info`` plus ``terminated`` / ``truncated``.
        - an infrastructure failure: see the module docstring.
        - ``close()`` closes the env (a sandbox env gives its sandbox back); idempotent.
        """

        def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *,
                     env_id: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
                     on_infra_error: str = "raise"):
            super().__init__()
            extras = dict(extras or {})
            self.on_infra_error = _setting(env_config, "on_infra_error", on_infra_error)
            if self.on_infra_error not in _ON_INFRA_ERROR:
                raise ValueError(f"on_infra_error must be one of {_ON_INFRA_ERROR}, got {self.on_infra_error!r}")
            # not `self.spec`: skyrl_gym.make sets that to its own EnvSpec
            self.episode = _spec_of(extras, env_id, env_kwargs)
            # SkyRL's generator.max_turns; the env's own max_turns may end it sooner
            self.max_turns = int(extras["max_turns"]) if extras.get("max_turns") else None
            self.env: Any = self.episode.make()
            self.infra_error: str | None = None
            self._closed = False
            self._format_errors = 0
            self._metrics: dict[str, float] = {}

        # ---- SkyRL's three calls -------------------------------------------------------
        def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
            try:
                obs, info = self.episode.reset(self.env)
            except InfraFailure as e:
                self._infra(e.message)  # raises, or records it for the first step to report
                obs, info = f"Environment error: {e.message}", {"infra_error": e.message}
            messages = [dict(m) for m in prompt or []]
            last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
            if last_user is not None:
                messages = messages[:last_user]
            return messages + [{"role": "user", "content": obs}], dict(info)

        def step(self, action: str) -> dict[str, Any]:
            if self.infra_error is not None:  # reset failed in "mark" mode: nothing was played
                return self._marked({"infra_error": self.infra_error})
            self.turns += 1
            obs, reward, terminated, truncated, info = self.env.step(action)
            if info.get("infra_error"):
                self._infra(str(info["infra_error"]))
                return self._marked(dict(info))
            by_skyrl = self.max_turns is not None and self.turns >= self.max_turns
            done = bool(terminated or truncated or by_skyrl)
            self._metrics = {"turns": float(self.turns), "infra_error": 0.0}
            if "success" in info:
                self._metrics["success"] = float(bool(info["success"]))
            self._format_errors += "format_error" in info
            self._metrics["format_errors"] = float(self._format_errors)
            return base_text_env.BaseTextEnvStepOutput(
                observations=[] if done else [{"role": "user", "content": obs}],
                reward=float(reward), done=done, postprocessed_action=None,
                metadata={**info, "terminated": bool(terminated), "truncated": bool(truncated or (by_skyrl and not terminated))})

        def close(self) -> None:
            if not self._closed:
                self._closed = True
                self.env.close()

        def get_metrics(self) -> dict[str, Any]:
            return dict(self._metrics)

        # ---- infrastructure failures -----------------------------------------------------
        def _infra(self, message: str) -> None:
            self.infra_error = message
            if self.on_infra_error == "raise":
                # SkyRL closes an env only after a finished episode: give the sandbox back first
                self.close()
                raise InfraFailure(self.episode.env_id, message)

        def _marked(self, metadata: dict[str, Any]) -> dict[str, Any]:
            self._metrics = {"turns": float(self.turns), "infra_error": 1.0}
            return base_text_env.BaseTextEnvStepOutput(
                observations=[], reward=0.0, done=True, postprocessed_action=None,
                metadata={**metadata, "infra_error": self.infra_error, "dropped": True})

    RockrollTextEnv.__module__, RockrollTextEnv.__qualname__ = __name__, "RockrollTextEnv"
    return RockrollTextEnv


def __getattr__(name: str) -> Any:
    # `RockrollTextEnv` is built on skyrl_gym's class, so it exists once skyrl_gym imports; the
    # module (its dataset helpers) imports without it. skyrl_gym's loader reaches it here.
    if name == "RockrollTextEnv":
        return _text_env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- registration ----------------------------------------------------------------------
def register(env_id: str, *, skyrl_id: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
             on_infra_error: str = "raise") -> str:
    """Make rockroll's ``env_id`` ``skyrl_gym.make``-able as ``skyrl_id`` (default: ``env_id``);
    returns the skyrl id. Registering an id this module registered before replaces it; an id
    someone else registered raises skyrl_gym's ``RegistrationError``. Call it in the process
    that runs SkyRL's generator (SkyRL's examples do so in their ``skyrl_entrypoint`` task)."""
    if on_infra_error not in _ON_INFRA_ERROR:
        raise ValueError(f"on_infra_error must be one of {_ON_INFRA_ERROR}, got {on_infra_error!r}")
    skyrl_gym = require("skyrl_gym", "skyrl")
    skyrl_id = skyrl_id or env_id
    existing = skyrl_gym.registry.get(skyrl_id)
    if existing is not None and existing.entry_point == ENTRY_POINT:
        skyrl_gym.envs.registration.deregister(skyrl_id)
    skyrl_gym.register(id=skyrl_id, entry_point=ENTRY_POINT,
                       kwargs={"env_id": env_id, "env_kwargs": dict(env_kwargs or {}),
                               "on_infra_error": on_infra_error})
    return skyrl_id


def register_all(*, hubs: Sequence[str] = (), on_infra_error: str = "raise") -> list[str]:
    """Register every rockroll env id as a skyrl id of the same name: the built-in ``rock/``
    ids, the envs of the hubs already registered (``import rockroll`` registers the default
    one) and of ``hubs`` (URLs, registered now); image-only hub packages are no envs and are
    left out. Returns the skyrl ids, sorted."""
    import gymnasium

    from rockroll.registry.hub import is_base_image
    from rockroll.registry.lookup import ensure_hub

    for url in hubs:
        ensure_hub(url)
    ids = sorted(i for i in gymnasium.registry if i.startswith("rock/") and not is_base_image(i))
    return [register(i, on_infra_error=on_infra_error) for i in ids]


# ---- datasets --------------------------------------------------------------------------
def dataset_rows(env_id: str, task_ids: Sequence[Any], *, held_out: int, skyrl_id: str | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, seed: int | None = None,
                 system_prompt: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train_rows, held_out_rows)`` of SkyRL's dataset format, one row per task id, the last
    ``held_out`` ids kept for evaluation (:func:`held_out_split`). Each row has ``prompt``
    (the system prompt if any, then a placeholder user turn :meth:`RockrollTextEnv.init`
    replaces), ``env_class`` (``skyrl_id``, default ``env_id``), ``rockroll`` (the
    :class:`EnvSpec` as JSON), ``data_source`` and ``extra_info`` (split and index): all but
    the first two reach the env as ``extras``."""
    train, test = held_out_split(list(task_ids), held_out)

    def rows(ids: Iterable[Any], split: str) -> list[dict[str, Any]]:
        out = []
        for index, task_id in enumerate(ids):
            prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
            spec = EnvSpec(env_id, dict(env_kwargs or {}), task_id, seed)
            out.append({"prompt": prompt + [{"role": "user", "content": PLACEHOLDER}],
                        "env_class": skyrl_id or env_id, ROW_KEY: json.dumps(spec.to_row()),
                        "data_source": env_id, "extra_info": {"split": split, "index": index}})
        return out

    return rows(train, "train"), rows(test, "test")


def write_dataset(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` where SkyRL's ``data.train_data`` / ``data.val_data`` can read them:
    ``.parquet`` (needs pyarrow, which SkyRL's ``datasets`` brings) or ``.jsonl``."""
    return write_rows(rows, path, "skyrl")
