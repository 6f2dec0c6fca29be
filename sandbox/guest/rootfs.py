"""The sandbox's root filesystem (local mode): an overlay of the image layers and the
upper dir, read-only binds, a private /dev and /proc; then ``pivot_root`` into it."""

from __future__ import annotations

import os

from ..protocol.frames import GuestConfig
from .syscalls import MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_REC, bind, mount, pivot_here

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

    pivot_here(root)
