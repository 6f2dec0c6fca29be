"""Disk limits: each sandbox's writable layer is a filesystem of its own, ``disk_mb`` big.

Writes past the limit fail with ``ENOSPC`` inside the sandbox, whatever fills it: bytes,
one huge (even sparse) file, or inodes (many empty files); deleting files frees the space
again; the host's disk and other sandboxes never see the pressure.

What backs the layer (decided here; the guest, ``guest/layers.py``, only puts it in place):

- **root on the host: a sparse ext4 image on a loop device.** Real disk, not memory: a
  sandbox's files are not charged to its ``memory_mb``, and a thousand sandboxes with
  2 GiB each cost host disk only for the bytes they really write (the image is sparse,
  and mounted with ``discard``, so deleted files punch holes back into it). No journal
  (the layer never outlives its sandbox), no reserved blocks, 4 KiB blocks.
- **unprivileged (a user namespace), or no ``/dev/loop-control``: a tmpfs with ``size=``
  and ``nr_inodes=``.** ext4 on a loop device cannot be mounted inside a user namespace;
  tmpfs can (the guest mounts it; as root we make it, like the ext4 one). It is memory:
  where the sandbox has a memory cgroup, its files also count against ``memory_mb``
  (pages are charged to the cgroup that writes them).
- Not project quotas: they need an xfs (or ext4 with the ``project`` feature) host
  filesystem mounted with quotas on, which neither these hosts nor most laptops have.
- Not tmpfs for root too, though it is the cheapest (one mount syscall, 0.04 ms): a
  thousand sandboxes' files in RAM, and a sandbox's disk eating its memory limit, are the
  wrong trade for a disk.

Create-time cost, measured on the 2-core dev host: ``mke2fs`` 6-12 ms (once per size: the
template), a sparse copy of its ~150 KiB of metadata 0.7-1.8 ms, ``LOOP_CONFIGURE`` ~1 ms
idle and up to 140 ms loaded (a queue freeze), the ext4 mount ~1 ms, the first writes to
the fresh filesystem tens of ms loaded (bitmap reads through the loop worker). All of it
is done ahead of time on a background thread (``_SpareDisks``, like the zygote's spare guests): a
create takes a spare, a formatted image on an attached loop device, already mounted as a
*detached* mount (``fsmount``) with its directories in it, and the guest moves
that mount into the sandbox's namespace (``move_mount``): 0.2 ms on the create path.
What is left shows in ``bench/sandbox.py`` (cold create with the default disk beside
``disk_mb=None``, interleaved): creates alone cost the same (367 vs 383 ms median under
a load average of 40); a create right after a close pays for the closed sandbox's
teardown (its ext4 unmount flushes, its loop device detaches, the next spare is made) on
the same 2 cores, 1.2-1.3x under that load. In CPU (``getrusage`` of the owner and its
guests, create + close, spares included): 55 ms with the disk, 50 ms without.

The mount lives in the sandbox's private mount namespace, never in the host's: a crashed
owner leaves no mount behind (the namespace dies with the sandbox's processes; a spare
mount dies with our fd), and a thousand sandboxes do not grow the host's mount table
(each ``unshare(CLONE_NEWNS)`` copies it). Loop devices are auto-clearing: the kernel
detaches one when its last mount goes. The host reads the upper layer (snapshots)
through a directory fd on the layer's root (``SandboxDisk``): opened through its own
mount fd, or for a tmpfs an unprivileged guest made, through ``/proc/<outer>/cwd`` (the
guest's outer process stays in the layer), once per guest, so a recycled pid can never
turn it into someone else's files. Inodes: one per 16 KiB, ``mke2fs``'s default ratio,
on both backings.

The docker backend uses the same layer: its guest builds the sandbox's root as an overlay
of the container's root and this layer, so the container's own writable layer
(unlimited on overlay2 over ext4) stays empty.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

from ..errors import SandboxStartError
from ..home import first_use_lock, state_home
from ..guest.layers import LAYER_DIRS, detached_layer, detached_mount
from ..protocol.frames import DiskConfig

BYTES_PER_INODE = 16384  # mke2fs's default ratio
LOOP_CLR_FD, LOOP_CONFIGURE, LOOP_CTL_ADD, LOOP_CTL_GET_FREE, LO_FLAGS_AUTOCLEAR = 0x4C01, 0x4C0A, 0x4C80, 0x4C82, 4
LOOP_INFO64_SIZE, LO_FLAGS_OFFSET = 232, 52  # struct loop_info64, and lo_flags in it


def inodes_for(disk_mb: int) -> int:
    return max(1024, disk_mb * (1 << 20) // BYTES_PER_INODE)


class Disk:
    """A sandbox's layer as we made it, mounted but attached nowhere yet (a detached
    mount, ``fd``): ext4 on a sparse ``image`` on an auto-clearing loop device, or a
    tmpfs (``image`` None). The guest moves it into the sandbox's mount namespace. Until
    then our fd is its only user, so a guest that dies first leaks nothing: ``release``
    drops the mount, and with it the loop device."""

    def __init__(self, image: Path | None, fd: int):
        self.image, self.fd = image, fd

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def attach_loop(image: Path) -> tuple[str, int]:
    """A free loop device backed by ``image``, and an open fd on it. Auto-clearing: the
    kernel detaches it when its last user (our fd, then the mount) is gone."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        return _claim_free(ctl, backing)
    finally:
        os.close(ctl)
        os.close(backing)


# Threads of one process asking for a free device at once are all handed the same one (the
# kernel's "free" is "not bound yet"), and all but one would retry. Attaching itself can wait
# long (a queue freeze waits for an RCU grace period: tens of ms on a busy host), so it must
# not be done one at a time: each thread picks a device number no other thread of this
# process is attaching (creating it if need be), under a lock held only for the pick, and
# attaches in parallel. Other processes may still take a device first: EBUSY, the next one.
# Past the kernel's free one, devices that are bound already (sysfs shows their ``loop``
# folder) are stepped over without trying them: the kernel's free one can stay busy (held
# open exclusively, or being attached by another process) while the next hundreds are bound
# by live sandboxes, and trying each of those would spend the retries on certain failures.
_PICKING = threading.Lock()
_ATTACHING: set[int] = set()


def _bound(n: int) -> bool:
    return os.path.exists(f"/sys/block/loop{n}/loop")


def _pick(ctl: int, busy: set[int]) -> int:
    """A device number to attach: the kernel's free one, or past it the first that no thread
    of ours is attaching, that was not ``busy`` for this caller and that is not bound."""
    with _PICKING:
        n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
        while n in _ATTACHING or n in busy or _bound(n):
            n += 1
            try:
                fcntl.ioctl(ctl, LOOP_CTL_ADD, n)
            except OSError as e:
                if e.errno != errno.EEXIST:
                    raise
        _ATTACHING.add(n)
        return n


def _claim_free(ctl: int, backing: int) -> tuple[str, int]:
    busy: set[int] = set()
    for _ in range(64):  # another process may take the free device first: try the next
        n = _pick(ctl, busy)
        try:
            dev = f"/dev/loop{n}"
            try:
                fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:  # no devtmpfs or udev made the node
                os.mknod(dev, stat.S_IFBLK | 0o600, os.makedev(7, n))
                fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            info = bytearray(LOOP_INFO64_SIZE)
            struct.pack_into("I", info, LO_FLAGS_OFFSET, LO_FLAGS_AUTOCLEAR)
            try:  # struct loop_config: backing fd, block size (0: default), loop_info64, reserved
                fcntl.ioctl(fd, LOOP_CONFIGURE, struct.pack("II", backing, 0) + bytes(info) + bytes(64))
                return dev, fd
            except OSError as e:
                os.close(fd)
                if e.errno != errno.EBUSY:
                    raise
                busy.add(n)
        finally:
            with _PICKING:
                _ATTACHING.discard(n)
    raise OSError(errno.EBUSY, "no free loop device")


def new_disk(disk_mb: int, folder: Path, home: Path | None = None) -> Disk:
    """A fresh ext4 layer of ``disk_mb`` MiB (a sparse copy of the template, in ``folder``),
    mounted detached."""
    image = folder / f".disk-{uuid.uuid4().hex[:12]}.img"
    sparse_copy(ext4_template(disk_mb, home), image)
    disk = None
    try:
        device, devfd = attach_loop(image)
        try:
            disk = Disk(image, detached_layer(device))
        finally:
            os.close(devfd)  # the mount holds the device now
        # The first block allocated on a fresh filesystem reads its group's bitmap through
        # the loop device's worker and builds the allocator's buddy cache (tens of ms on a
        # loaded host): here, off the create path, and not later in the overlay's mount
        # (its work dir). So the layer's directories are made now, not in the template.
        for name in LAYER_DIRS:
            os.mkdir(name, 0o755, dir_fd=disk.fd)
        return disk
    except OSError as e:
        if disk is not None:
            disk.release()
        image.unlink(missing_ok=True)
        raise SandboxStartError(f"cannot mount the sandbox's disk ({e})") from e


def new_tmpfs(disk_mb: int) -> Disk:
    """A tmpfs layer of ``disk_mb`` MiB and ``inodes_for(disk_mb)`` inodes with the
    layer's directories, mounted detached: what a root host without loop devices gets."""
    fd = detached_mount("tmpfs", [("size", f"{disk_mb}m"), ("nr_inodes", str(inodes_for(disk_mb))),
                                  ("mode", "755")])
    try:
        for name in LAYER_DIRS:
            os.mkdir(name, dir_fd=fd)
            os.chmod(name, 0o755, dir_fd=fd)  # whatever the umask
    except OSError:
        os.close(fd)
        raise
    return Disk(None, fd)


class _SpareDisks:
    """Disks made ahead of time, per (size, run directory), like the zygote's spare guests
    (``process.py``): attaching a loop device waits on the kernel (a queue freeze, an RCU
    grace period) and mounting reads the filesystem: 3 ms on an idle host, 100 ms and more
    on a loaded one, so a create should not. Spares sit in the run's directory
    (``.disk-*.img``) and are renamed into the sandbox's; a crash of the owner closes
    their fds, which detaches them."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._ready: dict[tuple, collections.deque[Disk]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()
        self._maker: concurrent.futures.ThreadPoolExecutor | None = None

    def take(self, disk_mb: int, run_dir: Path, home: Path | None, dest: Path) -> Disk:
        key = (disk_mb, run_dir, home)
        with self._lock:
            if self._maker is None:
                self._maker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rockroll-disks")
            ready = self._ready[key]
            disk = ready.popleft() if ready else None
            self._maker.submit(self._refill, key)
        if disk is None:
            disk = new_disk(disk_mb, run_dir, home)
        try:
            os.rename(disk.image, dest)  # the loop device follows the file
        except OSError:
            disk.release()
            raise
        disk.image = dest
        return disk

    def _refill(self, key: tuple) -> None:
        with self._lock:
            if len(self._ready[key]) >= self.keep:
                return
        disk_mb, run_dir, home = key
        if not run_dir.is_dir():
            return  # the run is over
        try:
            disk = new_disk(disk_mb, run_dir, home)
        except (SandboxStartError, OSError):
            return  # the next create makes its own and reports why
        with self._lock:
            self._ready[key].append(disk)

    def drop(self, run_dir: Path) -> None:
        """Release the spares of a run that is over (its loop devices go with them)."""
        with self._lock:
            keys = [k for k in self._ready if k[1] == run_dir]
            disks = [d for k in keys for d in self._ready.pop(k)]
        for disk in disks:
            disk.release()


_spares = _SpareDisks()


def drop_spares(run_dir: Path) -> None:
    _spares.drop(run_dir)


def loop_devices_usable() -> bool:
    """Whether this process may attach loop devices (root, with /dev/loop-control: a
    container without it, or a user namespace, gets the tmpfs layer instead)."""
    return os.geteuid() == 0 and os.access("/dev/loop-control", os.R_OK | os.W_OK)


def layer_config(disk_mb: int | None, run_dir: Path, folder: Path, name: str, *, userns: bool,
                 home: Path | None = None) -> tuple[DiskConfig | None, Disk | None]:
    """The guest's ``disk`` config for a fresh writable layer of ``disk_mb`` MiB, and the
    ``Disk`` behind it (None for the tmpfs an unprivileged guest mounts itself; an ext4
    layer's image is ``folder/name.img``). ``(None, None)`` when ``disk_mb`` is None: no
    limit, the upper is a plain host directory.

    Every sandbox mounts its layer at the same directory, ``<home>/mnt`` (made once),
    each in a mount namespace of its own, and the sandbox's root on the layer: a create
    makes no directory on the host's disk. (On an ext4 without a journal, as these
    hosts' is, finding a free inode skips every inode deleted in the last minutes: 5-7 %
    of a 1,000-create burst's CPU went there while a previous burst's were fresh.)"""
    if disk_mb is None:
        return None, None
    mount_point = (home or state_home()) / "mnt"
    mount_point.mkdir(exist_ok=True)
    if userns:
        return DiskConfig(str(mount_point), tmpfs=f"size={disk_mb}m,nr_inodes={inodes_for(disk_mb)},mode=755"), None
    if loop_devices_usable():
        disk = _spares.take(disk_mb, run_dir, home, folder / f"{name}.img")
    else:
        disk = new_tmpfs(disk_mb)
    # Our pid, not /proc/self: the guest reopens the mount from its own process.
    return DiskConfig(str(mount_point), mount=f"/proc/{os.getpid()}/fd/{disk.fd}"), disk


def ext4_template(disk_mb: int, home: Path | None = None) -> Path:
    """A sparse, formatted ext4 image of ``disk_mb`` MiB, made once per size and cached.
    No journal (the layer never outlives a crash of its sandbox), no reserved blocks (the
    sandbox's root may use it all), inode tables initialised lazily (never, in fact: the
    guest mounts with ``noinit_itable``, so the image stays sparse)."""
    folder = (home or state_home()) / "disks"
    path = folder / f"ext4-4k-{disk_mb}m.img"  # named for its format: a change of options makes a new one
    if not path.exists():
        with first_use_lock(path):
            if not path.exists():
                _format_template(disk_mb, folder, path)
    return path


def _format_template(disk_mb: int, folder: Path, path: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ext4-", dir=folder)
    try:
        try:
            os.ftruncate(fd, disk_mb << 20)
        finally:
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
    except OSError as e:  # the host's filesystem cannot hold the sparse image
        raise SandboxStartError(f"cannot make a {disk_mb} MiB disk image: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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


class SandboxDisk:
    """A deployment's sized writable layer, one per guest generation (start, reset,
    restore): ``prepare`` before the guest starts (the guest's ``disk`` config), ``mounted``
    once it runs, ``close`` when it stops, ``drop`` its files once it is gone. With
    ``disk_mb=None`` every step is a no-op and ``upper`` is None."""

    def __init__(self, disk_mb: int | None, run_dir: Path, folder: Path, *, userns: bool,
                 home: Path | None = None):
        self.disk_mb, self.run_dir, self.folder, self.home = disk_mb, run_dir, folder, home
        self.userns = userns
        self._disk: Disk | None = None
        self._fd = -1

    def prepare(self, gen: int) -> DiskConfig | None:
        cfg, self._disk = layer_config(self.disk_mb, self.run_dir, self.folder, f"disk{gen}",
                                       userns=self.userns, home=self.home)
        return cfg

    def mounted(self, outer_pid: int) -> None:
        """The guest has mounted the layer: hold the layer's root as a directory fd, opened
        through our own mount fd, or for a tmpfs the guest made, through the working
        directory of the process that sits in it (its outer process ``outer_pid``), so a
        recycled pid can never turn ``upper`` into someone else's files. Holding it keeps
        the layer mounted until ``close``."""
        if self.disk_mb is None:
            return
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            self._fd = (os.open(".", flags, dir_fd=self._disk.fd) if self._disk is not None
                        else os.open(f"/proc/{outer_pid}/cwd", flags))
        except OSError as e:
            raise SandboxStartError(f"cannot reach the sandbox's disk ({e})") from e
        finally:
            if self._disk is not None:
                self._disk.release()  # the guest has moved the mount into the sandbox
        if not os.path.isdir(self.upper):
            self.close()
            raise SandboxStartError("the sandbox's disk has no upper layer")

    @property
    def upper(self) -> Path | None:
        # Our pid, not /proc/self: ``cp`` (snapshots) reads it from a child process.
        return Path(f"/proc/{os.getpid()}/fd/{self._fd}/upper") if self._fd >= 0 else None

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        if self._disk is not None:
            self._disk.release()
            self._disk = None

    def drop(self, gen: int) -> None:
        (self.folder / f"disk{gen}.img").unlink(missing_ok=True)


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
