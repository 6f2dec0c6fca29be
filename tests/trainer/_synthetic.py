"""Synthetic text envs for tests and benchmarks (not shipped: an env config names them
``_synthetic:LatencyEnv``, with this folder on sys.path): long-tailed step latency, optional
infra failures.

``LatencyEnv`` asks for a word; replying with it (default ``Right``) earns 1.0 and ends the
episode, anything else earns 0.0 and the episode goes on (truncated after ``max_turns``).
With ``task_id="easy"`` every reply wins (a group whose rewards are all equal: what dynamic
sampling drops). Each step sleeps a lognormal time (``asyncio.sleep`` in :meth:`astep`, so
thousands of envs wait concurrently on one loop; :meth:`step` blocks, for thread pools),
drawn from a per-instance RNG so that envs of one group differ in speed. ``infra_error_rate``
makes a step fail as infrastructure (``info["infra_error"]``).

``ReadEnv`` is the smallest task that needs reading, with an expert: each task names a room and
one of four words ("Room 17: say Left."), replying with the word wins; a policy blind to the
text wins a quarter. ``expert_action()`` says the word (SFT data), ``action_words`` are the four.

``TwoStepEnv`` is the smallest multi-turn task: two turns, each asking for its own word and
paying half the reward when answered, whatever the other turn did; what the policy must say
depends on the observation of the turn (the multi-turn credit and masks are what it tests).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from rockroll.gem.core import GemEnv, InfraError


class LatencyEnv(GemEnv):
    def __init__(self, *, latency_median_s: float = 0.0, latency_sigma: float = 1.0,
                 infra_error_rate: float = 0.0, latency_seed: int | None = None,
                 fixed_latency_s: float | None = None, max_turns: int = 4, format_penalty: float = 0.0,
                 target: str = "Right"):
        super().__init__(max_turns=max_turns, format_penalty=format_penalty)
        self.median, self.sigma, self.fixed = latency_median_s, latency_sigma, fixed_latency_s
        self.infra_error_rate, self.target = infra_error_rate, target
        self._lat_rng = random.Random(latency_seed)
        self.task: Any = None

    def latency(self) -> float:
        if self.fixed is not None:
            return self.fixed
        if self.median <= 0:
            return 0.0
        import math

        return self._lat_rng.lognormvariate(math.log(self.median), self.sigma)

    def _reset(self, task_id, options):
        self.task = task_id
        return f"Say {self.target}.", {"success": False}

    def _step(self, action: str):
        if self.infra_error_rate and self._lat_rng.random() < self.infra_error_rate:
            raise InfraError("synthetic sandbox lost")
        win = self.task == "easy" or self.target.lower() in action.lower()
        return ("Correct." if win else f"No. Say {self.target}."), float(win), win, {"success": win}

    def step(self, action):
        time.sleep(self.latency())
        return super().step(action)

    async def astep(self, action):
        await asyncio.sleep(self.latency())
        return super().step(action)

    async def areset(self, *, seed=None, options=None):
        return self.reset(seed=seed, options=options)


class TwoStepEnv(GemEnv):
    """Turn 1 asks for ``first``, turn 2 for ``second``; each right answer earns 0.5 (the episode
    always plays both turns: truncated after the second). Success: both right. A task id
    ``"First-Second"`` (e.g. ``"Left-Up"``) names the two words instead, so that a policy
    trained on some pairs can be evaluated on pairs it never saw (it must read the word off
    each turn's observation)."""

    def __init__(self, *, first: str = "Up", second: str = "Down", format_penalty: float = 0.0):
        super().__init__(max_turns=2, format_penalty=format_penalty)
        self.default = self.targets = (first, second)
        self.right = 0

    def _reset(self, task_id, options):
        self.right = 0
        self.targets = tuple(str(task_id).split("-", 1)) if task_id is not None else self.default
        return f"Say {self.targets[0]}.", {"success": False}

    def _step(self, action: str):
        turn = self._turn - 1  # the base class counts this turn before calling _step
        win = action.strip() == self.targets[turn]
        self.right += win
        obs = f"Now say {self.targets[1]}." if turn == 0 else "Done."
        return obs, 0.5 * win, False, {"success": self.right == 2}


class LengthEnv(GemEnv):
    """Episodes whose length and reward go together: task ``k`` (an int) lasts ``k`` turns,
    each sleeping ``step_s``, whatever the policy says, and pays ``k / max_turns`` at its end.
    What finishes first is short and low-reward: the env on which spare groups' selection
    bias is measured (``rollout.spare_selection``)."""

    def __init__(self, *, max_turns: int = 6, step_s: float = 0.01, format_penalty: float = 0.0):
        super().__init__(max_turns=max_turns, format_penalty=format_penalty)
        self.step_s, self.task = step_s, 1

    def _reset(self, task_id, options):
        self.task = int(task_id if task_id is not None else 1)
        return f"Play {self.task} turns.", {"success": False}

    def _step(self, action: str):
        end = self._turn >= self.task
        return ("Done." if end else "Go on."), (self.task / self.max_turns if end else 0.0), end, {"success": end}

    def step(self, action):
        time.sleep(self.step_s)
        return super().step(action)

    async def astep(self, action):
        await asyncio.sleep(self.step_s)
        return super().step(action)

    async def areset(self, *, seed=None, options=None):
        return self.reset(seed=seed, options=options)


class ReadEnv(GemEnv):
    """One turn: "Room <task id>: say <word>." with the word picked by the task id; 1.0 for
    replying it (see the module docstring)."""

    action_words = ("Up", "Down", "Left", "Right")

    def __init__(self, *, room: bool = True, format_penalty: float = 0.0):
        super().__init__(max_turns=1, format_penalty=format_penalty)
        self.target, self.room = "", room

    def _reset(self, task_id, options):
        room = int(self._task_rng(task_id).integers(1000)) if task_id is None else int(task_id)
        self.target = self.action_words[(room * 7 + room // 10) % 4]
        return (f"Room {room}: say {self.target}." if self.room else f"Say {self.target}."), {"success": False}

    def _step(self, action: str):
        win = action.strip() == self.target
        return ("Correct." if win else "No."), float(win), True, {"success": win}

    def expert_action(self) -> str:
        if self._done:
            raise ValueError("no expert move: the episode is over")
        return self.target
