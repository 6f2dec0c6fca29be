"""The sandbox's sized writable layer (``disk_mb``): the detached mount the host makes
ahead of time (``deployment/disk.py`` calls ``detached_layer``), and how the guest puts
it in place, in local mode under the overlay and in enter mode under the container's root."""

from __future__ import annotations

import os

from ..protocol.frames import GuestConfig
from .syscalls import MNT_DETACH, MS_BIND, MS_PRIVATE, MS_REC, check, fsbytes, libc, mount, pivot_here

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
    fs = check(libc.syscall(SYS_FSOPEN, fsbytes(fstype), 1), "fsopen")  # FSOPEN_CLOEXEC
    try:
        for key, value in options:
            cmd = FSCONFIG_SET_FLAG if value is None else FSCONFIG_SET_STRING
            check(libc.syscall(SYS_FSCONFIG, fs, cmd, fsbytes(key), fsbytes(value), 0), f"fsconfig {key}")
        check(libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
        return check(libc.syscall(SYS_FSMOUNT, fs, 1, 0), "fsmount")  # FSMOUNT_CLOEXEC
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
        check(libc.syscall(SYS_MOVE_MOUNT, detached, b"", AT_FDCWD, fsbytes(where), MOVE_MOUNT_F_EMPTY_PATH),
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
        check(libc.umount2(fsbytes(root + layer), MNT_DETACH), "umount layer copy")
    pivot_here(root)
