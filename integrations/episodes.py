"""What every adapter shares: an env from any rockroll id, an episode started on a task, the
train/held-out split of task ids, and an infrastructure failure kept apart from a reward.

An env failure (a sandbox that died, a tool that timed out at the infrastructure level) is
``info["infra_error"]`` in rockroll's env contract. A trainer that learns from it as a zero
reward poisons its group statistics, so the adapters raise :class:`InfraFailure` or mark the
sample dropped, in whatever form their trainer understands.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rockroll.gem.factory import make_env

__all__ = ["EnvSpec", "InfraFailure", "MissingTrainer", "held_out_split", "require", "write_rows"]


class MissingTrainer(ImportError):
    """The trainer an adapter serves is not installed; the message names the extra."""


class InfraFailure(RuntimeError):
    """The env failed, not the model: the sample must be dropped, not scored."""

    def __init__(self, env_id: str, message: str):
        super().__init__(f"{env_id}: {message}")
        self.env_id, self.message = env_id, message


def require(module: str, extra: str | None, how: str | None = None) -> Any:
    """``importlib.import_module(module)``, or :class:`MissingTrainer` naming the extra (or, for a
    trainer no extra can install, ``how`` to get it)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        fix = how or f"pip install 'rockroll[{extra}]'"
        raise MissingTrainer(f"this adapter needs {module.split('.')[0]} ({e}): {fix}") from e


@dataclass
class EnvSpec:
    """One env a dataset row names: any rockroll id (``rock/Math-v0``, a hub env, ``gem:...``,
    ``module:Class``), its kwargs, and the task and seed an episode starts from."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    task_id: Any = None
    seed: int | None = None

    def make(self) -> Any:
        return make_env(self.env_id, **self.kwargs)

    def reset(self, env: Any) -> tuple[str, dict[str, Any]]:
        """``env.reset`` on this spec's task and seed; :class:`InfraFailure` when the env could
        not start an episode."""
        options = {"task_id": self.task_id} if self.task_id is not None else None
        obs, info = env.reset(seed=self.seed, options=options)
        if info.get("infra_error"):
            raise InfraFailure(self.env_id, str(info["infra_error"]))
        return obs, info

    def to_row(self) -> dict[str, Any]:
        """The JSON-safe form a dataset column holds (``from_row`` reads it back)."""
        return {"env_id": self.env_id, "env_kwargs": dict(self.kwargs), "task_id": self.task_id, "seed": self.seed}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> EnvSpec:
        return cls(row["env_id"], dict(row.get("env_kwargs") or {}), row.get("task_id"), row.get("seed"))


def held_out_split(task_ids: list[Any], held_out: int) -> tuple[list[Any], list[Any]]:
    """``(train, held_out)``: the last ``held_out`` ids are kept for evaluation only, so a
    trainer never meets them; a ValueError when nothing would be left to train on."""
    if not 0 < held_out < len(task_ids):
        raise ValueError(f"held_out must be between 1 and {len(task_ids) - 1} for {len(task_ids)} task ids, "
                         f"got {held_out}")
    return list(task_ids[:-held_out]), list(task_ids[-held_out:])


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | Path, extra: str) -> Path:
    """Dataset rows where a trainer's loader reads them: ``.parquet`` (pyarrow, which the
    trainer's ``datasets`` brings: an error naming ``extra`` without it) or ``.jsonl``."""
    path = Path(path)
    if path.suffix not in (".parquet", ".jsonl"):
        raise ValueError(f"rows are written to .parquet or .jsonl, not {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pa, pq = require("pyarrow", extra), require("pyarrow.parquet", extra)
        pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), path)
    else:
        path.write_text("".join(json.dumps(dict(r)) + "\n" for r in rows))
    return path
