"""Run registry: every sandbox is registered under the id of the process run that owns it.

Layout: ``<state_home>/runs/<run_id>/run.json`` names the owner (pid and its start time,
so a recycled pid is not mistaken for a live owner); each sandbox has a directory
``<run_id>/<sandbox_id>/`` with ``agent.json`` (host pids of its processes) and its
overlay dirs. Its cgroups are named ``<run_id>.<sandbox_id>``.

Cleanup happens in three places, so nothing outlives its owner:
- normal exit, Ctrl-C and SIGTERM: ``atexit`` closes every live sandbox of the run;
- kill -9 of the owner: the agents see their control pipe close and exit (the kernel
  tears down each pid namespace with its pid 1), and the next run's first sandbox, or
  ``rockroll sandbox gc``, removes the dead run's directories and cgroups.
"""

from __future__ import annotations

import atexit
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

from .rootfs import state_home


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


def owner_alive(info: dict) -> bool:
    pid, start = info.get("pid"), info.get("start")
    return isinstance(pid, int) and proc_start_time(pid) == start


@dataclass
class RunInfo:
    run_id: str
    pid: int | None
    alive: bool
    sandboxes: list[str] = field(default_factory=list)


def list_runs(home: Path | None = None) -> list[RunInfo]:
    runs_dir = (home or state_home()) / "runs"
    out = []
    for run_dir in sorted(runs_dir.glob("*")) if runs_dir.is_dir() else []:
        try:
            info = json.loads((run_dir / "run.json").read_text())
        except (OSError, ValueError):
            info = {}
        sandboxes = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
        out.append(RunInfo(run_dir.name, info.get("pid"), owner_alive(info), sandboxes))
    return out


def _kill_recorded(sandbox_dir: Path) -> None:
    """SIGKILL the agent processes recorded for a sandbox, if they are still ours."""
    try:
        pids = json.loads((sandbox_dir / "agent.json").read_text())
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
    from .cgroups import Cgroup, cgroup_mode
    from .errors import SandboxError

    reaped = []
    for run in list_runs(home):
        if run.run_id == keep or (run.alive and not include_live):
            continue
        run_dir = (home or state_home()) / "runs" / run.run_id
        for sb in run.sandboxes:
            _kill_recorded(run_dir / sb)
        reaped.append(run.run_id)
        shutil.rmtree(run_dir, ignore_errors=True)
    if cgroup_mode() != "none":
        live = {r.run_id for r in list_runs(home) if r.alive or r.run_id == keep}
        for name in Cgroup.leftovers():
            if name.split(".", 1)[0] not in live:
                try:
                    Cgroup.attach(name).remove()
                except SandboxError:
                    pass  # another collector got there first, or a process would not die
    return reaped


class RunRegistry:
    """This process's run: its id, directory and live sandboxes (one per process)."""

    def __init__(self, home: Path | None = None):
        self.home = home or state_home()
        self.run_id = uuid.uuid4().hex[:10]
        self.dir = self.home / "runs" / self.run_id
        self._closers: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._started = False

    def ensure(self) -> None:
        """Create the run directory; the first call also reaps dead runs and hooks exit."""
        with self._lock:
            if self._started:
                return
            reap_dead_runs(self.home, keep=self.run_id)
            self.dir.mkdir(parents=True, exist_ok=True)
            pid = os.getpid()
            info = {"pid": pid, "start": proc_start_time(pid), "created": time.time()}
            (self.dir / "run.json").write_text(json.dumps(info))
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

    def live(self) -> list[str]:
        with self._lock:
            return sorted(self._closers)

    def close_all(self) -> None:
        """Kill every sandbox of this run and remove the run's directory. Idempotent."""
        with self._lock:
            closers = list(self._closers.values())
            self._closers.clear()
        for close in closers:
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the others
                pass
        if self._started:
            shutil.rmtree(self.dir, ignore_errors=True)


def install_exit_handlers() -> None:
    """Turn SIGTERM into a normal exit so atexit cleanup runs (only if nobody else
    handles SIGTERM, and only from the main thread, where signals can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))


_registry: RunRegistry | None = None
_registry_lock = threading.Lock()


def current_run() -> RunRegistry:
    global _registry
    with _registry_lock:
        if _registry is None or _registry.home != state_home():
            _registry = RunRegistry()
        return _registry
