"""gem-llm's environments in rockroll: ``gem:<id>`` for any id of gem-llm's registry.

`gem-llm <https://github.com/axon-rl/gem>`_ ("A Gym for Generalist LLMs", top-level package
``gem``) has its own ``Env`` base: ``reset(seed=None) -> (obs, info)`` (no ``options``),
``step(action) -> (obs, reward, terminated, truncated, info)``, answers in ``\\boxed{}``,
tools added by wrapping an env in its ``ToolEnvWrapper``. :class:`GemLLMEnv` is the one
adapter that puts such an env behind rockroll's :class:`~rockroll.gem.core.GemEnv` contract,
so the trainer, the vector env and evaluation use it like any ``rock/`` env:

- ``reset(seed, options)``: gem-llm's reset takes only a seed, so the adapter passes one: drawn
  from its own ``np_random`` (seeded by ``seed``), or derived from ``options["task_id"]`` alone
  (same task id, same episode: a GRPO group plays one task). gem-llm seeds Python's and NumPy's
  *global* generators in ``reset``, so resets hold one process-wide lock (with env threads, two
  resets must not interleave their seeding and their draws). ``save_state`` raises
  ``NotImplementedError``: gem-llm envs cannot resume a saved episode (no curriculum).
- ``step``: gem-llm's own rewards, observations and ``info`` pass through; ``info`` gains
  ``turn`` and ``success`` (terminated with reward >= 1.0, gem-llm's success reward, unless the
  env says otherwise). gem-llm marks a malformed answer only by its reward and observation
  (no ``info["format_error"]``). gem-llm ends most episodes with both flags set; here an
  episode is *terminated* when gem-llm says so, and *truncated* only when gem-llm truncates
  without terminating.
- ``wrappers``: names of gem-llm's ``WRAPPER_FACTORY`` (``"python_tool"``, ...) applied in
  order, and their sandboxed twins (``"sandbox_python_tool"``, ...: the same wrapper with
  :class:`~rockroll.gem.gemllm_tool.SandboxPythonTool`, the model's code runs in a rockroll
  sandbox instead of on the host).

Families that need what is not there fail at construction with :class:`GemLLMUnavailable`,
saying what is missing: dataset envs (``math:``, ``code:``, ``qa:``, ``logic:``, ``eval:``)
without the ``datasets`` package or with the Hugging Face Hub offline, search tools without
a search server (``SEARCH_URL``), entry points whose module cannot be imported.

The other direction (rockroll's envs under ``gem.make``) is :mod:`rockroll.gem.gemllm_plugin`,
registered by :mod:`rockroll.registry.gemllm`.

gem-llm is imported through :func:`rockroll.gem.gemllm_load.load_gem_llm` (past a source
checkout's gem/ folder on ``sys.path``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from gymnasium.error import NameNotFound

from .core import GemEnv
from .gemllm_load import GemLLMUnavailable, is_gem_llm_env, load_gem_llm

__all__ = ["GEM_PREFIX", "GemLLMEnv", "GemLLMUnavailable", "check_gem_llm_id", "gem_llm_ids", "unavailable_reason"]

GEM_PREFIX = "gem:"  # rockroll's id of gem-llm's "game:GuessTheNumber-v0-easy" is "gem:game:GuessTheNumber-v0-easy"
SUCCESS_REWARD = 1.0  # gem-llm's LanguageGameReward.success_reward; a solved rg/math task also scores 1.0
_RESET_LOCK = threading.RLock()  # gem-llm's reset seeds the process-global RNGs


# ------------------------------------------------------------------------------ registry and families
def _registry() -> dict[str, Any]:
    load_gem_llm()
    from gem.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def unavailable_reason(gem_id: str, kwargs: dict[str, Any] | None = None) -> str | None:
    """Why gem-llm's ``gem_id`` (made with ``kwargs`` over its registered ones) cannot run
    here, or None. Looks only at what is installed and configured: never touches the network."""
    spec = _registry()[gem_id]
    kw = {**spec.kwargs, **(kwargs or {})}
    dataset = kw.get("dataset_name")
    if dataset is not None and not Path(str(dataset)).exists():
        if importlib.util.find_spec("datasets") is None:
            return (f"gem-llm's {gem_id} loads the dataset {dataset!r} from the Hugging Face Hub with the "
                    "`datasets` package, which is not installed (pip install datasets; the Hub must be reachable)")
        if _hub_offline():
            return (f"gem-llm's {gem_id} loads the dataset {dataset!r} from the Hugging Face Hub, and the Hub "
                    "is offline here (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE); pass dataset_name=<a local dataset folder>")
    entry = spec.entry_point
    if isinstance(entry, str):
        module = entry.split(":")[0]
        try:
            importlib.import_module(module)
        except ImportError as e:
            return f"gem-llm's {gem_id} cannot be imported ({module}): {e}"
    return None


def check_gem_llm_id(gem_id: str) -> None:
    """Raise gymnasium's ``NameNotFound``, with the closest ids, if ``gem_id`` is not in
    gem-llm's registry (``GemLLMUnavailable`` if gem-llm is not installed)."""
    registry = _registry()
    if gem_id not in registry:
        close = difflib.get_close_matches(gem_id, list(registry), n=3)
        raise NameNotFound(f"{gem_id!r} is not an id of gem-llm's registry (gem.envs.registration.ENV_REGISTRY, "
                           f"{len(registry)} ids; `rockroll envs --gem-llm` lists them)"
                           + (f"; close: {', '.join(close)}" if close else ""))


def gem_llm_ids() -> list[tuple[str, str | None]]:
    """Every id of gem-llm's registry as ``(rockroll id, why it cannot run here or None)``."""
    return [(GEM_PREFIX + gem_id, unavailable_reason(gem_id)) for gem_id in sorted(_registry())]


def _wrapper(name: str) -> Callable[[Any], Any]:
    """gem-llm's ``WRAPPER_FACTORY[name]``, or for ``sandbox_<name>`` that python-tool wrapper
    with each env getting its own :class:`SandboxPythonTool` (one sandbox per env)."""
    from gem.wrappers.wrapper_factory import WRAPPER_FACTORY

    base_name = name.removeprefix("sandbox_")
    if base_name not in WRAPPER_FACTORY or (name != base_name and "python_tool" not in base_name):
        known = sorted(WRAPPER_FACTORY) + sorted("sandbox_" + n for n in WRAPPER_FACTORY if "python_tool" in n)
        raise ValueError(f"wrappers: unknown wrapper {name!r}; gem-llm's WRAPPER_FACTORY and rockroll have {known}")
    factory = WRAPPER_FACTORY[base_name]
    if "search_tool" in base_name and not os.environ.get("SEARCH_URL"):
        raise GemLLMUnavailable(f"gem-llm's {base_name} needs a search server (its SearchTool posts to SEARCH_URL), "
                                "and SEARCH_URL is not set")
    if name == base_name:
        return factory
    from .gemllm_tool import SandboxPythonTool

    keywords = dict(factory.keywords)
    host_tool = keywords.pop("tools")[0]

    def wrap(env: Any) -> Any:
        tool = SandboxPythonTool(timeout=host_tool.timeout, keep_error_last_line=host_tool.keep_error_last_line)
        return factory.func(env, tools=[tool], **keywords)
    return wrap


# ------------------------------------------------------------------------------------------ adapter
def guess_the_number_expert(game: Any) -> str:
    """Bisection on gem-llm's GuessTheNumber: the middle of the range its hints have left
    (every earlier guess below the number made it "higher", above it "lower")."""
    lo, hi, target = game.min_number, game.max_number, game.game_number
    for guess in game.previous_guesses:
        if guess < target:
            lo = max(lo, guess + 1)
        elif guess > target:
            hi = min(hi, guess - 1)
    return f"\\boxed{{{(lo + hi) // 2}}}"


#: Experts of gem-llm games, by the game class's name: ``fn(game) -> reply``.
EXPERTS: dict[str, Callable[[Any], str]] = {"GuessTheNumberEnv": guess_the_number_expert}


class GemLLMEnv(GemEnv):
    """A gem-llm env behind rockroll's :class:`GemEnv` contract (see the module docstring).

    ``env``: an id of gem-llm's registry (``"game:GuessTheNumber-v0-easy"``, ``kwargs`` override
    its registered ones), a gem-llm ``Env`` class (called with ``kwargs``) or instance.
    ``wrappers``: gem-llm wrapper names (a comma-separated string or a list), applied in order.
    ``format_penalty`` is the reward of a non-text action; gem-llm grades its text itself.
    No turn limit of its own: the gem-llm env ends its episodes (``max_turns``, if any, is its kwarg).
    """

    def __init__(self, env: Any, *, wrappers: str | Sequence[str] = (), format_penalty: float = -0.1,
                 max_obs_chars: int = 16_384, render_mode: str | None = None, **kwargs: Any):
        super().__init__(max_turns=sys.maxsize, format_penalty=format_penalty, max_obs_chars=max_obs_chars,
                         render_mode=render_mode)
        load_gem_llm()
        if isinstance(env, str):
            self.gem_id = env
            self.env = self._make(env, kwargs)
        elif isinstance(env, type) and is_gem_llm_env(env):
            self.gem_id = f"{env.__module__}:{env.__qualname__}"
            self.env = env(**kwargs)
        elif is_gem_llm_env(env):
            if kwargs:
                raise TypeError(f"kwargs {sorted(kwargs)} given with an env that is already made")
            self.gem_id = getattr(env, "env_id", type(env).__name__)
            self.env = env
        else:
            raise TypeError(f"env must be a gem-llm id, Env class or Env, got {env!r}")
        names = [w.strip() for w in wrappers.split(",")] if isinstance(wrappers, str) else list(wrappers)
        for name in filter(None, names):
            self.env = _wrapper(name)(self.env)
        self._inner_truncated = False

    @staticmethod
    def _make(gem_id: str, kwargs: dict[str, Any]) -> Any:
        check_gem_llm_id(gem_id)
        reason = unavailable_reason(gem_id, kwargs)
        if reason:
            raise GemLLMUnavailable(reason)
        import gem

        return gem.make(gem_id, **kwargs)

    def _reset(self, task_id: Any | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        seed = int(self._task_rng(task_id).integers(2**31))
        self._inner_truncated = False
        with _RESET_LOCK:
            obs, info = self.env.reset(seed=seed)
        return obs, dict(info)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info.setdefault("success", bool(terminated) and float(reward) >= SUCCESS_REWARD)
        self._inner_truncated = bool(truncated) and not terminated
        return obs, float(reward), bool(terminated), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self._inner_truncated and not terminated:  # gem-llm's own time limit
            truncated, self._done = True, True
        return obs, reward, terminated, truncated, info

    def expert_action(self) -> str:
        """The expert's reply for the games that have one (:data:`EXPERTS`, by the gem-llm
        class's name): the trainer's SFT data. ``TypeError`` for a game without an expert,
        ``ValueError`` once the episode is over."""
        inner = getattr(self.env, "unwrapped", self.env)
        expert = EXPERTS.get(type(inner).__name__)
        if expert is None:
            raise TypeError(f"gem-llm env {self.gem_id!r} has no expert (known: {', '.join(sorted(EXPERTS))})")
        if self._done:
            raise ValueError("no expert move: the episode is over")
        return expert(inner)

    def close(self) -> None:
        for tool in getattr(self.env, "tools", ()):  # a ToolEnvWrapper's tools (a sandboxed one holds a sandbox)
            if hasattr(tool, "close"):
                tool.close()
        super().close()

    def __repr__(self) -> str:
        return f"GemLLMEnv({self.gem_id!r})"
