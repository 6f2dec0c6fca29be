"""The reward of a logquiz answer: a pure function of the task and the answer, so it is
tested without a sandbox (and a trainer can trust it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    id: str
    question: str
    answer: str    # the expected answer, as text
    solution: str  # a bash command that prints it, from /workspace: the oracle


def load_tasks(path: str | Path) -> list[Task]:
    """The tasks file: one JSON object a line with the fields of :class:`Task`."""
    tasks = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(Task(**json.loads(line)))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a task ({e})") from None
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


def grade(task: Task, answer: str) -> float:
    """1.0 for the expected answer, else 0.0; numbers compare as numbers ("08" is 8),
    text without surrounding space or case."""
    given, expected = answer.strip(), task.answer.strip()
    try:
        return float(float(given) == float(expected))
    except ValueError:
        return float(given.lower() == expected.lower())
