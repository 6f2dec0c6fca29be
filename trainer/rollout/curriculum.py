"""Initialized sampling: a rollback curriculum over the states of successful episodes.

A task whose reward comes only at the end is rarely solved from its start by a weak policy:
its GRPO groups are all failures and teach nothing. Initialized sampling starts them closer
to the goal instead. Once an episode of a task succeeds, the states saved before each of its
turns (``env.save_state()``) become starting points, and groups of the task start at
*level* k: the state k turns before the goal (level 1: one step from it), resumed with
``env.reset(options={"state": s})``. When the mean success of the last ``window`` groups
started at the current level reaches ``promote_at``, the level moves one turn earlier; past
the first turn the task has graduated and its groups start from the beginning again.

Token-in/token-out: an initialized episode begins with the exact token ids the successful
episode had before that turn (its observations and the policy's earlier replies, all mask
0, so only what the policy generates from there on is trained), and the env resumes the
state those tokens describe: ``reset(options={"state": s})`` returns the observation the
token prefix ends with (the rollout checks it and drops the sample otherwise).

Here: :class:`Trajectory` (a successful episode: its tokens and transcript, and the state
saved before each turn with where that turn began) and :class:`Curriculum` (per-task levels;
pure bookkeeping over anything with a length, tested on hand-written sequences).
:class:`rockroll.trainer.rollout.manager.RolloutManager` wires them to the envs: episodes save
states only while their task has no trajectory yet (``save_state`` of a sandbox env is a
snapshot: not free), and each group reports its success with the level it started at (with
asynchronous rollout a group can finish after the level moved; it then does not count).
Enable it with ``rollout.curriculum.enabled: true`` (envs need ``task_ids``: a trajectory
belongs to one task).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

__all__ = ["Curriculum", "Start", "Trajectory", "initialized_metrics", "task_key"]


def task_key(env_id: str, task_id: Any) -> str:
    return f"{env_id}/{task_id}"


@dataclass
class Start:
    """Where an initialized episode begins."""

    state: dict[str, Any]              # env.save_state() before the turn
    token_ids: list[int]               # the recorded sample's tokens up to that turn
    transcript: list[list[str]]        # and its transcript (ends with the observation resumed)


@dataclass
class Trajectory:
    """A successful episode; ``trajectory[i]`` is the :class:`Start` before its turn i + 1."""

    token_ids: list[int]
    transcript: list[list[str]]
    # (state, len(token_ids), len(transcript)) before each turn: offsets into the lists
    # above rather than copies, so tracing an episode costs one saved state per turn
    turns: list[tuple[dict[str, Any], int, int]]

    def __len__(self) -> int:
        return len(self.turns)

    def __getitem__(self, i: int) -> Start:
        state, n_tokens, n_entries = self.turns[i]
        return Start(state, self.token_ids[:n_tokens], [list(e) for e in self.transcript[:n_entries]])


@dataclass
class _Task:
    trajectory: Sequence[Any]
    level: int = 1
    recent: list[float] = field(default_factory=list)  # success of groups started at ``level``


class Curriculum:
    """Per-task levels of the rollback curriculum (keys from :func:`task_key`)."""

    def __init__(self, promote_at: float, window: int):
        self.promote_at, self.window = promote_at, window
        self.tasks: dict[str, _Task] = {}

    def tracing(self, key: str) -> bool:
        """Whether episodes of the task should save their states: until it has a trajectory."""
        return key not in self.tasks

    def start(self, key: str) -> tuple[int, Any]:
        """``(level, start)`` for a new group of the task: ``start`` is the state ``level``
        turns before the goal; ``(0, None)``: from the beginning (no trajectory, or graduated)."""
        t = self.tasks.get(key)
        if t is None or t.level > len(t.trajectory):
            return 0, None
        return t.level, t.trajectory[len(t.trajectory) - t.level]

    def record(self, key: str, trajectory: Sequence[Any]) -> bool:
        """Keep a successful episode's trajectory if the task has none or this one is shorter.
        Levels count turns back from the goal, so they keep their meaning across a swap."""
        t = self.tasks.get(key)
        if t is None:
            self.tasks[key] = _Task(trajectory)
            return True
        if len(trajectory) < len(t.trajectory):
            t.trajectory, t.recent = trajectory, []
            return True
        return False

    def observe(self, key: str, level: int, success: float) -> bool:
        """A group started at ``level`` had mean success ``success``. Returns whether the
        level moved one turn earlier."""
        t = self.tasks.get(key)
        if t is None or level == 0 or level != t.level:
            return False  # not initialized, or started before the level last moved
        t.recent = (t.recent + [success])[-self.window:]
        if len(t.recent) == self.window and sum(t.recent) / self.window >= self.promote_at:
            t.level, t.recent = t.level + 1, []
            return True
        return False

    def metrics(self) -> dict[str, float]:
        """Level per task (turns before the goal; trajectory length + 1: graduated), counts."""
        out = {f"curriculum/{k}/level": float(min(t.level, len(t.trajectory) + 1)) for k, t in self.tasks.items()}
        out["curriculum/tasks_recorded"] = float(len(self.tasks))
        out["curriculum/tasks_graduated"] = float(sum(t.level > len(t.trajectory) for t in self.tasks.values()))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": {k: (t.trajectory, t.level, list(t.recent)) for k, t in self.tasks.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks = {k: _Task(traj, level, list(recent)) for k, (traj, level, recent) in state["tasks"].items()}


def initialized_metrics(groups: Iterable[Any]) -> dict[str, float]:
    """Fraction of groups that started from a saved state, overall and per env id."""
    by_env: dict[str, list[bool]] = defaultdict(list)
    for g in groups:
        by_env[g.env_id].append(g.start_level > 0)
    flags = [f for fs in by_env.values() for f in fs]
    out = {"curriculum/initialized": sum(flags) / max(len(flags), 1)}
    if len(by_env) > 1:
        out.update({f"curriculum/{env_id}/initialized": sum(fs) / len(fs) for env_id, fs in by_env.items()})
    return out
