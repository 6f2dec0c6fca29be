"""Checkpoints a run resumes from: ``<dir>/step_000010/`` holds the policy (model and
optimizer), the rollout state (ready groups, producer RNG and counters), the RNG states,
the step and the config (``state.pt``, ``config.json``), and the batch roles' states by role
name (``roles.pt``: the critics' models and optimizers...); ``<dir>/latest`` names the
newest complete one (written last). A folder is written as ``.tmp_step_*`` and renamed when
complete, so a crash mid-save leaves the previous checkpoint the latest."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def save_checkpoint(root: str | Path, step: int, policy: Any, rollout_state: dict, config: dict,
                    keep: int = 2, rank: int = 0, roles_state: dict[str, Any] | None = None) -> Path:
    """``roles_state``: each batch role's ``state_dict()`` by its name (CPU tensors).
    ``rank`` > 0, a data-parallel rank: its share of the policy (DeepSpeed's files) only, into
    the folder that rank 0 prepares and completes (the policy's ``save`` is collective: it
    waits for every rank, so rank 0 has made the folder before any rank writes, and every
    rank has written before rank 0 goes on to rename it)."""
    root = Path(root)
    folder = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if rank > 0:
        policy.save(tmp)
        return folder
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save(tmp)
    torch.save({
        "step": step,
        "rollout": rollout_state,
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
    }, tmp / "state.pt")
    torch.save(roles_state or {}, tmp / "roles.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    (root / "latest.tmp").write_text(folder.name)
    (root / "latest.tmp").replace(root / "latest")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(root: str | Path | None) -> Path | None:
    if not root:
        return None
    pointer = Path(root) / "latest"
    if not pointer.is_file():
        return None
    folder = Path(root) / pointer.read_text().strip()
    return folder if folder.is_dir() else None


def load_checkpoint(folder: Path, policy: Any) -> dict[str, Any]:
    """Restore the policy and the RNGs; return ``{"step", "rollout", "roles"}`` (``roles``: the
    batch roles' states by name; None for a checkpoint written before they were saved)."""
    policy.load(folder)
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    roles = folder / "roles.pt"
    return {"step": state["step"], "rollout": state["rollout"],
            "roles": torch.load(roles, map_location="cpu", weights_only=False) if roles.is_file() else None}
