"""GEM core: the text action/observation space and the abstract text environment.

A GEM environment is a :class:`gymnasium.Env` whose observations and actions are strings:
the observation is what the model reads, the action is what the model wrote. Everything a
trainer needs to know about an episode is in the 5-tuple of :meth:`GemEnv.step` and in
``info`` -- malformed actions never raise, and infrastructure failures are flagged instead
of being disguised as a zero reward.
"""

from __future__ import annotations

import hashlib
import string
from typing import Any, ClassVar, SupportsFloat

import gymnasium
import numpy as np
from gymnasium.error import ResetNeeded

from .actions import format_error_message

__all__ = [
    "STATE_FORMAT",
    "GemEnv",
    "InfraError",
    "TextSpace",
    "TokenReply",
    "rng_from_json",
    "rng_to_json",
    "truncate_observation",
]

STATE_FORMAT = "rockroll.gem.state/v1"

# Letters and digits only, starting with a letter: one "word" that no parser in
# rockroll.gem reads as an action (no fences, tags, braces, separators, numbers or
# direction words), so a sampled action is always a harmless format error.
_SAMPLE_FIRST = string.ascii_letters
_SAMPLE_REST = string.ascii_letters + string.digits


class TextSpace(gymnasium.spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters.

    :meth:`sample` draws from this space's ``np_random`` a random alphanumeric word of 8 to
    32 characters (starting with a letter). Such a word is deliberately *unparseable* by
    every GEM env: stepping with it yields a format-error observation, never a real command.
    """

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        if mask is not None or probability is not None:
            raise NotImplementedError("TextSpace.sample does not support mask or probability")
        rng = self.np_random
        length = min(self.max_length, int(rng.integers(8, 33)))
        chars = [_SAMPLE_FIRST[int(rng.integers(len(_SAMPLE_FIRST)))]]
        chars += [_SAMPLE_REST[int(i)] for i in rng.integers(len(_SAMPLE_REST), size=length - 1)]
        return "".join(chars)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[Any]) -> list[str]:
        return list(sample_n)

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


class InfraError(Exception):
    """Raised inside :meth:`GemEnv._step` when the environment itself failed (not the model).

    :meth:`GemEnv.step` turns it into a terminal step flagged with ``info["infra_error"]``.
    """


class TokenReply(str):
    """A reply (the text ``step`` takes) that also carries the tokens it was generated as: the
    prompt's and the completion's ids, their log-probs and the policy version. A trainer steps
    with it; an env that answers a model call with it (``rock/Agent-v0``) gives the call's
    record exactly those tokens. Any other env sees a plain ``str``."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int

    def __new__(cls, text: str, *, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float],
                version: int) -> "TokenReply":
        reply = super().__new__(cls, text)
        reply.prompt_ids, reply.completion_ids = list(prompt_ids), list(completion_ids)
        reply.logprobs, reply.version = list(logprobs), version
        return reply

    def __getnewargs_ex__(self) -> tuple[tuple[str], dict]:  # pickle and deepcopy keep the tokens
        return (str(self),), {"prompt_ids": self.prompt_ids, "completion_ids": self.completion_ids,
                              "logprobs": self.logprobs, "version": self.version}


def truncate_observation(text: str, max_chars: int) -> str:
    """Return ``text`` cut to at most ``max_chars`` characters, keeping its head and tail.

    The middle is replaced by ``"\\n[... N characters truncated ...]\\n"`` so the model
    knows output was dropped (tests and errors usually matter at the start and the end).
    """
    if len(text) <= max_chars:
        return text
    marker = f"\n[... {len(text)} characters truncated ...]\n"
    keep = max_chars - len(marker)
    if keep < 2:
        return text[:max_chars]
    marker = f"\n[... {len(text) - keep} characters truncated ...]\n"  # never longer
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def rng_to_json(rng: np.random.Generator) -> dict[str, Any]:
    """The bit-generator state of ``rng`` as a JSON-serializable dict."""
    return dict(rng.bit_generator.state)


def rng_from_json(state: dict[str, Any]) -> np.random.Generator:
    """A generator that continues exactly where the one saved by :func:`rng_to_json` was."""
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)


class GemEnv(gymnasium.Env[str, str]):
    """A text environment: the agent writes a string, the environment answers with a string.

    Contract (every subclass keeps it; trainers and wrappers rely on it):

    - ``reset(seed=None, options=None) -> (observation, info)`` starts an episode. It seeds
      ``self.np_random`` via ``super().reset(seed=seed)``; every random choice of the
      episode (task generation, slippery moves, ...) is drawn from ``self.np_random`` so the
      same seed gives the same episode. ``options`` may hold:

      * ``"task_id"``: pick a specific task. Procedural envs derive the task from the id
        alone (same id -> same task, whatever the seed); dataset envs look it up.
      * ``"state"`` (or ``"snapshot"`` holding a dict from :meth:`save_state`): resume a
        saved episode; it continues exactly like the original, RNG included.

    - ``step(action) -> (observation, reward, terminated, truncated, info)``. A malformed
      action (unparseable text, or not even a ``str``) is *not* an exception: the
      observation is an error message listing the accepted formats, the reward is
      ``format_penalty`` and ``info["format_error"]`` holds the problem. ``truncated`` is
      True when ``max_turns`` turns were taken without termination. Observations longer than
      ``max_obs_chars`` are cut in the middle with a ``[... N characters truncated ...]``
      marker. ``info["turn"]`` (turns taken so far) is always present. When the
      environment itself fails (sandbox died, tool timed out at the infrastructure level),
      the step is terminal with reward 0.0 and ``info["infra_error"]`` set to a message --
      a trainer must drop such a sample rather than learn from the fake zero. (A failure
      inside ``reset`` likewise returns an error observation with ``info["infra_error"]``
      and an episode that cannot be stepped.) Stepping
      before ``reset`` or after the episode ended raises :class:`gymnasium.error.ResetNeeded`
      (a caller bug, not a model mistake).

    - ``render()`` with ``render_mode="ansi"`` returns a human-readable string (the board
      or the transcript); with ``render_mode=None`` it returns None.

    - ``save_state() -> dict`` captures the running episode as JSON-serializable data.

    Subclasses implement :meth:`_reset` and :meth:`_step`, and :meth:`_get_state` /
    :meth:`_set_state` for resumable episodes; they may override :meth:`_render_text`.
    Inside ``_step`` they build a malformed-action result with :meth:`_format_error`, and
    signal an infrastructure failure by raising one of ``infra_errors`` (``InfraError``;
    a tool env adds e.g. its sandbox's error class) or returning :meth:`_infra_failure`.
    ``render_fps`` in ``metadata`` only quiets gymnasium's checker; text has no frame rate.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    #: Exceptions from ``_reset``/``_step`` that mean "the environment failed", reported as
    #: ``info["infra_error"]``. Any other exception is a bug and propagates.
    infra_errors: ClassVar[tuple[type[BaseException], ...]] = (InfraError,)

    def __init__(
        self,
        *,
        max_turns: int = 30,
        format_penalty: float = -0.1,
        max_obs_chars: int = 16_384,
        render_mode: str | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = int(max_turns)
        self.format_penalty = float(format_penalty)
        self.max_obs_chars = int(max_obs_chars)
        self.render_mode = render_mode
        self.observation_space = TextSpace(max_length=self.max_obs_chars)
        self.action_space = TextSpace()
        self._turn = 0
        self._done = True
        self._started = False
        self._transcript: list[list[str]] = []  # [role, text] pairs; lists stay JSON-friendly

    # ---- subclass hooks -------------------------------------------------------------
    def _reset(self, task_id: Any | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Start a new episode; return the first observation and extra info."""
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one action; return ``(observation, reward, terminated, info)``."""
        raise NotImplementedError

    def _get_state(self) -> dict[str, Any]:
        """JSON-serializable episode state of the subclass (the RNG is saved by the base)."""
        raise NotImplementedError(f"{type(self).__name__} does not support save_state")

    def _set_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`_get_state`."""
        raise NotImplementedError(f"{type(self).__name__} does not support resuming")

    def _render_text(self) -> str:
        """The ansi rendering; by default the transcript of the episode."""
        return "\n\n".join(f"[{role}]\n{text}" for role, text in self._transcript)

    # ---- helpers for subclasses ------------------------------------------------------
    def _format_error(
        self, error: str, accepted: list[str], *, terminated: bool = False
    ) -> tuple[str, float, bool, dict[str, Any]]:
        """A ``_step`` result for a malformed action: an observation naming the problem and
        the ``accepted`` formats, reward ``format_penalty``, ``info["format_error"] = error``."""
        return format_error_message(accepted, error), self.format_penalty, terminated, {"format_error": error}

    def _infra_failure(self, msg: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the episode because the environment failed: reward 0.0, ``info["infra_error"]``."""
        self._done = True
        obs = truncate_observation(f"Environment error: {msg}", self.max_obs_chars)
        self._transcript.append(["env", obs])
        return obs, 0.0, True, False, {"turn": self._turn, "infra_error": str(msg)}

    def _task_rng(self, task_id: Any | None) -> np.random.Generator:
        """The generator a procedural task is drawn from: derived from ``task_id`` if given."""
        if task_id is None:
            return self.np_random
        digest = hashlib.sha256(f"{type(self).__name__}:{task_id}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:16], "little"))

    # ---- gymnasium API ----------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        state = options.get("state")
        if (
            state is None
            and isinstance(options.get("snapshot"), dict)
            and options["snapshot"].get("format") == STATE_FORMAT
        ):
            state = options["snapshot"]
        if state is not None:
            return self._restore(state)
        self._turn, self._done, self._started = 0, False, True
        self._transcript = []
        try:
            obs, info = self._reset(options.get("task_id"), options)
        except self.infra_errors as exc:
            # No episode to play: the trainer sees the flag and drops this sample.
            self._done = True
            msg = f"{type(exc).__name__}: {exc}"
            obs, info = truncate_observation(f"Environment error: {msg}", self.max_obs_chars), {"infra_error": msg}
            self._transcript = [["env", obs]]
            return obs, {**info, "turn": 0}
        obs = truncate_observation(obs, self.max_obs_chars)
        self._transcript = [["env", obs]]
        info = {**info, "turn": 0}
        if options.get("task_id") is not None:
            info["task_id"] = options["task_id"]
        return obs, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if not self._started or self._done:
            raise ResetNeeded("Call reset() before step(): no episode is running.")
        self._turn += 1
        self._transcript.append(["agent", action if isinstance(action, str) else repr(action)])
        if not isinstance(action, str):
            obs, reward, terminated, info = self._format_error(
                f"expected text (str), got {type(action).__name__}", ["a text reply"]
            )
        else:
            try:
                obs, reward, terminated, info = self._step(action)
            except self.infra_errors as exc:
                return self._infra_failure(f"{type(exc).__name__}: {exc}")
        obs = truncate_observation(obs, self.max_obs_chars)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = bool(terminated or truncated)
        self._transcript.append(["env", obs])
        return obs, float(reward), bool(terminated), bool(truncated), {**info, "turn": self._turn}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return self._render_text()

    # ---- save / resume -----------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        """The running episode as JSON-serializable data; resume with ``reset(options={"state": s})``."""
        if not self._started:
            raise ResetNeeded("Call reset() before save_state(): no episode to save.")
        return {
            "format": STATE_FORMAT,
            "env": type(self).__name__,
            "turn": self._turn,
            "done": self._done,
            "rng": rng_to_json(self.np_random),
            "transcript": [list(entry) for entry in self._transcript],
            "env_state": self._get_state(),
        }

    def _restore(self, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if state.get("format") != STATE_FORMAT or state.get("env") != type(self).__name__:
            raise ValueError(
                f"not a saved {type(self).__name__} state (format={state.get('format')!r}, env={state.get('env')!r})"
            )
        self._set_state(state["env_state"])
        self._np_random = rng_from_json(state["rng"])
        self._turn, self._done, self._started = int(state["turn"]), bool(state["done"]), True
        self._transcript = [list(entry) for entry in state["transcript"]]
        last_obs = next((text for role, text in reversed(self._transcript) if role == "env"), "")
        info = {"turn": self._turn, "resumed": True}
        if isinstance(state["env_state"], dict) and "task_id" in state["env_state"]:
            info["task_id"] = state["env_state"]["task_id"]  # as a fresh reset says it
        return last_obs, info
