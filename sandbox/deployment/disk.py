"""Disk limits: each sandbox's writable layer is a filesystem of its own, ``disk_mb`` big.

Writes past the limit fail with ``ENOSPC`` inside the sandbox, whatever fills it: bytes,
one huge (even sparse) file, or inodes (many empty files); deleting files frees the space
again; the host's disk and other sandboxes never see the pressure.

What backs the layer (decided here, mounted by the agent, ``runtime/_agent.py``):

- **root on the host: a sparse ext4 image on a loop device.** Real disk, not memory: a
  sandbox's files are not charged to its ``memory_mb`` and a thousand sandboxes with
  2 GiB each cost host disk only for the bytes they really write (the image is sparse,
  and mounted with ``discard``, so deleted files punch holes back into it). The image is
  a copy of a template formatted once per size (``mke2fs`` costs ~10 ms, a sparse copy of
  its ~150 KiB of metadata well under 1 ms); the agent attaches a loop device with
  ``LOOP_CONFIGURE`` and mounts it, ~2 ms more (``bench/sandbox.py``, row "local cold
  create, disk limit"). Loop devices are auto-clearing: the kernel detaches one when the
  last mount of it goes, which is when the sandbox's mount namespace dies.
- **unprivileged (a user namespace): a tmpfs with ``size=`` and ``nr_inodes=``.** ext4 on
  a loop device cannot be mounted inside a user namespace; tmpfs can. It counts against
  RAM, and its pages are charged to the sandbox's memory cgroup: there a sandbox's files
  also count against its ``memory_mb``.
- Project quotas were not chosen: they need an xfs (or ext4 with the ``project``
  feature) host filesystem mounted with quotas on, which neither these hosts nor most
  laptops have.

The mount is made by the agent's outer process, in the sandbox's private mount namespace,
never in the host's: a crashed owner leaves no mount behind (the namespace dies with the
sandbox's processes), and a thousand sandboxes do not grow the host's mount table (each
``unshare(CLONE_NEWNS)`` copies it). The outer process keeps its working directory on the
mount; the host reads the upper layer (snapshots) through ``/proc/<outer>/cwd``, opened
once per agent as a directory fd (``WritableLayer``), so a recycled pid can never turn it
into someone else's files. Inodes: one per 16 KiB, as ``mke2fs``'s default ratio, on both
backings, so the inode limit does not depend on which one a host uses.

The docker backend uses the same layer (root only): its agent builds the sandbox's root
as an overlay of the container's root and this layer, so the container's own writable
layer (unlimited on overlay2 over ext4) stays empty.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import SandboxStartError
from ..home import state_home

BYTES_PER_INODE = 16384  # mke2fs's default ratio
LOOP_CLR_FD = 0x4C01


def inodes_for(disk_mb: int) -> int:
    return max(1024, disk_mb * (1 << 20) // BYTES_PER_INODE)


def layer_config(disk_mb: int | None, folder: Path, name: str, *, userns: bool,
                 home: Path | None = None) -> dict | None:
    """The agent's ``disk`` config for a fresh writable layer of ``disk_mb`` MiB, mounted at
    ``folder/name`` (a new empty directory); for ext4 the image is ``folder/name.img``.
    None when ``disk_mb`` is None (no limit: the upper is a plain host directory)."""
    if disk_mb is None:
        return None
    mount_point = folder / name
    mount_point.mkdir()
    if userns:
        return {"dir": str(mount_point), "tmpfs": f"size={disk_mb}m,nr_inodes={inodes_for(disk_mb)},mode=755"}
    image = folder / f"{name}.img"
    sparse_copy(ext4_template(disk_mb, home), image)
    return {"dir": str(mount_point), "image": str(image)}


def ext4_template(disk_mb: int, home: Path | None = None) -> Path:
    """A sparse, formatted ext4 image of ``disk_mb`` MiB, made once per size and cached.
    No journal (the layer never outlives a crash of its sandbox), no reserved blocks (the
    sandbox's root may use it all), inode tables initialised lazily (never, in fact: the
    agent mounts with ``noinit_itable``, so the image stays sparse)."""
    folder = (home or state_home()) / "disks"
    path = folder / f"ext4-{disk_mb}m.img"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ext4-", dir=folder)
    try:
        os.ftruncate(fd, disk_mb << 20)
        os.close(fd)
        mke2fs = shutil.which("mke2fs") or "/sbin/mke2fs"
        # 4 KiB blocks at every size (mke2fs picks 1 KiB for small ones, which caps a file at 16 GiB)
        out = subprocess.run([mke2fs, "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-i", str(BYTES_PER_INODE),
                              "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard", tmp],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SandboxStartError(f"cannot format a {disk_mb} MiB disk image: {out.stderr.strip()}")
        os.replace(tmp, path)  # another process may have won the race: same bytes either way
    except FileNotFoundError as e:
        raise SandboxStartError("disk limits need mke2fs (e2fsprogs) on the host") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def sparse_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to a new file ``dst``, writing only its data extents (holes stay holes)."""
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size, offset = os.fstat(fin).st_size, 0
            while offset < size:
                try:
                    start = os.lseek(fin, offset, os.SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                end = os.lseek(fin, start, os.SEEK_HOLE)
                pos = start
                while pos < end:
                    n = os.copy_file_range(fin, fout, end - pos, pos, pos)
                    if n == 0:
                        break
                    pos += n
                offset = end
            os.ftruncate(fout, size)
        finally:
            os.close(fout)
    finally:
        os.close(fin)


class WritableLayer:
    """The host's handle on a sandbox's mounted layer: a directory fd on the agent's
    working directory (``/proc/<outer>/cwd``), which is the layer's root. Holding it keeps
    the layer mounted, so ``close()`` it when the agent stops."""

    def __init__(self, outer_pid: int):
        try:
            self.fd = os.open(f"/proc/{outer_pid}/cwd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise SandboxStartError(f"cannot reach the sandbox's disk ({e})") from e
        if not os.path.isdir(self.upper):
            os.close(self.fd)
            raise SandboxStartError("the sandbox's disk has no upper layer")

    @property
    def upper(self) -> Path:
        # Our pid, not /proc/self: ``cp`` (snapshots) reads it from a child process.
        return Path(f"/proc/{os.getpid()}/fd/{self.fd}/upper")

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def loop_devices(folder: Path) -> list[str]:
    """Loop devices backed by an image under ``folder`` (a run's directory), as the
    kernel lists them (an unlinked image still counts)."""
    prefix, found = f"{folder}/", []
    for backing in sorted(Path("/sys/block").glob("loop*/loop/backing_file")):
        try:
            if backing.read_text().startswith(prefix):
                found.append(f"/dev/{backing.parts[3]}")
        except OSError:
            continue  # detached meanwhile
    return found


def detach_loops(folder: Path) -> None:
    """Detach the loop devices of a dead run (``reaper``). Each is auto-clearing and goes
    with the sandbox's mount namespace anyway; this catches one whose namespace a stray
    process still holds: the kernel then detaches it as soon as that mount goes."""
    for dev in loop_devices(folder):
        try:
            fd = os.open(dev, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, LOOP_CLR_FD)
            finally:
                os.close(fd)
        except OSError:
            pass  # gone already, or not ours to touch
