"""Where rockroll keeps its host state: one root that deployments (run registry, images)
and storage (snapshots) both write under, so it lives apart from either."""

from __future__ import annotations

import os
from pathlib import Path


def state_home() -> Path:
    """Root of rockroll's host state (``$ROCKROLL_HOME``, else a per-user default)."""
    env = os.environ.get("ROCKROLL_HOME")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/rockroll")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "rockroll"
