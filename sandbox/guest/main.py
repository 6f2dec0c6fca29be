"""A guest's start, from its config frame to serving (the lifecycle in ``__init__.py``):
set up in the host's namespaces (``_setup_outer``) or join a container's (``_enter_outer``),
fork init where one process cannot be both, build the root, drop privileges, install the
syscall filter, serve."""

from __future__ import annotations

import os
import resource  # imported by the zygote: loading this extension module in each guest cost ~110 page faults
import signal
import socket

from ..protocol.frames import PREPARE_NET, FrameReader, GuestConfig, encode_frame
from .layers import layer_root, mount_layer, open_layer
from .rootfs import STATE_DIR, build_root
from .serve import Guest
from .syscalls import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS,
                       PR_SET_CHILD_SUBREAPER, check, drop_capabilities, enter_namespaces, install_seccomp,
                       libc, loopback_up, unshare)


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
    if not cfg.net_ready and not cfg.host_network:  # network=True too: the host wires it (deployment/network.py)
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
    """Enter mode, in the host namespaces: join the container's cgroups (so the guest
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
    check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "child_subreaper")


def read_config() -> GuestConfig:
    """The configuration frame from stdin (``GuestConfig.frame``). A spare guest
    (``deployment/local.py``) may be told ``PREPARE_NET`` first: it makes its network
    namespace, loopback up, while it waits (creating one waits on the kernel's rtnl_lock),
    and the config says ``net_ready``. A failure here is not final: the usual path makes it later."""
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


def main() -> None:
    """Be one sandbox's guest: read the config, set up, serve until stdin closes; never returns."""
    cfg = read_config()
    parent = os.getppid()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the host process
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
    try:  # init: pid 1 of the sandbox (enter mode: the container's first guest process)
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
            if not cfg.net_ready and not cfg.host_network:
                loopback_up()
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")  # the OOM killer should pick the hog, not the guest
        except OSError:
            pass  # needs CAP_SYS_RESOURCE, which some hosts withhold
        drop_capabilities()
        os.makedirs(cfg.workdir, exist_ok=True)
        os.closerange(3, 65536)
        guest = Guest(cfg)
        install_seccomp(bytes.fromhex(cfg.seccomp))  # the setup above needed what it denies
    except Exception as e:  # noqa: BLE001
        os.write(1, encode_frame({"op": "ready", "ok": False, "error": "IsolationUnavailable",
                                  "message": f"cannot build the sandbox root ({e}): this host does not "
                                             "allow the local backend's isolation; use backend='docker'"}))
        os._exit(1)
    os.write(1, encode_frame({"op": "ready", "ok": True, "pid": os.getpid(), "one_process": one_process}))
    try:
        guest.serve()
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
