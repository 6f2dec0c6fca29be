"""The fork server: one interpreter per owner process that has imported the guest once
and forks a guest per request."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import struct

from .main import main
from .syscalls import CLONE_NEWPID, libc, reap_children


def zygote() -> None:
    """The fork server (``deployment/process.py`` starts one per owner process): an
    interpreter that has imported the guest once and forks a guest per request, so a
    create costs a fork (about a millisecond of CPU) instead of a fresh interpreter
    (35 ms: start-up, imports, compiling this file).

    Its stdin is a SOCK_SEQPACKET socket to the owner. Each request is one message,
    ``f`` (a plain fork) or ``p`` (the child is pid 1 of a new pid namespace), carrying
    two fds (the new guest's stdin and stdout pipes); the reply carries the child's pid
    and a pidfd of it, so the owner can wait for a process that is not its child. For
    ``p`` the zygote unshares a pid namespace for its next child only, and returns to its
    own right after the fork (``setns``); if it cannot return, it exits rather than fork
    a later guest into a sandbox's namespace.

    The zygote never sees a sandbox's configuration (the owner writes it into the child's
    stdin, as to any guest), so nothing of one sandbox is in the memory the next one
    inherits; its environment is empty, its children keep none of its fds (only the two
    pipes, as 0 and 1, and stderr), and each joins its own cgroups in ``main``. It dies
    with its owner: PR_SET_PDEATHSIG, and EOF on the socket; it reaps its children."""
    parent = os.getppid()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    sock = socket.socket(fileno=os.dup(0))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir("/")
    signal.signal(signal.SIGCHLD, reap_children)
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    gc.freeze()  # the imported modules' objects stay shared with every child (no GC writes)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 16, 2)
        except OSError:
            os._exit(1)
        if not msg:  # the owner is gone
            os._exit(0)
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            sock.send(b"")  # refused: the owner raises
            continue
        # SIGCHLD held until the pidfd is open: a child that dies at once must not be
        # reaped (and its pid reused) before the pidfd pins it.
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        new_pid_ns = msg == b"p" and _unshare_pid_ns()
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                os.closerange(3, 65536)  # the owner's socket, the pipes' originals
                main()
            finally:
                os._exit(1)
        if new_pid_ns and libc.setns(own_pid_ns, CLONE_NEWPID) != 0:
            os._exit(1)  # the owner starts a new zygote; its guests run on
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid) if pid > 0 else None
        except OSError:
            pidfd = None
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        if pidfd is None:
            sock.send(b"")  # refused: the owner raises
            continue
        try:
            socket.send_fds(sock, [struct.pack("i", pid)], [pidfd])
        finally:
            os.close(pidfd)


def _unshare_pid_ns() -> bool:
    """Whether the next child will be pid 1 of a new pid namespace (needs CAP_SYS_ADMIN;
    without it the child finds it is not pid 1 and starts an outer process's way)."""
    return libc.unshare(ctypes.c_int(CLONE_NEWPID)) == 0
