"""The guest process on the host, shared by every deployment that runs our guest
(local namespaces, docker): forked by a zygote (a fork server started once per owner
process), the pids recorded for crash reaping, and the kill that takes the sandbox's pid
namespace with it."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from ..guest import MAIN
from ..lifecycle import proc_start_time
from ..protocol.frames import GuestConfig
from .seccomp import bpf_program


class GuestHandle:
    """A running guest as the host holds it (the part of ``subprocess.Popen`` we use):
    ``pid``, ``stdin``/``stdout`` (the protocol's pipes), ``poll``/``wait``. The guest is
    the zygote's child, not ours: we wait on a pidfd (the zygote reaps it)."""

    def __init__(self, pid: int, pidfd: int, stdin_w: int, stdout_r: int):
        self.pid, self._pidfd = pid, pidfd
        self.stdin = os.fdopen(stdin_w, "wb")
        self.stdout = os.fdopen(stdout_r, "rb", buffering=0)
        self.returncode: int | None = None

    def kill(self) -> None:
        """SIGKILL it, through the pidfd: the zygote reaps it at once, so its bare pid
        may already name another process."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None and self._exited(0) else self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._exited(timeout):
                raise subprocess.TimeoutExpired(f"guest {self.pid}", timeout)
            self.returncode = -1  # its status went to the zygote, which reaped it
        return self.returncode

    def _exited(self, timeout: float | None) -> bool:
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return bool(poller.poll(None if timeout is None else int(timeout * 1000)))

    def __del__(self) -> None:  # not in wait: a stop's reaper thread and a kill may both wait
        if getattr(self, "_pidfd", -1) >= 0:
            os.close(self._pidfd)


class Zygote:
    """The fork server of this process (``guest/zygote.py``): one interpreter, started
    once, that has imported the guest and forks one per sandbox. Requests are serialized
    (a fork is about a millisecond); a zygote that died is replaced on the next request.

    It is started on one long-lived thread, because PR_SET_PDEATHSIG fires when the
    *thread* that forked a process exits, and callers may be short-lived worker threads.
    Its environment is empty: the guests' children inside the sandbox (its pid 1, in
    docker the process that entered the container) keep the environment they were started
    with, and the sandbox's root reads it in /proc/*/environ. The host's holds secrets
    (the service's token, $ROCKROLL_MODEL_TOKEN, cloud credentials); sessions get their own.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None  # starts the zygote
        self._refiller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rockroll-spares")
        # spares of each kind: pid 1 of a pid namespace of its own (True), a plain fork (False)
        self._ready: dict[bool, collections.deque[GuestHandle]] = {True: collections.deque(),
                                                                   False: collections.deque()}

    def take(self, pid_ns: bool) -> GuestHandle:
        """A guest process blocked reading its config frame on stdin, ``pid_ns``: pid 1 of
        a new pid namespace (``guest/zygote.py``'s ``p``), else a plain fork. One forked ahead
        of time (``keep`` wait per kind, generic, holding nothing of any sandbox; the round
        trip to the zygote is then off the create path), else a fresh fork."""
        with self._lock:
            ready, proc = self._ready[pid_ns], None
            while ready and proc is None:
                candidate = ready.popleft()
                proc = candidate if candidate.poll() is None else None
            if proc is None:
                proc = self._fork_or_retry(pid_ns)
        self._refiller.submit(self._refill, pid_ns)
        return proc

    def _refill(self, pid_ns: bool) -> None:
        while True:
            with self._lock:
                if len(self._ready[pid_ns]) >= self.keep:
                    return
                try:
                    self._ready[pid_ns].append(self._fork_or_retry(pid_ns))
                except OSError:
                    return  # the next take forks its own, and says why

    def _fork_or_retry(self, pid_ns: bool) -> GuestHandle:
        try:
            return self._fork(pid_ns)
        except OSError:
            self._stop()  # dead or confused: one retry with a fresh zygote
            return self._fork(pid_ns)

    def _fork(self, pid_ns: bool) -> GuestHandle:
        if self._sock is None:
            self._start()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            socket.send_fds(self._sock, [b"p" if pid_ns else b"f"], [stdin_r, stdout_w])
            msg, fds, _, _ = socket.recv_fds(self._sock, 16, 1)
        except BaseException:
            os.close(stdin_w)
            os.close(stdout_r)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        if len(msg) != 4 or len(fds) != 1:
            for fd in (*fds, stdin_w, stdout_r):
                os.close(fd)
            raise OSError(errno.ECHILD, "the guest zygote could not fork")
        return GuestHandle(struct.unpack("i", msg)[0], fds[0], stdin_w, stdout_r)

    def _start(self) -> None:
        if self._spawner is None:
            self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rockroll-zygote")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = self._spawner.submit(
                subprocess.Popen, [sys.executable, "-S", "-E", MAIN, "zygote"], stdin=theirs, env={},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, cwd="/").result()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours

    def _stop(self) -> None:
        for ready in self._ready.values():
            ready.clear()  # their pipes close with them: they exit
        sock, proc, self._sock, self.proc = self._sock, self.proc, None, None
        if sock is not None:
            sock.close()  # EOF: the zygote exits (its guests run on)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


_zygote = Zygote()


def zygote_pid() -> int | None:
    """The pid of this process's zygote, if one runs (tests check it dies with us)."""
    proc = _zygote.proc
    return proc.pid if proc is not None and proc.poll() is None else None


def own_pid_ns(cfg: GuestConfig) -> bool:
    """Whether a guest of ``cfg`` is forked as pid 1 of its own pid namespace, one
    process (``guest/__init__.py``'s lifecycle): root on the local backend. Not in a user namespace
    (the zygote could not make one) nor in enter mode (the guest joins a container's)."""
    return not cfg.userns and cfg.enter_pid is None and os.geteuid() == 0


def fork_guest(pid_ns: bool) -> GuestHandle:
    """A generic guest process, waiting for its config (``start_guest``); ``pid_ns``: as
    ``own_pid_ns`` says of the config it will get."""
    return _zygote.take(pid_ns)


def start_guest(cfg: GuestConfig, proc: GuestHandle | None = None) -> GuestHandle:
    """A guest process configured by ``cfg`` (``proc``, from ``fork_guest``, or a new
    one): its stdin/stdout carry the protocol. Every guest gets the syscall filter here,
    whatever its deployment."""
    proc = proc or _zygote.take(own_pid_ns(cfg))
    # The config travels as the first frame, not argv: argv is readable in the sandbox.
    proc.stdin.write(dataclasses.replace(cfg, seccomp=bpf_program().hex()).frame())
    proc.stdin.flush()
    return proc


class GuestProcess:
    """One sandbox's current guest: started from a config, its host pids recorded in
    ``<dir>/guest.json`` (the reaper kills them after a crash of the owner), killed
    with the whole pid namespace. Deployments hold one (composition), each adding
    where the guest runs."""

    def __init__(self, record_dir: Path):
        self.dir = record_dir
        self.proc: GuestHandle | None = None
        self.init_pid: int | None = None
        self.init_start: int | None = None

    def start(self, cfg: GuestConfig, proc: GuestHandle | None = None) -> GuestHandle:
        """Start the guest with ``cfg``, in ``proc`` (from ``fork_guest``) if given."""
        self.proc = start_guest(cfg, proc)
        return self.proc

    def record(self, init_pid: int) -> None:
        """Remember the guest's host pids so a later run can reap them after a crash."""
        self.init_pid = init_pid
        self.init_start = proc_start_time(init_pid)
        pids = {"outer_pid": self.proc.pid, "outer_start": proc_start_time(self.proc.pid),
                "init_pid": init_pid, "init_start": proc_start_time(init_pid)}
        (self.dir / "guest.json").write_text(json.dumps(pids))

    def stop(self, then: Callable[[], None] | None = None) -> GuestHandle | None:
        """Kill the current guest (and with it its pid namespace) without blocking; reap
        it in the background, then run ``then``. Returns the process stopped, if any."""
        proc, init_pid, init_start = self.proc, self.init_pid, self.init_start
        self.proc, self.init_pid = None, None
        if proc is None:
            return None
        # A dead init's pid may already belong to someone else: check before killing.
        if init_pid and proc_start_time(init_pid) == init_start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init_pid, signal.SIGKILL)
        proc.kill()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        threading.Thread(target=_reap, args=(proc, then), daemon=True).start()
        return proc

    def kill(self) -> None:
        """Stop the guest and wait (bounded) until it is gone."""
        proc = self.stop()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _reap(proc: GuestHandle, then: Callable[[], None] | None) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    if then is not None:
        then()
