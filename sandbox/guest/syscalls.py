"""The system calls pid 1 needs and Python lacks (through libc, ``ctypes``), and the
capability set and syscall filter every sandbox process ends under."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
SYS_PIVOT_ROOT = 155  # x86_64
# Joined in this order in enter mode; mnt last, because it changes what /proc/<pid> names.
ENTER_NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")
# Docker's default capability set: what a root user in a container normally needs,
# without SYS_ADMIN (mounts), MKNOD (devices), SYS_PTRACE, NET_RAW, SYS_MODULE, ...
KEEP_CAPS = (0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31)

libc = ctypes.CDLL(None, use_errno=True)
# Looked up here, once: ctypes resolves a function on its first use, and in each guest
# (a fork of the zygote) that first use would redo the lookup and dirty shared pages.
for _name in ("capset", "mount", "prctl", "setns", "syscall", "umount2", "unshare"):
    getattr(libc, _name)
del _name


def check(ret: int, what: str) -> int:
    """``ret`` of a libc call, or the ``OSError`` its errno names (``what`` failed)."""
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def fsbytes(s):
    """A path or string as libc takes it (None stays NULL)."""
    return None if s is None else os.fsencode(s)


def mount(src, target, fstype=None, flags=0, data=None) -> None:
    check(libc.mount(fsbytes(src), fsbytes(target), fsbytes(fstype), ctypes.c_ulong(flags), fsbytes(data)),
           f"mount {fstype or ''} {src} on {target}")


def bind(src: str, target: str, readonly: bool = False, extra: int = 0) -> None:
    mount(src, target, None, MS_BIND | MS_REC)
    if readonly or extra:
        flags = MS_REMOUNT | MS_BIND | (MS_RDONLY if readonly else 0) | extra
        mount(None, target, None, flags)


def unshare(flags: int) -> None:
    check(libc.unshare(ctypes.c_int(flags)), "unshare")


def enter_namespaces(pid: int) -> None:
    """Join the namespaces of process ``pid`` (this process's children join its pid ns).
    Every fd is opened before the first setns; setns(mnt) also moves root and cwd to
    that namespace's root, i.e. the container's filesystem."""
    fds = [os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in ENTER_NAMESPACES]
    try:
        for name, fd in zip(ENTER_NAMESPACES, fds):
            check(libc.setns(fd, 0), f"setns {name}")
    finally:
        for fd in fds:
            os.close(fd)
    os.chdir("/")


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and all its descendants (found through /proc). Each is stopped
    first, so none can fork a child that escapes the walk once its parent dies."""
    stopped: set[int] = set()
    while True:
        children: dict[int, list[int]] = {}
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            children.setdefault(int(data[data.rindex(b")") + 2:].split()[1]), []).append(int(name))
        tree, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid not in tree:
                tree.add(pid)
                todo += children.get(pid, [])
        if tree <= stopped:
            break
        for pid in tree - stopped:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped |= tree
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 40


# Read once, by the zygote (or a fresh guest) at import: each guest is a fork of it.
LAST_CAP = _last_cap()


def drop_capabilities() -> None:
    """Shrink the bounding, permitted and effective sets to KEEP_CAPS, for good."""
    for cap in range(LAST_CAP + 1):
        if cap not in KEEP_CAPS:
            check(libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), "capbset_drop")
    mask = sum(1 << c for c in KEEP_CAPS)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    data = (ctypes.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    check(libc.capset(header, data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program: bytes) -> None:
    """Put this process, and every process it starts, under the syscall filter
    ``program`` (a ``struct sock_filter`` array built on the host by
    ``deployment/seccomp.py``), for good. Non-dumpable first: the sandbox's commands run
    as the same user, and the filter allows ptrace, but not of the guest."""
    if not program or len(program) % 8:
        raise ValueError("no syscall filter in the configuration: refusing to run unfiltered")
    check(libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0), "dumpable")
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), "no_new_privs")
    check(libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


def loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifr))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))  # SIOCSIFFLAGS
    finally:
        s.close()


def reap_children(*_signal) -> list[tuple[int, int]]:
    """Reap every child that has exited (also a SIGCHLD handler: the zygote's); their
    ``(pid, wait status)``."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a terminal's: its leader's background
    jobs hold the terminal open after the leader exits)."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            if int(data[data.rindex(b")") + 2:].split()[3]) == sid:
                os.kill(int(name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def pivot_here(root: str) -> None:
    """Make ``root`` this process's root and detach the old one: pivot_root(".", ".")
    stacks the old root under the new one; detaching it leaves no path back to the
    host's filesystem (runc uses the same trick)."""
    os.chdir(root)
    check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
