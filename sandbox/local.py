"""The local deployment: a sandbox as Linux namespaces + overlayfs + cgroups, no daemon.

This module only starts, stops and locates sandboxes; what you can *do* in one lives in
``client.py`` and is the same for every backend (SWE-ReX's runtime/deployment split).
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

from . import _agent
from .cgroups import Cgroup, Limits, cgroup_mode, rlimit_fallback
from .errors import IsolationUnavailable, SandboxStartError, SpecError
from .registry import RunRegistry, proc_start_time
from .rootfs import plan_for_image
from .spec import SandboxSpec

AGENT_PATH = _agent.__file__


def check_isolation() -> None:
    """Fail clearly, naming the docker backend, where this host cannot isolate."""
    if not sys.platform.startswith("linux"):
        raise IsolationUnavailable(
            f"the local backend needs Linux namespaces and overlayfs; this is {sys.platform}. "
            "Use backend='docker' instead.")
    if not os.path.exists("/proc/self/ns/pid") or "overlay" not in Path("/proc/filesystems").read_text():
        raise IsolationUnavailable(
            "this kernel lacks namespaces or overlayfs; use backend='docker' instead.")
    if os.geteuid() != 0 and not _userns_allowed():
        raise IsolationUnavailable(
            "not root and unprivileged user namespaces are disabled; run as root, enable "
            "kernel.unprivileged_userns_clone, or use backend='docker'.")


def _userns_allowed() -> bool:
    try:
        return Path("/proc/sys/kernel/unprivileged_userns_clone").read_text().strip() != "0"
    except OSError:
        return True  # upstream kernels have no switch: allowed unless userns max is 0


class _SpareAgents:
    """Agent interpreters started ahead of time, blocked reading their config frame.

    Starting Python and importing the agent is most of a sandbox's start-up; a spare
    makes create, restore, reset and fork skip it. Spares are generic (the config, sent
    later, says what to become). Every agent is started on one long-lived thread, because
    PR_SET_PDEATHSIG fires when the *thread* that forked a process exits, and callers
    may be short-lived worker threads.
    """

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._ready: collections.deque[subprocess.Popen] = collections.deque()
        self._lock = threading.Lock()
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None

    def take(self) -> subprocess.Popen:
        with self._lock:
            if self._spawner is None:
                self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rockroll-spawn")
            spawner = self._spawner
            proc = None
            while self._ready and proc is None:
                candidate = self._ready.popleft()
                proc = candidate if candidate.poll() is None else None
        if proc is None:
            proc = spawner.submit(_popen_agent).result()
        for _ in range(self.keep):
            spawner.submit(self._refill)
        return proc

    def _refill(self) -> None:
        with self._lock:
            if len(self._ready) >= self.keep:
                return
        proc = _popen_agent()
        with self._lock:
            self._ready.append(proc)


def _popen_agent() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-E", AGENT_PATH], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)


_spares = _SpareAgents()


def start_agent(cfg: dict) -> subprocess.Popen:
    """An agent process configured by ``cfg``: its stdin/stdout carry the protocol."""
    proc = _spares.take()
    # The config travels as the first frame, not argv: argv is readable in the sandbox.
    proc.stdin.write(_agent.encode_frame(cfg))
    proc.stdin.flush()
    return proc


class Deployment(Protocol):
    """Where a sandbox runs. ``AsyncSandbox`` drives any deployment through this
    interface; the agent and its protocol are the same everywhere."""

    upper: Path  # the sandbox's writable layer, as a host path (snapshots pack it)

    def spawn(self, layers: list[Path], sessions: dict[str, str]) -> subprocess.Popen:
        """Start a fresh agent over snapshot ``layers`` (top first); its stdin/stdout
        carry the protocol and its first frame was the config."""

    def record(self, init_pid: int) -> None:
        """Remember the agent's pids so a later run can reap them after a crash."""

    def stop_agent(self) -> None:
        """Kill the current agent and everything it started (not blocking)."""

    def oom_kills(self) -> int: ...
    def freeze(self) -> None: ...
    def thaw(self) -> None: ...

    def kill_now(self) -> None:
        """Synchronous, idempotent teardown (atexit calls it)."""

    def close(self) -> None:
        """Tear down and unregister."""


class LocalDeployment:
    """Host side of one local sandbox: its directories, cgroup and agent process."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str, run: RunRegistry):
        check_isolation()
        if spec.disk_mb is not None:
            # The overlay upper lives on the host's filesystem, which has no per-directory
            # quota here; refusing beats pretending to enforce a limit.
            raise SpecError("disk_mb", "the local backend cannot enforce a disk limit; use "
                                       "backend='docker' or leave disk_mb unset")
        self.spec, self.id, self.run = spec, sandbox_id, run
        self.plan = plan_for_image(spec.image, run.home)
        self.dir = run.add(sandbox_id, self.kill_now)
        (self.dir / "rootfs").mkdir(exist_ok=True)
        self.gen = 0
        self.proc: subprocess.Popen | None = None
        self.init_pid: int | None = None
        self.init_start: int | None = None
        self.userns = os.geteuid() != 0
        self.limits = Limits(cpus=spec.cpus, memory_mb=spec.memory_mb, pids=spec.pids)
        self.cgroup = None
        if cgroup_mode() != "none":
            try:
                self.cgroup = Cgroup.create(f"{run.cgroup_tag}.{sandbox_id}", self.limits)
            except SandboxStartError as e:
                run.discard(sandbox_id)
                raise SandboxStartError(str(e), sandbox_id=sandbox_id) from e
        self._lock = threading.Lock()

    @property
    def upper(self) -> Path:
        return self.dir / f"upper{self.gen}"

    def spawn(self, layers: list[Path], sessions: dict[str, str]) -> subprocess.Popen:
        """Start a fresh agent over ``layers`` (top first) + the image, with an empty upper."""
        self.gen += 1
        upper, work = self.dir / f"upper{self.gen}", self.dir / f"work{self.gen}"
        upper.mkdir()
        work.mkdir()
        os.chmod(upper, 0o755)
        cfg = {
            "id": self.id,
            "rootfs": str(self.dir / "rootfs"),
            "lowers": [str(p) for p in layers] + list(self.plan.lowers),
            "upper": str(upper), "work": str(work),
            "binds": [list(b) for b in self.plan.binds],
            "cgroup_procs": self.cgroup.procs_paths() if self.cgroup else [],
            "rlimits": [] if self.cgroup else [[r, s, h] for r, (s, h) in rlimit_fallback(self.limits)],
            "userns": self.userns, "network": self.spec.network,
            "hostname": self.id, "workdir": self.spec.workdir, "env": dict(self.spec.env),
            "sessions": sessions,
        }
        self.proc = start_agent(cfg)
        return self.proc

    def record(self, init_pid: int) -> None:
        """Remember the agent's host pids so a later run can reap them after a crash."""
        self.init_pid = init_pid
        self.init_start = proc_start_time(init_pid)
        pids = {"outer_pid": self.proc.pid, "outer_start": proc_start_time(self.proc.pid),
                "init_pid": init_pid, "init_start": proc_start_time(init_pid)}
        (self.dir / "agent.json").write_text(json.dumps(pids))

    def stop_agent(self) -> None:
        """Kill the current agent (and with it the whole pid namespace); reap it and
        delete the old generation's directories in the background."""
        proc, init_pid, gen = self.proc, self.init_pid, self.gen
        self.proc, self.init_pid = None, None
        if proc is None:
            return
        for pid, start in ((init_pid, self.init_start), (proc.pid, None)):
            # A dead init's pid may already belong to someone else: check before killing.
            if pid and (start is None or proc_start_time(pid) == start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        threading.Thread(target=self._reap, args=(proc, gen), daemon=True).start()

    def _reap(self, proc: subprocess.Popen, gen: int) -> None:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for name in (f"upper{gen}", f"work{gen}"):
            shutil.rmtree(self.dir / name, ignore_errors=True)

    def oom_kills(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup else 0

    def freeze(self) -> None:
        if self.cgroup:
            self.cgroup.freeze()

    def thaw(self) -> None:
        if self.cgroup:
            self.cgroup.thaw()

    def kill_now(self) -> None:
        """Synchronous, idempotent teardown (also called from atexit)."""
        with self._lock:
            proc = self.proc
            self.stop_agent()
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self._release()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _release(self) -> None:
        """Free what the sandbox holds besides its agent and directory (its cgroup)."""
        if self.cgroup:
            self.cgroup.remove()
            self.cgroup = None

    def close(self) -> None:
        self.kill_now()
        self.run.discard(self.id)
