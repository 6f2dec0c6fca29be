"""The in-sandbox agent: pid 1 of a sandbox's namespaces, keeper of its bash sessions.

Started by the host as ``python -S -E _agent.py`` with its stdin/stdout as the
request/response channel; the first frame on stdin is the sandbox's configuration (not
argv, which any process in the sandbox could read). Standard library only, because after ``pivot_root`` the
host's Python files are out of reach: everything the agent needs is imported *before*
the root changes, and nothing is imported lazily afterwards.

Lifecycle
1. (host namespaces) join the sandbox's cgroups, apply rlimits, unshare mount/uts/ipc/net
   (and user, when not root), mount the sized writable layer (``disk_mb``,
   ``mount_layer``). The agent is pid 1 of a new pid namespace: when it dies, the kernel
   kills every process of the sandbox, so nothing can outlive it.
2. (init) build the root: overlayfs of the image layers and a private upper dir,
   read-only binds, a private /dev and /proc; ``pivot_root`` into it; bring up
   loopback; drop capabilities to Docker's default set and set no_new_privs; install
   the syscall filter (config key ``seccomp``, see ``deployment/seccomp.py``), which
   every process of the sandbox inherits.
3. (init) serve framed requests until stdin closes (the host died or closed us).

One process or two. As root the zygote forks the agent as pid 1 of a pid namespace of
its own (request ``p``, ``zygote``), and one process does 1 and 2: a single fork per
sandbox, and the setup's pages are copied from the zygote once. Otherwise (a user
namespace: an unprivileged zygote cannot make a pid namespace without one of its own,
which every sandbox would then share) an *outer* process does 1, unsharing the pid
namespace too, and stays in the layer; it forks init (2, 3), reports init's host pid
(``spawned``) and waits for it. ``ready`` says ``one_process`` in the first case.

Enter mode (the docker backend, config key ``enter_pid``): instead of unsharing, the
outer process joins the cgroups and the ipc/uts/net/pid/mnt namespaces of a running
container's pid 1 with ``setns(2)``; its child is then a process of the container (not
its pid 1: the container's keep-alive is), drops capabilities as above, builds a root
only for a disk limit (an overlay of the container's root and the sized layer,
``layer_root``), and installs the filter as above. The image needs no Python: the agent
brought everything it needs from the host.

Protocol: each frame is ``>II`` (header length, payload length) + JSON header + payload.
Requests carry an ``id``; every response echoes it, so many requests (commands in
different sessions) can be in flight at once.

Model channel (config key ``model``, see ``runtime/model_channel.py`` for the design): the
agent listens on ``127.0.0.1:<port>`` in the sandbox's own network namespace and carries
every accepted connection's bytes as ``mc_open`` / ``mc_data`` / ``mc_close`` frames (key
``conn``) over this same stdin/stdout; the host pipes them to the model service. No
network device is added: the sandbox reaches nothing else.

Sessions: each session is a persistent ``bash`` reading one-word operations from a
pipe. A command runs in a forked subshell with job control on (``set -m``), so it is
its own process group: a timeout kills that group and the session survives. On exit the
subshell writes its exported variables and cwd to a state file that the session shell
sources, which is how ``cd`` and ``export`` persist between calls.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import gc
import io
import os
import posixpath
import resource  # imported by the zygote: loading this extension module in each agent cost ~110 page faults
import selectors
import shlex
import signal
import socket
import stat
import struct
import tarfile
import time

from ..protocol.frames import PREPARE_NET, PROTOCOL_VERSION, FrameReader, GuestConfig, encode_frame

# --------------------------------------------------------------------------- uploads


def extract_tar(payload: bytes, dest: str) -> None:
    """Unpack an uploaded tar into ``dest``. Paths stay inside the sandbox root whatever
    they say, because this process's root *is* the sandbox root; within it, names and
    hardlink targets must stay inside ``dest`` (tarfile's ``FilterError`` otherwise)."""
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
        for member in tar:
            if member.isdev():
                continue
            if hasattr(tarfile, "tar_filter"):
                tar.extract(member, dest, numeric_owner=True, filter=_upload_filter)
            else:
                tar.extract(member, dest, numeric_owner=True)


def _upload_filter(member, dest: str):
    """tarfile's "tar" filter, which checks names but not hardlink targets: a hardlink to a
    file outside ``dest`` would let a later member of the same name write through it."""
    member = tarfile.tar_filter(member, dest)
    if member.islnk():
        root = os.path.realpath(dest)
        target = os.path.realpath(os.path.join(root, member.linkname))
        if os.path.commonpath([root, target]) != root:
            raise tarfile.LinkOutsideDestinationError(member, target)
    return member


# --------------------------------------------------------------------------- syscalls

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

_libc = ctypes.CDLL(None, use_errno=True)
# Looked up here, once: ctypes resolves a function on its first use, and in each agent
# (a fork of the zygote) that first use would redo the lookup and dirty shared pages.
for _name in ("capset", "mount", "prctl", "setns", "syscall", "umount2", "unshare"):
    getattr(_libc, _name)
del _name


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _b(s):
    return None if s is None else os.fsencode(s)


def mount(src, target, fstype=None, flags=0, data=None) -> None:
    _check(_libc.mount(_b(src), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           f"mount {fstype or ''} {src} on {target}")


def bind(src: str, target: str, readonly: bool = False, extra: int = 0) -> None:
    mount(src, target, None, MS_BIND | MS_REC)
    if readonly or extra:
        flags = MS_REMOUNT | MS_BIND | (MS_RDONLY if readonly else 0) | extra
        mount(None, target, None, flags)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def enter_namespaces(pid: int) -> None:
    """Join the namespaces of process ``pid`` (this process's children join its pid ns).
    Every fd is opened before the first setns; setns(mnt) also moves root and cwd to
    that namespace's root, i.e. the container's filesystem."""
    fds = [os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in ENTER_NAMESPACES]
    try:
        for name, fd in zip(ENTER_NAMESPACES, fds):
            _check(_libc.setns(fd, 0), f"setns {name}")
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


# Read once, by the zygote (or a fresh agent) at import: each agent is a fork of it.
LAST_CAP = _last_cap()


def drop_capabilities() -> None:
    """Shrink the bounding, permitted and effective sets to KEEP_CAPS, for good."""
    for cap in range(LAST_CAP + 1):
        if cap not in KEEP_CAPS:
            _check(_libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), "capbset_drop")
    mask = sum(1 << c for c in KEEP_CAPS)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    data = (ctypes.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program: bytes) -> None:
    """Put this process, and every process it starts, under the syscall filter
    ``program`` (a ``struct sock_filter`` array built on the host by
    ``deployment/seccomp.py``), for good. Non-dumpable first: the sandbox's commands run
    as the same user, and the filter allows ptrace, but not of the agent."""
    if not program or len(program) % 8:
        raise ValueError("no syscall filter in the configuration: refusing to run unfiltered")
    _check(_libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0), "dumpable")
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), "no_new_privs")
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


def loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifr))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))  # SIOCSIFFLAGS
    finally:
        s.close()


# --------------------------------------------------------------------------- writable layer

SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT = 429, 430, 431, 432  # x86_64
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 0, 1, 6
MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 4, -100
# On a sized layer: the overlay's upper and work dirs, and the mount point of the
# sandbox's root (``GuestConfig.rootfs``), so a create makes no directory on the host's disk.
LAYER_DIRS = ("upper", "work", "root")


def detached_mount(fstype: str, options: list[tuple[str, str | None]]) -> int:
    """A new ``fstype`` filesystem with ``options`` (a value, or None for a flag) as a
    detached mount (the new mount API), made by the host ahead of time
    (``deployment/disk.py``); ``mount_layer`` attaches it."""
    fs = _check(_libc.syscall(SYS_FSOPEN, _b(fstype), 1), "fsopen")  # FSOPEN_CLOEXEC
    try:
        for key, value in options:
            cmd = FSCONFIG_SET_FLAG if value is None else FSCONFIG_SET_STRING
            _check(_libc.syscall(SYS_FSCONFIG, fs, cmd, _b(key), _b(value), 0), f"fsconfig {key}")
        _check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
        return _check(_libc.syscall(SYS_FSMOUNT, fs, 1, 0), "fsmount")  # FSMOUNT_CLOEXEC
    finally:
        os.close(fs)


def detached_layer(device: str) -> int:
    """The ext4 layer on loop ``device`` as a detached mount. ``discard``: deleted files
    punch holes back into the sparse image."""
    return detached_mount("ext4", [("source", device), ("discard", None), ("noinit_itable", None)])


def open_layer(cfg: GuestConfig) -> int | None:
    """The host's detached mount of the sandbox's layer (``cfg.disk.mount``, a
    ``/proc/<host pid>/fd/<n>`` path), reopened here; None for a tmpfs layer or none.
    Runs first, while the host's /proc is this process's."""
    path = cfg.disk.mount if cfg.disk else None
    return os.open(path, os.O_PATH | os.O_CLOEXEC) if path else None


def mount_layer(cfg: GuestConfig, detached: int | None) -> None:
    """Mount the sandbox's sized writable layer (``cfg.disk``, see
    ``deployment/disk.py``: the host's mount ``detached``, ext4 or tmpfs, or a tmpfs of
    ours) in this process's new mount namespace, with the overlay's upper and work dirs
    on it, and stay in it: the host reads the upper layer through its own fd on a mount
    it made, else through ``/proc/<this pid>/cwd`` (an outer process's: init leaves it)."""
    disk = cfg.disk
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may propagate to the host
    where = disk.dir
    os.makedirs(where, exist_ok=True)
    if detached is not None:
        _check(_libc.syscall(SYS_MOVE_MOUNT, detached, b"", AT_FDCWD, _b(where), MOVE_MOUNT_F_EMPTY_PATH),
               "move_mount")
        os.close(detached)
    else:  # the host made these dirs on its mounts (``disk.new_disk``, ``disk.new_tmpfs``)
        mount("tmpfs", where, "tmpfs", 0, disk.tmpfs)
        for name in LAYER_DIRS:
            os.mkdir(f"{where}/{name}")
            os.chmod(f"{where}/{name}", 0o755)  # whatever the umask
    os.chdir(where)
    cfg.upper, cfg.work = f"{where}/upper", f"{where}/work"


def _root_children() -> list[str]:
    """Mount points directly under ``/`` (docker's /proc, /dev, /sys, /etc/hosts, ...),
    in mount order."""
    rows = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            rows.append((fields[0], fields[1], fields[4].replace("\\040", " ")))
    root_ids = {mid for mid, _, point in rows if point == "/"}
    return [point for mid, parent, point in rows if parent in root_ids and mid not in root_ids]


def layer_root(cfg: GuestConfig) -> None:
    """Enter mode with a disk limit: make the sandbox's root an overlay of the container's
    root (lower) and the sized layer (upper), with the container's other mounts bound in
    again, and pivot into it. The container's own writable layer stays empty."""
    layer = cfg.disk.dir
    children = [p for p in _root_children() if p != layer]
    lower, root = layer + "/lower", layer + "/root"
    for path in (lower, root):
        os.makedirs(path, exist_ok=True)  # a layer the host made has root/ already
    mount("/", lower, None, MS_BIND)  # the root mount alone, not what is mounted on it
    mount("overlay", root, "overlay", 0, "lowerdir=%s,upperdir=%s,workdir=%s" % (lower, cfg.upper, cfg.work))
    for point in children:
        mount(point, root + point, None, MS_BIND | MS_REC)
    if os.path.ismount(root + layer):  # came along with /dev: the sandbox must not see it
        _check(_libc.umount2(_b(root + layer), MNT_DETACH), "umount layer copy")
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


# --------------------------------------------------------------------------- root filesystem

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
PROC_MASKED = ("kcore", "keys", "timer_list", "sysrq-trigger", "latency_stats", "sched_debug")
PROC_READONLY = ("sys", "bus", "fs", "irq")
STATE_DIR = "/dev/.rr"  # session state files: on /dev's tmpfs, so never in snapshots


def build_root(cfg: GuestConfig) -> None:
    """Mount the sandbox root at ``cfg.rootfs`` and pivot into it. Runs as init."""
    root = cfg.rootfs
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    opts = "lowerdir=%s,upperdir=%s,workdir=%s" % (":".join(cfg.lowers), cfg.upper, cfg.work)
    if cfg.userns:
        opts += ",userxattr"
    mount("overlay", root, "overlay", 0, opts)
    for src, dst, readonly in cfg.binds:
        target = root + dst
        if os.path.isdir(src):
            os.makedirs(target, exist_ok=True)
        # a file's mount point is already a regular file: its plan put it in a lower layer
        bind(src, target, readonly, MS_NOSUID | MS_NODEV)

    dev = root + "/dev"
    os.makedirs(dev, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=16m")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(f"{dev}/{name}", "w").close()
            bind("/dev/" + name, f"{dev}/{name}")
    for sub in ("pts", "shm", ".rr"):
        os.makedirs(f"{dev}/{sub}", exist_ok=True)
    os.chmod(f"{dev}/.rr", 0o700)
    try:
        mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        os.symlink("pts/ptmx", f"{dev}/ptmx")
    except OSError:
        pass  # no pty support: sessions do not need one
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")

    proc = root + "/proc"
    os.makedirs(proc, exist_ok=True)
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_MASKED:
        if os.path.exists(f"{proc}/{name}"):
            bind(f"{dev}/null", f"{proc}/{name}")
    for name in PROC_READONLY:
        if os.path.isdir(f"{proc}/{name}"):
            bind(f"{proc}/{name}", f"{proc}/{name}", readonly=True)

    # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
    # no path back to the host's filesystem (runc uses the same trick).
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


# --------------------------------------------------------------------------- sessions

# A session runs its script as ``bash bash <dir> <workdir>`` from inside STATE_DIR, and a
# command is read and eval'ed by __rr_run (defined on line 1), never sourced from its file:
# a shell names the script or sourced file a failing command is in, with a line number
# counted from the eval's line, and "/dev/.rr/s1/cmd: line 1: x: command not found" showed
# our path. This way it reads as `bash -c` would say it ("bash: line 3: x: command not
# found"). __rr_run exits the command's subshell itself, so the EXIT trap saves the state
# while the function's scope (a `declare -x` in the command) still holds.
SESSION_SCRIPT = r"""__rr_run() { eval "$__rr_c"; exit; }; __rr_pre() { eval "$__rr_p"; }
# rockroll session: reads one-word operations from stdin; see _agent.py
__rr_d=$1
cd -- "$2" || exit 127
set -m
echo 0 >/proc/self/oom_score_adj
[ -f "$__rr_d/init" ] && . "$__rr_d/init"
while IFS= read -r __rr_op; do
  case $__rr_op in
  run|runx)
    : >"$__rr_d/state"
    ( trap '{ export -p; printf "cd -- %q\n" "$PWD"; } >"$__rr_d/state"' EXIT
      printf 'pid %s\n' "$BASHPID" >&3
      exec 3>&-
      IFS= read -r -d '' __rr_c <"$__rr_d/cmd"
      if [ "$__rr_op" = runx ]; then IFS= read -r -d '' __rr_p <"$__rr_d/pre"; __rr_pre || exit; fi
      __rr_run
    ) </dev/null >&5 2>&6
    __rr_rc=$?
    if [ "$__rr_op" = run ] && [ -s "$__rr_d/state" ]; then
      # $(<f) reads without forking: reload only when cwd or exports changed
      __rr_new=$(<"$__rr_d/state")
      if [ "$__rr_new" != "$__rr_last" ]; then
        compgen -e >"$__rr_d/names"
        mapfile -t __rr_names <"$__rr_d/names"
        unset "${__rr_names[@]}"
        . "$__rr_d/state"
        __rr_last=$__rr_new
      fi
    fi
    printf 'done %s\n' "$__rr_rc" >&3 ;;
  dump)
    { export -p; printf "cd -- %q\n" "$PWD"; } >"$__rr_d/dump"
    printf 'dumped\n' >&3 ;;
  esac
done
"""

# The same protocol for images without bash (dash, busybox ash): no $BASHPID (the pid
# comes from /proc/self/stat, read by the subshell itself), no %q (export -p quotes the
# cwd for us), no compgen/mapfile (exported names are parsed from export -p). Without a
# tty these shells turn job control off, so a command is not its own process group: a
# timeout kills its process tree instead (see Session.kill_current).
SESSION_SCRIPT_SH = r"""__rr_run() { eval "$__rr_c"; exit; }; __rr_pre() { eval "$__rr_p"; }
# rockroll session (POSIX sh): reads one-word operations from stdin; see _agent.py
__rr_d=$1
cd -- "$2" || exit 127
echo 0 >/proc/self/oom_score_adj
__rr_save() {
  __rr_pwd=$PWD; export __rr_pwd
  export -p; echo 'cd -- "$__rr_pwd"; unset __rr_pwd'
}
__rr_cat() {  # a file's text without cat, which a minimal image may lack
  while IFS= read -r __rr_l; do printf '%s\n' "$__rr_l"; done <"$1"
}
__rr_unexport() {  # unset every exported variable; the state re-exports the survivors
  export -p >"$__rr_d/names"
  while IFS= read -r __rr_l; do
    case $__rr_l in
    "export "*) __rr_n=${__rr_l#export }; __rr_n=${__rr_n%%=*}
      case $__rr_n in ''|__rr_*|*[!A-Za-z0-9_]*) ;; *) command unset "$__rr_n" 2>/dev/null ;; esac ;;
    esac
  done <"$__rr_d/names"
}
[ -f "$__rr_d/init" ] && . "$__rr_d/init"
while IFS= read -r __rr_op; do
  case $__rr_op in
  run|runx)
    : >"$__rr_d/state"
    ( trap '__rr_save >"$__rr_d/state"' EXIT
      read -r __rr_st </proc/self/stat
      printf 'pid %s\n' "${__rr_st%% *}" >&3
      exec 3>&-
      __rr_c=$(__rr_cat "$__rr_d/cmd")
      if [ "$__rr_op" = runx ]; then __rr_p=$(__rr_cat "$__rr_d/pre"); __rr_pre || exit; fi
      __rr_run
    ) </dev/null >&5 2>&6
    __rr_rc=$?
    if [ "$__rr_op" = run ] && [ -s "$__rr_d/state" ]; then
      __rr_unexport
      . "$__rr_d/state"
    fi
    printf 'done %s\n' "$__rr_rc" >&3 ;;
  dump)
    __rr_save >"$__rr_d/dump"; unset __rr_pwd
    printf 'dumped\n' >&3 ;;
  esac
done
"""


class Command:
    """A command in flight in a session."""

    def __init__(self, req_id, max_output: int, timeout: float | None):
        self.req_id = req_id
        self.max_output = max_output
        self.start = time.monotonic()
        self.deadline = self.start + timeout if timeout else None
        self.out, self.err = bytearray(), bytearray()
        self.truncated = False
        self.pgid = None
        self.timed_out = False
        self.cancelled = False  # the host gave up on it (a client went away): kill, as a timeout

    def append(self, buf: bytearray, data: bytes) -> None:
        room = self.max_output - len(buf)
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        buf += data


class Session:
    def __init__(self, agent: "Agent", name: str, index: int, init_state: str | None):
        self.agent, self.name = agent, name
        self.dir = f"{STATE_DIR}/s{index}"
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        if init_state:
            with open(f"{self.dir}/init", "w") as f:
                f.write(init_state)
        ctl_r, ctl_w = os.pipe()
        st_r, st_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: wire the fds bash expects and exec
            try:
                # Python ignores SIGPIPE and SIGXFSZ; an ignored signal survives exec, so
                # `yes | head` would print "Broken pipe" instead of dying quietly.
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                null = os.open("/dev/null", os.O_RDWR)
                # Park the sources above the targets first, so no dup2 clobbers one.
                wanted = [(os.dup2(src, 100 + i), dst) for i, (src, dst) in
                          enumerate(((ctl_r, 0), (null, 1), (null, 2), (st_w, 3), (out_w, 5), (err_w, 6)))]
                for src, dst in wanted:
                    os.dup2(src, dst)
                os.close(4)  # may be open or not: closerange below does the rest
            except OSError:
                pass
            try:
                os.closerange(7, 65536)
                os.chdir(STATE_DIR)  # the script's relative name is what a failed command shows
                os.execve(agent.shell, [agent.shell, *agent.shell_args, agent.shell_name, self.dir,
                                        agent.workdir], agent.env)
            finally:
                os._exit(127)
        for fd in (ctl_r, st_w, out_w, err_w):
            os.close(fd)
        self.pid = pid
        self.ctl, self.status, self.outfd, self.errfd = ctl_w, st_r, out_r, err_r
        for fd in (st_r, out_r, err_r):
            os.set_blocking(fd, False)
        self.status_buf = b""
        self.queue: list[tuple[dict, bytes]] = []
        self.current: Command | None = None
        self.waiting_dump = []
        self.dead = False
        sel = agent.sel
        sel.register(st_r, selectors.EVENT_READ, (self.on_status, None))
        sel.register(out_r, selectors.EVENT_READ, (self.on_output, "out"))
        sel.register(err_r, selectors.EVENT_READ, (self.on_output, "err"))

    # --- requests
    def submit(self, req: dict) -> None:
        self.queue.append(req)
        self.pump()

    def pump(self) -> None:
        if self.current is not None or self.dead:
            return
        while self.queue:
            req = self.queue.pop(0)
            if req["op"] == "dump":
                self.waiting_dump.append(req["id"])
                self._send(b"dump\n")
                self.current = Command(req["id"], 0, None)
                self.current.is_dump = True
                self.current.stream = False
                return
            with open(f"{self.dir}/cmd", "w") as f:
                f.write(req["cmd"])
                f.write("\n")
            pre = []
            if req.get("cwd"):
                pre.append("cd -- " + shlex.quote(req["cwd"]))
            for k, v in (req.get("env") or {}).items():
                pre.append(f"export {k}={shlex.quote(str(v))}")
            if pre:
                with open(f"{self.dir}/pre", "w") as f:
                    f.write(" &&\n".join(pre) + "\n")
            self.current = Command(req["id"], int(req.get("max_output", 1 << 20)), req.get("timeout"))
            self.current.is_dump = False
            self.current.stream = bool(req.get("stream"))
            self._send(b"runx\n" if pre else b"run\n")
            return

    def _send(self, data: bytes) -> None:
        try:
            os.write(self.ctl, data)
        except OSError:
            self.on_dead()

    # --- events
    def on_output(self, kind: str) -> None:
        fd = self.outfd if kind == "out" else self.errfd
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.agent.sel.unregister(fd)
            return
        cmd = self.current
        if cmd is not None and not cmd.is_dump:
            cmd.append(cmd.out if kind == "out" else cmd.err, data)
            if cmd.stream:  # live output for a watcher; the final reply still has it all
                self.agent.reply({"id": cmd.req_id, "chunk": kind}, data)

    def drain(self) -> None:
        for kind, fd in (("out", self.outfd), ("err", self.errfd)):
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                self.current.append(self.current.out if kind == "out" else self.current.err, data)
                if self.current.stream:
                    self.agent.reply({"id": self.current.req_id, "chunk": kind}, data)

    def on_status(self, _arg) -> None:
        try:
            data = os.read(self.status, 4096)
        except BlockingIOError:
            return
        if not data:
            self.on_dead()
            return
        self.status_buf += data
        while b"\n" in self.status_buf:
            line, self.status_buf = self.status_buf.split(b"\n", 1)
            self.on_line(line.decode(errors="replace"))

    def on_line(self, line: str) -> None:
        cmd = self.current
        if cmd is None:
            return
        word, _, arg = line.partition(" ")
        if word == "pid":
            cmd.pgid = int(arg)
            if cmd.timed_out or cmd.cancelled:  # asked before its group existed
                self.kill_current()
        elif word == "done" and not cmd.is_dump:
            self.drain()
            self.current = None
            self.agent.reply({"id": cmd.req_id, "ok": True, "exit_code": int(arg),
                              "timed_out": cmd.timed_out, "truncated": cmd.truncated,
                              "duration_s": time.monotonic() - cmd.start,
                              "nout": len(cmd.out)}, bytes(cmd.out) + bytes(cmd.err))
            self.pump()
        elif word == "dumped" and cmd.is_dump:
            self.current = None
            try:
                state = open(f"{self.dir}/dump").read()
            except OSError:
                state = ""
            self.agent.reply({"id": cmd.req_id, "ok": True, "state": state})
            self.pump()

    def check_deadline(self, now: float) -> float | None:
        cmd = self.current
        if cmd is None or cmd.deadline is None or cmd.timed_out:
            return None
        if now >= cmd.deadline:
            cmd.timed_out = True
            self.kill_current()
            return None
        return cmd.deadline

    def cancel(self, req_id) -> bool:
        """Kill request ``req_id``'s command if it runs here, or drop it if still queued."""
        cmd = self.current
        if cmd is not None and cmd.req_id == req_id and not cmd.is_dump:
            cmd.cancelled = True
            self.kill_current()
            return True
        for req in self.queue:
            if req.get("id") == req_id and req["op"] == "run":
                self.queue.remove(req)
                self.agent.reply({"id": req_id, "ok": False, "error": "SessionError", "message": "cancelled"})
                return True
        return False

    def kill_current(self) -> None:
        cmd = self.current
        if cmd is not None and cmd.pgid:
            try:
                os.killpg(cmd.pgid, signal.SIGKILL)
            except ProcessLookupError:  # sh without job control: the command leads no group
                kill_tree(cmd.pgid)

    def on_dead(self) -> None:
        if self.dead:
            return
        self.dead = True
        for fd in (self.status, self.outfd, self.errfd):
            try:
                self.agent.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        os.close(self.ctl)
        pending = ([self.current.req_id] if self.current else []) + [r["id"] for r in self.queue]
        for req_id in pending:
            self.agent.reply({"id": req_id, "ok": False, "error": "SessionError",
                              "message": f"session {self.name!r} died"})
        self.current, self.queue = None, []
        self.agent.sessions.pop(self.name, None)

    def close(self) -> None:
        self.kill_current()  # the running command leads a process group of its own
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.on_dead()


# --------------------------------------------------------------------------- model channel


MODEL_MAX_CONNS = 256


class ModelChannel:
    """The in-sandbox end of the model endpoint: a loopback listener whose connections
    travel as frames to the host (no network namespace is opened for them)."""

    def __init__(self, agent: "Agent", port: int):
        self.agent = agent
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.conns: dict[int, socket.socket] = {}
        self.pending: dict[int, bytearray] = {}   # bytes for a connection that could not take them yet
        self.closing: set[int] = set()            # the host closed: close once pending is written
        self.counter = 0
        agent.sel.register(self.listener, selectors.EVENT_READ, (self.on_accept, None))

    def on_accept(self, _arg) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(self.conns) >= MODEL_MAX_CONNS:  # each is a host socket too: bounded per sandbox
            conn.close()
            return
        conn.setblocking(False)
        # The service's answer arrives in pieces (headers, then body) and is written as it
        # comes: with Nagle's algorithm on, the body would wait for the client's delayed ACK
        # of the headers (40 ms per call on a keep-alive connection). Servers set this too.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.counter += 1
        cid = self.counter
        self.conns[cid] = conn
        self.agent.sel.register(conn, selectors.EVENT_READ, (self.on_read, cid))
        self.agent.reply({"op": "mc_open", "conn": cid})

    def on_read(self, cid: int) -> None:
        conn = self.conns.get(cid)
        if conn is None:
            return
        try:
            data = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.agent.reply({"op": "mc_data", "conn": cid}, data)
        else:
            self.drop(cid)
            self.agent.reply({"op": "mc_close", "conn": cid})

    def on_host(self, req: dict, payload: bytes) -> None:
        """A frame from the host for connection ``conn``: data to write, or close."""
        cid = req.get("conn")
        if cid not in self.conns:
            return
        if req["op"] == "mc_data":
            self.pending.setdefault(cid, bytearray()).extend(payload)
        else:
            self.closing.add(cid)
        self.on_write(cid)

    def on_write(self, cid: int) -> None:
        conn, buf = self.conns.get(cid), self.pending.get(cid)
        if conn is None:
            return
        while buf:
            try:
                n = conn.send(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.drop(cid)
                self.agent.reply({"op": "mc_close", "conn": cid})
                return
            del buf[:n]
        if buf:  # watch for room as well as for data
            self.agent.sel.modify(conn, selectors.EVENT_READ | selectors.EVENT_WRITE, (self.on_event, cid))
        elif cid in self.closing:
            self.drop(cid)
        else:
            self.agent.sel.modify(conn, selectors.EVENT_READ, (self.on_read, cid))

    def on_event(self, cid: int) -> None:
        self.on_write(cid)
        if cid in self.conns:
            self.on_read(cid)

    def drop(self, cid: int) -> None:
        conn = self.conns.pop(cid, None)
        self.pending.pop(cid, None)
        self.closing.discard(cid)
        if conn is not None:
            self.agent.sel.unregister(conn)
            conn.close()


# --------------------------------------------------------------------------- agent


class Agent:
    def __init__(self, cfg: GuestConfig):
        self.cfg = cfg
        self.workdir = cfg.workdir
        bash = os.path.exists("/bin/bash")
        self.shell = "/bin/bash" if bash else "/bin/sh"
        self.shell_args = ["--noprofile", "--norc"] if bash else []
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "TERM": "dumb",
            "HOSTNAME": cfg.hostname,
        }
        self.env.update(cfg.env)
        model_env = cfg.model.env if cfg.model else {}
        self.env.update(model_env)
        # The model variables are this sandbox's own: they win over a restored session's
        # exports (a snapshot of another sandbox carries that sandbox's key).
        self.forced_exports = "".join(f"export {k}={shlex.quote(v)}\n"
                                      for k, v in model_env.items())
        self.shell_name = "bash" if bash else "sh"
        with open(f"{STATE_DIR}/{self.shell_name}", "w") as f:
            f.write(SESSION_SCRIPT if bash else SESSION_SCRIPT_SH)
        self.sel = selectors.DefaultSelector()
        self.sessions: dict[str, Session] = {}
        self.session_states: dict[str, str] = dict(cfg.sessions)
        self.counter = 0
        self.reader = FrameReader()
        self.out_buf = bytearray()
        self.writing = False
        self.running = True
        self.model = ModelChannel(self, cfg.model.port) if cfg.model else None

    def reply(self, header: dict, payload: bytes = b"") -> None:
        self.out_buf += encode_frame(header, payload)
        self.flush()

    def flush(self) -> None:
        while self.out_buf:
            try:
                n = os.write(1, self.out_buf)
            except BlockingIOError:
                break
            del self.out_buf[:n]
        # Watch stdout for room only while a reply is waiting to go out.
        if self.out_buf and not self.writing:
            self.sel.register(1, selectors.EVENT_WRITE, (self.on_stdout, None))
            self.writing = True
        elif not self.out_buf and self.writing:
            self.sel.unregister(1)
            self.writing = False

    def on_stdout(self, _arg) -> None:
        self.flush()

    def session(self, name: str) -> Session:
        s = self.sessions.get(name)
        if s is None or s.dead:
            self.counter += 1
            state = self.session_states.pop(name, None)
            if state and self.forced_exports:
                state += "\n" + self.forced_exports
            s = Session(self, name, self.counter, state)
            self.sessions[name] = s
        return s

    def on_stdin(self, _arg) -> None:
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not data:  # the host is gone: take the whole sandbox down with us
            self.running = False
            return
        self.reader.feed(data)
        for header, payload in self.reader.frames():
            self.handle(header, payload)

    def handle(self, req: dict, payload: bytes) -> None:
        op = req.get("op")
        if op in ("mc_data", "mc_close"):
            if self.model is not None:
                self.model.on_host(req, payload)
            return
        try:
            if op in ("run", "dump"):
                self.session(req.get("session") or "default").submit(req)
                return
            handler = getattr(self, "op_" + str(op), None)
            if handler is None:
                raise ValueError(f"unknown op {op!r}")
            result = handler(req, payload)
            header, body = result if isinstance(result, tuple) else (result, b"")
            self.reply({"id": req.get("id"), "ok": True, **header}, body)
        except OSError as e:
            self.reply({"id": req.get("id"), "ok": False, "error": "SandboxFileError",
                        "errno": e.errno, "message": f"{e.strerror or e}: {req.get('path', '')}"})
        except Exception as e:  # noqa: BLE001 - report, never die on a bad request
            self.reply({"id": req.get("id"), "ok": False, "error": type(e).__name__, "message": str(e)})

    # --- simple operations
    def op_ping(self, req, payload):
        return {"pid": os.getpid(), "version": PROTOCOL_VERSION, "sessions": sorted(self.sessions)}

    def op_cancel(self, req, payload):
        # The host's caller stopped waiting for a run (an SSE client disconnected, a task was
        # cancelled): its process group dies now instead of running on unwatched.
        return {"cancelled": any(s.cancel(req["target"]) for s in list(self.sessions.values()))}

    def op_close_session(self, req, payload):
        s = self.sessions.get(req["session"])
        if s:
            s.close()
        return {}

    def op_write(self, req, payload):
        path = req["path"]
        os.makedirs(posixpath.dirname(path) or "/", exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if req.get("truncate", True) else 0)
        fd = os.open(path, flags, req.get("mode", 0o644))
        try:
            os.lseek(fd, req.get("offset", 0), os.SEEK_SET)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if "mode" in req:
                os.fchmod(fd, req["mode"])
        finally:
            os.close(fd)
        return {"size": len(payload)}

    def op_read(self, req, payload):
        fd = os.open(req["path"], os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory")
            os.lseek(fd, req.get("offset", 0), os.SEEK_SET)
            want, chunks = req.get("length", 1 << 24), []
            while want > 0:
                chunk = os.read(fd, min(want, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                want -= len(chunk)
        finally:
            os.close(fd)
        return {"size": st.st_size}, b"".join(chunks)

    def op_stat(self, req, payload):
        try:
            st = os.stat(req["path"])
        except FileNotFoundError:
            return {"exists": False}
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        return {"exists": True, "type": kind, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode)}

    def op_tar_in(self, req, payload):
        extract_tar(payload, req["path"])
        return {}

    def op_tar_out(self, req, payload):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
            tar.add(req["path"], arcname=".", recursive=True)
        return {}, buf.getvalue()

    def op_shutdown(self, req, payload):
        self.running = False
        return {}

    # --- main loop
    def serve(self) -> None:
        os.set_blocking(0, False)
        os.set_blocking(1, False)
        self.sel.register(0, selectors.EVENT_READ, (self.on_stdin, None))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        while self.running:
            now = time.monotonic()
            deadlines = [d for s in list(self.sessions.values()) if (d := s.check_deadline(now))]
            timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
            for key, _ in self.sel.select(min(timeout, 1.0)):
                callback, arg = key.data
                callback(arg)
            self.reap()

    def reap(self) -> None:
        reap_children()  # pid 1 inherits every orphan in the sandbox: none may stay a zombie


def _setup_outer(cfg: GuestConfig, pid_ns: bool) -> None:
    """Runs in the host namespaces: cgroups, rlimits, namespaces (the pid namespace too
    when ``pid_ns``: an outer process's), the sized layer."""
    layer = open_layer(cfg)
    for path in cfg.cgroup_procs:
        with open(path, "w") as f:
            f.write("0")  # this process, whatever pid namespace it is in
    for res, soft, hard in cfg.rlimits:
        resource.setrlimit(res, (soft, hard))
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | (CLONE_NEWPID if pid_ns else 0)
    if not cfg.network and not cfg.net_ready:
        flags |= CLONE_NEWNET
    if cfg.userns:
        uid, gid = os.geteuid(), os.getegid()
        unshare(flags | CLONE_NEWUSER)
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    else:
        unshare(flags)
    if cfg.disk:
        mount_layer(cfg, layer)


def _enter_outer(cfg: GuestConfig) -> None:
    """Enter mode, in the host namespaces: join the container's cgroups (so the agent
    is charged to its limits), then its namespaces; the sized layer (disk_mb) is opened
    first, through the host's /proc."""
    layer = open_layer(cfg)
    for path in cfg.cgroup_procs:
        with open(path, "w") as f:
            f.write("0")
    enter_namespaces(cfg.enter_pid)
    if cfg.disk:
        unshare(CLONE_NEWNS)  # the sandbox's root is ours to build (layer_root)
        mount_layer(cfg, layer)


def _enter_init() -> None:
    """Enter mode, in the container: its root, hostname and loopback are docker's; we
    only need a private state dir (docker's /dev is a tmpfs) and the orphans of our
    sessions, which would otherwise become zombies under the container's keep-alive."""
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    os.chmod(STATE_DIR, 0o700)
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "child_subreaper")


def read_config() -> GuestConfig:
    """The configuration frame from stdin (``GuestConfig.frame``). A spare agent
    (``deployment/local.py``) may be told ``PREPARE_NET`` first: it makes its network namespace, loopback up, while
    it waits (creating one waits on the kernel's rtnl_lock), and the config says
    ``net_ready``. A failure here is not final: the usual path makes it later."""
    reader = FrameReader()
    net_ready = False
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            os._exit(1)
        reader.feed(data)
        for header, _ in reader.frames():
            if header == PREPARE_NET:
                if not net_ready:
                    try:
                        unshare(CLONE_NEWNET)
                        loopback_up()
                        net_ready = True
                    except OSError:
                        pass
                continue
            try:
                cfg = GuestConfig.from_header(header)
            except (KeyError, TypeError, ValueError) as e:  # another version's host: say so, not a traceback
                os.write(1, encode_frame({"op": "ready", "ok": False, "error": "SandboxStartError",
                                          "message": f"unreadable sandbox configuration ({e!r})"}))
                os._exit(1)
            cfg.net_ready = net_ready
            return cfg


def zygote() -> None:
    """The fork server (``deployment/process.py`` starts one per owner process): an
    interpreter that has imported this module once and forks an agent per request, so a
    create costs a fork (about a millisecond of CPU) instead of a fresh interpreter
    (35 ms: start-up, imports, compiling this file).

    Its stdin is a SOCK_SEQPACKET socket to the owner. Each request is one message,
    ``f`` (a plain fork) or ``p`` (the child is pid 1 of a new pid namespace), carrying
    two fds (the new agent's stdin and stdout pipes); the reply carries the child's pid
    and a pidfd of it, so the owner can wait for a process that is not its child. For
    ``p`` the zygote unshares a pid namespace for its next child only, and returns to its
    own right after the fork (``setns``); if it cannot return, it exits rather than fork
    a later agent into a sandbox's namespace.

    The zygote never sees a sandbox's configuration (the owner writes it into the child's
    stdin, as to any agent), so nothing of one sandbox is in the memory the next one
    inherits; its environment is empty, its children keep none of its fds (only the two
    pipes, as 0 and 1, and stderr), and each joins its own cgroups in ``main``. It dies
    with its owner: PR_SET_PDEATHSIG, and EOF on the socket; it reaps its children."""
    parent = os.getppid()
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
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
        if new_pid_ns and _libc.setns(own_pid_ns, CLONE_NEWPID) != 0:
            os._exit(1)  # the owner starts a new zygote; its agents run on
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
    return _libc.unshare(ctypes.c_int(CLONE_NEWPID)) == 0


def reap_children(*_signal) -> None:
    """Reap every child that has exited (also a SIGCHLD handler: the zygote's)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> None:
    cfg = read_config()
    parent = os.getppid()
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the host process
    if os.getppid() != parent:
        os._exit(1)
    enter = cfg.enter_pid is not None
    one_process = not enter and os.getpid() == 1  # the zygote made our pid namespace
    try:
        if enter:
            _enter_outer(cfg)
        else:
            _setup_outer(cfg, pid_ns=not one_process)
    except OSError as e:
        if enter:
            failure = {"error": "SandboxStartError", "message": f"cannot enter the container ({e})"}
        else:
            failure = {"error": "IsolationUnavailable",
                       "message": f"cannot create namespaces ({e}): this host does not allow "
                                  "the local backend's isolation; use backend='docker'"}
        os.write(1, encode_frame({"op": "ready", "ok": False, **failure}))
        os._exit(1)
    # Enter mode's init is ready in milliseconds: it waits for this gate to close, so its
    # "ready" never overtakes our "spawned" on the shared stdout.
    gate = os.pipe() if enter else ()
    if not one_process:
        init = os.fork()
        if init:
            _outer_wait(init, gate)
    try:  # init: pid 1 of the sandbox (enter mode: the container's first agent process)
        if enter:
            os.close(gate[1])
            os.read(gate[0], 1)  # EOF once the outer process closed its end
            os.close(gate[0])
            if cfg.disk:
                layer_root(cfg)
            _enter_init()
        else:
            build_root(cfg)
            socket.sethostname(cfg.hostname)
            if not cfg.network and not cfg.net_ready:
                loopback_up()
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")  # the OOM killer should pick the hog, not the agent
        except OSError:
            pass  # needs CAP_SYS_RESOURCE, which some hosts withhold
        drop_capabilities()
        os.makedirs(cfg.workdir, exist_ok=True)
        os.closerange(3, 65536)
        agent = Agent(cfg)
        install_seccomp(bytes.fromhex(cfg.seccomp))  # the setup above needed what it denies
    except Exception as e:  # noqa: BLE001
        os.write(1, encode_frame({"op": "ready", "ok": False, "error": "IsolationUnavailable",
                                  "message": f"cannot build the sandbox root ({e}): this host does not "
                                             "allow the local backend's isolation; use backend='docker'"}))
        os._exit(1)
    os.write(1, encode_frame({"op": "ready", "ok": True, "pid": os.getpid(), "one_process": one_process}))
    try:
        agent.serve()
    finally:
        os._exit(0)


def _outer_wait(init: int, gate: tuple) -> None:
    """The outer process, once ``init`` is forked: report init's host pid and stay its
    parent, so its exit is reaped here and not left to the host's pid 1."""
    os.write(1, encode_frame({"op": "spawned", "init_pid": init}))
    for fd in (0, 1, *gate):
        os.close(fd)
    try:
        os.waitpid(init, 0)
    finally:
        os._exit(0)
