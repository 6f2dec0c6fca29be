"""The agent process on the host, shared by every deployment that runs our agent
(local namespaces, docker): spare interpreters started ahead of time, the pids recorded
for crash reaping, and the kill that takes the sandbox's pid namespace with it."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from ..owner import proc_start_time
from ..runtime import _agent
from .seccomp import bpf_program

AGENT_PATH = _agent.__file__


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
    # An empty environment: the agent's children inside the sandbox (its pid 1, in docker
    # the process that entered the container) keep the environment they were started with,
    # and the sandbox's root reads it in /proc/*/environ. The host's holds secrets (the
    # service's token, $ROCKROLL_MODEL_TOKEN, cloud credentials); sessions get their own.
    return subprocess.Popen([sys.executable, "-S", "-E", AGENT_PATH], stdin=subprocess.PIPE, env={},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)


_spares = _SpareAgents()


def start_agent(cfg: dict) -> subprocess.Popen:
    """An agent process configured by ``cfg``: its stdin/stdout carry the protocol.
    Every agent gets the syscall filter here, whatever its deployment."""
    proc = _spares.take()
    # The config travels as the first frame, not argv: argv is readable in the sandbox.
    proc.stdin.write(_agent.encode_frame({**cfg, "seccomp": bpf_program().hex()}))
    proc.stdin.flush()
    return proc


class AgentProcess:
    """One sandbox's current agent: started from a config, its host pids recorded in
    ``<dir>/agent.json`` (the reaper kills them after a crash of the owner), killed
    with the whole pid namespace. Deployments hold one (composition), each adding
    where the agent runs."""

    def __init__(self, record_dir: Path):
        self.dir = record_dir
        self.proc: subprocess.Popen | None = None
        self.init_pid: int | None = None
        self.init_start: int | None = None

    def start(self, cfg: dict, model: dict | None = None) -> subprocess.Popen:
        """Start the agent with ``cfg`` (and the model channel's settings, if any)."""
        self.proc = start_agent({**cfg, "model": model} if model else cfg)
        return self.proc

    def record(self, init_pid: int) -> None:
        """Remember the agent's host pids so a later run can reap them after a crash."""
        self.init_pid = init_pid
        self.init_start = proc_start_time(init_pid)
        pids = {"outer_pid": self.proc.pid, "outer_start": proc_start_time(self.proc.pid),
                "init_pid": init_pid, "init_start": proc_start_time(init_pid)}
        (self.dir / "agent.json").write_text(json.dumps(pids))

    def stop(self, then: Callable[[], None] | None = None) -> subprocess.Popen | None:
        """Kill the current agent (and with it its pid namespace) without blocking; reap
        it in the background, then run ``then``. Returns the process stopped, if any."""
        proc, init_pid, init_start = self.proc, self.init_pid, self.init_start
        self.proc, self.init_pid = None, None
        if proc is None:
            return None
        for pid, start in ((init_pid, init_start), (proc.pid, None)):
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
        threading.Thread(target=_reap, args=(proc, then), daemon=True).start()
        return proc

    def kill(self) -> None:
        """Stop the agent and wait (bounded) until it is gone."""
        proc = self.stop()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _reap(proc: subprocess.Popen, then: Callable[[], None] | None) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    if then is not None:
        then()
