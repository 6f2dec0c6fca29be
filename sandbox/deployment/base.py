"""The deployment contract: where one sandbox runs (SWE-ReX's runtime/deployment split).

A runtime that speaks our guest protocol (``runtime/guest.py``) drives any deployment
through this interface; the guest and its protocol are the same everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..protocol.frames import ModelConfig
    from .process import GuestHandle


class Deployment(Protocol):
    """Where a sandbox runs: starts, stops and locates its guest process."""

    upper: Path  # the sandbox's writable layer, as a host path (snapshots pack it)

    def spawn(self, layers: list[Path], sessions: dict[str, str],
              model: ModelConfig | None = None) -> GuestHandle:
        """Start a fresh guest over snapshot ``layers`` (top first); its stdin/stdout
        carry the protocol and its first frame was the config (a ``GuestConfig`` built
        from the spec). ``model`` turns on the in-sandbox model endpoint
        (``runtime/model_channel.py``)."""

    def record(self, init_pid: int) -> None:
        """Remember the guest's pids so a later run can reap them after a crash."""

    def stop_guest(self) -> None:
        """Kill the current guest and everything it started (not blocking)."""

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed so far."""

    def freeze(self) -> None:
        """Pause every process of the sandbox (while its upper layer is copied)."""

    def thaw(self) -> None:
        """Resume what ``freeze`` paused."""

    def usage(self) -> dict[str, float] | None:
        """``{"cpu_seconds", "memory_bytes"}`` so far, or None where nothing tells."""

    def kill_now(self) -> None:
        """Synchronous, idempotent teardown (atexit calls it)."""

    def close(self) -> None:
        """Tear down and unregister."""
