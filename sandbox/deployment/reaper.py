"""Crash reaping: every sandbox is registered under the id of the process run that owns it.

Layout: ``<state_home>/runs/<run_id>/run.json`` names the owner (pid and its start time,
so a recycled pid is not mistaken for a live owner); each sandbox has a directory
``<run_id>/<sandbox_id>/`` with ``guest.json`` (host pids of its processes) and its
overlay dirs or disk images (``disk.py``: their mounts live in the sandbox's mount
namespace and their loop devices clear themselves when it dies). Its cgroups are named ``<run_id>-<owner pid>-<owner start>.<sandbox_id>``, so
any collector can tell a dead owner's cgroups from a live one's, even a run whose state
lives under another ``ROCKROLL_HOME``.

Cleanup happens in three places, so nothing outlives its owner:
- normal exit, Ctrl-C and SIGTERM: ``atexit`` closes every live sandbox of the run;
- kill -9 of the owner: the guests see their control pipe close and exit (the kernel
  tears down each pid namespace with its pid 1), and the next run's first sandbox, or
  ``rockroll sandbox gc``, removes the dead run's directories and cgroups.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..home import private_home, state_home
from ..factory import reap_hooks
from ..lifecycle import alive, proc_start_time
from ..storage.snapshots import SnapshotStore
from .disk import detach_loops, drop_spares


def owner_alive(info: dict) -> bool:
    pid, start = info.get("pid"), info.get("start")
    return isinstance(pid, int) and alive(pid, start)


@dataclass
class RunInfo:
    run_id: str
    pid: int | None
    alive: bool
    sandboxes: list[str] = field(default_factory=list)


STARTING = ".starting-"  # a run directory being made, before it holds its run.json
STARTING_GRACE_S = 60.0  # one older than this was left by a process that died making it


def list_runs(home: Path | None = None) -> list[RunInfo]:
    runs_dir = (home or state_home()) / "runs"
    out = []
    for run_dir in sorted(runs_dir.glob("*")) if runs_dir.is_dir() else []:
        if run_dir.name.startswith(STARTING):
            continue  # a run being registered (RunRegistry.ensure)
        try:
            info = json.loads((run_dir / "run.json").read_text())
        except (OSError, ValueError):
            info = {}
        sandboxes = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
        out.append(RunInfo(run_dir.name, info.get("pid"), owner_alive(info), sandboxes))
    return out


def _kill_recorded(sandbox_dir: Path) -> None:
    """SIGKILL the guest processes recorded for a sandbox, if they are still ours."""
    try:
        pids = json.loads((sandbox_dir / "guest.json").read_text())
    except (OSError, ValueError):
        return
    for key in ("init_pid", "outer_pid"):
        pid = pids.get(key)
        start = pids.get(key.replace("pid", "start"))
        if isinstance(pid, int) and proc_start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def reap_dead_runs(home: Path | None = None, *, include_live: bool = False,
                   keep: str | None = None) -> list[str]:
    """Remove what dead runs left behind: processes, cgroups, directories.

    Returns the ids of the runs reaped. ``include_live`` also reaps runs whose owner is
    alive (``rockroll sandbox gc --all``); ``keep`` is never reaped (the caller's run).
    """
    from ..errors import SandboxError
    from .cgroups import Cgroup, cgroup_mode

    reaped = []
    for run in list_runs(home):
        if run.run_id == keep or (run.alive and not include_live):
            continue
        run_dir = (home or state_home()) / "runs" / run.run_id
        for sb in run.sandboxes:
            _kill_recorded(run_dir / sb)
        detach_loops(run_dir)
        reaped.append(run.run_id)
        shutil.rmtree(run_dir, ignore_errors=True)
    runs_dir = (home or state_home()) / "runs"
    for making in runs_dir.glob(f"{STARTING}*") if runs_dir.is_dir() else []:
        with contextlib.suppress(OSError):
            if time.time() - making.stat().st_mtime > STARTING_GRACE_S:
                shutil.rmtree(making, ignore_errors=True)  # its maker died between mkdir and rename
    if cgroup_mode() != "none":
        for name in Cgroup.leftovers():
            owner = parse_cgroup_tag(name.split(".", 1)[0])
            if owner is None or owner[0] == keep:
                continue  # not ours to judge, or the caller's own run
            if not include_live and proc_start_time(owner[1]) == owner[2]:
                continue  # its owner is alive (maybe under another ROCKROLL_HOME)
            try:
                Cgroup.attach(name).remove()
            except SandboxError:
                pass  # another collector got there first, or a process would not die
    if (reaped or include_live) and os.geteuid() == 0 and shutil.which("iptables-save"):
        from .network import sweep

        with contextlib.suppress(SandboxError):
            sweep()  # the filter rules of their sandboxes' networks (the veths died with them)
    for hook in reap_hooks():  # each backend's own leftovers (docker's containers)
        try:
            hook(reaped, keep=keep)
        except Exception:  # noqa: BLE001 - an optional backend's (no SDK, no engine): the next gc tries again
            pass
    return reaped


def parse_cgroup_tag(tag: str) -> tuple[str, int, int] | None:
    """``<run_id>-<pid>-<start>`` -> (run_id, pid, start); None if it is not one."""
    parts = tag.split("-")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2])


class RunRegistry:
    """This process's run: its id, directory and live sandboxes (one per process)."""

    def __init__(self, home: Path | None = None):
        self.home = home or state_home()
        self.run_id = uuid.uuid4().hex[:10]
        self.dir = self.home / "runs" / self.run_id
        pid = os.getpid()
        self.cgroup_tag = f"{self.run_id}-{pid}-{proc_start_time(pid)}"
        self._closers: dict[str, Callable[[], None]] = {}
        self._at_close: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._started = False
        self.closed = False

    def ensure(self) -> None:
        """Create the run directory; the first call also reaps dead runs and hooks exit."""
        with self._lock:
            if self._started:
                return
            reap_dead_runs(self.home, keep=self.run_id)
            SnapshotStore(self.home).sweep_temps()
            private_home(self.home)
            # The directory appears with its run.json in it (made aside, then renamed): another
            # process's reaper that saw it without one would take it for a dead run's and remove it.
            pid = os.getpid()
            info = {"pid": pid, "start": proc_start_time(pid), "created": time.time()}
            making = self.dir.parent / f"{STARTING}{self.run_id}"
            making.mkdir(parents=True, exist_ok=True)
            (making / "run.json").write_text(json.dumps(info))
            os.rename(making, self.dir)
            atexit.register(self.close_all)
            self._started = True

    def add(self, sandbox_id: str, closer: Callable[[], None]) -> Path:
        self.ensure()
        with self._lock:
            self._closers[sandbox_id] = closer
        path = self.dir / sandbox_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def discard(self, sandbox_id: str) -> None:
        with self._lock:
            self._closers.pop(sandbox_id, None)
        shutil.rmtree(self.dir / sandbox_id, ignore_errors=True)

    def at_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the run closes (after its sandboxes): what it made ahead of time."""
        with self._lock:
            self._at_close.append(fn)

    def live(self) -> list[str]:
        with self._lock:
            return sorted(self._closers)

    def close_all(self) -> None:
        """Kill every sandbox of this run and remove the run's directory. Idempotent."""
        with self._lock:
            self.closed = True
            closers = list(self._closers.values()) + self._at_close
            self._closers.clear()
            self._at_close = []
        for close in closers:
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the others
                pass
        drop_spares(self.dir)
        if self._started:
            shutil.rmtree(self.dir, ignore_errors=True)


_registry: RunRegistry | None = None
_registry_lock = threading.Lock()


def current_run() -> RunRegistry:
    global _registry
    with _registry_lock:
        if _registry is None or _registry.home != state_home():
            _registry = RunRegistry()
        return _registry
