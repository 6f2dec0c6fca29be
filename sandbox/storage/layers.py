"""Filesystem layers: an overlayfs upper directory <-> a content-addressed zstd tarball.

A layer is one zstd frame holding a PAX tar:

- optional first member ``rockroll.json``: the caller's metadata (a JSON object);
- the tree under ``rootfs/``, depth-first with each directory's entries in name order, so
  the same tree always gives the same member order;
- deletions in OCI image-layer form, so a layer taken by the local backend also applies on
  Docker: an overlayfs whiteout (char device 0/0) becomes an empty file ``.wh.<name>``, an
  opaque directory gets an extra empty member ``.wh..wh..opq``.

Layers are named by the sha256 of their compressed bytes (``<dir>/sha256/<hex>.tar.zst``).
Unpacking is the security boundary: a layer may come from a sandbox an agent controlled or
from a shared hub, so every member is checked before anything is written, nothing is
ever written through a path the archive itself created as a symlink, setuid/setgid bits
never land on the host, and the bytes written are counted against a limit (``limits.py``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import BinaryIO

import zstandard

from ..errors import SnapshotError, SpecError, UnsafeArchiveError
from .limits import MEMBER_BYTES, Meter
from .temps import temp_dir, temp_prefix

META_NAME = "rockroll.json"
ROOT = "rootfs"
WH_PREFIX = ".wh."
WH_OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
_META_MAX = 16 << 20
_DIGEST_NAME = re.compile(r"[0-9a-f]{64}\.tar\.zst")


@dataclass(frozen=True)
class LayerInfo:
    """A packed layer on disk."""

    digest: str  # "sha256:<hex>" of the compressed bytes
    size: int  # compressed bytes
    path: Path
    files: int  # members under rootfs/ (entries, whiteouts, opaque markers), root excluded


def digest_file(path: str | os.PathLike) -> str:
    """Return ``"sha256:<hex>"`` of a file's bytes, read in chunks (bounded memory)."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


# ----------------------------------------------------------------------------- packing


def pack_layer(
    src: Path, dest_dir: Path, *, meta: dict | None = None, reproducible: bool = False, level: int = 3
) -> LayerInfo:
    """Pack the directory ``src`` (an overlayfs upper dir) into ``dest_dir/sha256/<hex>.tar.zst``.

    The layer is streamed into a temp file in that folder while being hashed, fsynced, then
    renamed into place; if a layer with the same digest already exists the temp file is
    dropped and the existing one returned (dedup). Symlinks are never followed: the walk
    opens every directory and file relative to its parent with ``O_NOFOLLOW``, so an entry
    swapped for a symlink mid-walk cannot pull host files into the layer. Entries that
    vanish (or change type) during the walk are skipped, and a file that shrinks while read
    is zero-padded: a layer of a running sandbox is consistent only if the sandbox is
    paused. Sockets are skipped; other device nodes than whiteouts raise
    ``UnsafeArchiveError``, as does a real file named ``.wh.*`` (it would read as a
    deletion). Only permission bits, numeric uid/gid and mtime are kept (no xattrs besides
    the opaque marker). ``reproducible=True`` zeroes mtimes and owners so equal trees give
    byte-identical layers (for a given zstandard version). The upper dir must come from a
    mount without ``redirect_dir``/``metacopy`` (the kernel defaults), else ``SnapshotError``.
    """
    out_dir = Path(dest_dir) / "sha256"
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=temp_prefix("pack"), suffix=".tar.zst")
    try:
        with os.fdopen(fd, "wb") as raw:
            hashed = _HashingWriter(raw)
            zw = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=0).stream_writer(
                hashed, closefd=False
            )
            with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                if meta is not None:
                    data = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
                    info = tarfile.TarInfo(META_NAME)
                    info.size, info.mode = len(data), 0o644
                    _add(tar, info, io.BytesIO(data))
                files = _pack_tree(tar, Path(src), reproducible)
            zw.close()  # ends the zstd frame; closefd=False keeps `raw` open
            raw.flush()
            os.fsync(raw.fileno())
        hexdigest = hashed.sha.hexdigest()
        final = out_dir / f"{hexdigest}.tar.zst"
        if final.exists():
            os.unlink(tmp)
        else:
            os.rename(tmp, final)
        return LayerInfo(f"sha256:{hexdigest}", final.stat().st_size, final, files)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, (OSError, tarfile.TarError, zstandard.ZstdError, TypeError, ValueError)):
            raise SnapshotError(f"cannot pack layer from {src}: {e}") from e
        raise


def _pack_tree(tar: tarfile.TarFile, src: Path, reproducible: bool) -> int:
    """Write the rootfs members of ``src`` depth-first; return how many were written."""
    root_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    links: dict[tuple[int, int], str] = {}  # (dev, ino) -> first member name, for hardlinks
    count = 0
    # Explicit stack instead of recursion: an agent can make trees deeper than Python's
    # recursion limit. Each level holds its directory fd so children open relative to it.
    stack = [(root_fd, ROOT, iter(sorted(os.listdir(root_fd))))]
    try:
        _add(tar, _info(ROOT, tarfile.DIRTYPE, os.fstat(root_fd), reproducible))
        while stack:
            dir_fd, arc_dir, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(dir_fd)
                stack.pop()
                continue
            arc = f"{arc_dir}/{name}"
            written, child_fd = _pack_entry(tar, dir_fd, name, arc, links, reproducible)
            count += written
            if child_fd is not None:
                stack.append((child_fd, arc, iter(sorted(os.listdir(child_fd)))))
    finally:
        for dir_fd, _, _ in stack:
            os.close(dir_fd)
    return count


def _pack_entry(tar, dir_fd, name, arc, links, reproducible) -> tuple[int, int | None]:
    """Add one entry; return (members written, fd of the directory to descend into or None)."""
    st = _unless_vanished(os.stat, name, dir_fd=dir_fd, follow_symlinks=False)
    if st is None:
        return 0, None
    mode = st.st_mode
    if stat.S_ISCHR(mode) and st.st_rdev == 0:  # overlayfs whiteout (often a shared inode)
        _add(tar, _info(f"{arc.rpartition('/')[0]}/{WH_PREFIX}{name}", tarfile.REGTYPE, st, reproducible, 0o600))
        return 1, None
    if name.startswith(WH_PREFIX):
        raise UnsafeArchiveError(arc, "a real file may not use the reserved whiteout prefix '.wh.'")
    if stat.S_ISSOCK(mode):
        return 0, None  # sockets are meaningless outside their process
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise UnsafeArchiveError(arc, "device nodes are not allowed in a layer")
    if stat.S_ISDIR(mode):
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        if (fd := _unless_vanished(os.open, name, flags, dir_fd=dir_fd)) is None:
            return 0, None
        try:
            opaque = _overlay_xattrs(fd, arc).get("opaque") == b"y"
            _add(tar, _info(arc, tarfile.DIRTYPE, os.fstat(fd), reproducible))
            if opaque:
                _add(tar, _info(f"{arc}/{WH_OPAQUE}", tarfile.REGTYPE, st, reproducible, 0o600))
        except BaseException:
            os.close(fd)
            raise
        return 1 + opaque, fd
    if st.st_nlink > 1 and (st.st_dev, st.st_ino) in links:
        info = _info(arc, tarfile.LNKTYPE, st, reproducible)
        info.linkname = links[(st.st_dev, st.st_ino)]
        _add(tar, info)
        return 1, None
    if stat.S_ISLNK(mode):
        info = _info(arc, tarfile.SYMTYPE, st, reproducible)
        if (target := _unless_vanished(os.readlink, name, dir_fd=dir_fd)) is None:
            return 0, None
        info.linkname = target
        _add(tar, info)
    elif stat.S_ISFIFO(mode):
        _add(tar, _info(arc, tarfile.FIFOTYPE, st, reproducible))
    elif stat.S_ISREG(mode):
        # O_NONBLOCK: if the file was swapped for a fifo after the stat, open must not hang.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        if (fd := _unless_vanished(os.open, name, flags, dir_fd=dir_fd)) is None:
            return 0, None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return 0, None
            if "metacopy" in _overlay_xattrs(fd, arc):
                raise SnapshotError(f"{arc}: metacopy upper files hold no data; mount with metacopy=off")
            info = _info(arc, tarfile.REGTYPE, st, reproducible)
            info.size = st.st_size
            _add(tar, info, _ExactReader(fd, st.st_size))
        finally:
            os.close(fd)
    else:
        return 0, None
    if st.st_nlink > 1:
        links[(st.st_dev, st.st_ino)] = arc  # only once written, so links never dangle
    return 1, None


def _unless_vanished(fn, *args, **kwargs):
    """``fn(*args)``, or None if the entry was deleted or swapped for another type (ELOOP: now
    a symlink; EINVAL: readlink of a non-link) since it was listed: the walk skips it."""
    try:
        return fn(*args, **kwargs)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL):
            return None
        raise


def _info(name: str, kind: bytes, st: os.stat_result, reproducible: bool, mode: int | None = None):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode) if mode is None else mode
    info.uname = info.gname = ""
    if not reproducible:
        info.uid, info.gid = st.st_uid, st.st_gid
        info.mtime = st.st_mtime_ns // 10**9
        if st.st_mtime_ns % 10**9:  # keep nanoseconds exactly (a float would round them)
            info.pax_headers = {"mtime": str(Decimal(st.st_mtime_ns).scaleb(-9))}
    return info


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, fileobj=None) -> None:
    tar.addfile(info, fileobj)
    tar.members.clear()  # tarfile remembers every member; we never look back, so keep memory flat


def _overlay_xattrs(fd: int, arc: str) -> dict[str, bytes]:
    """Overlayfs xattrs of an open entry, by short name (``opaque``, ``redirect``, ...)."""
    found = {}
    for key in os.listxattr(fd):
        for prefix in ("trusted.overlay.", "user.overlay."):
            if key.startswith(prefix):
                found[key[len(prefix):]] = os.getxattr(fd, key)
    if "redirect" in found:
        raise SnapshotError(f"{arc}: redirected upper dirs need their lower layer; mount with redirect_dir=off")
    return found


class _HashingWriter:
    """Write-through file wrapper that hashes what it writes."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.sha = raw, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


class _ExactReader:
    """Exactly ``size`` bytes of an fd: tarfile needs the size it announced in the header, so
    a file that shrinks while read is zero-padded and one that grows is cut."""

    def __init__(self, fd: int, size: int):
        self.fd, self.left = fd, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = b""
        while len(data) < n and (part := os.read(self.fd, n - len(data))):
            data += part
        self.left -= n
        return data + bytes(n - len(data))


# --------------------------------------------------------------------------- unpacking


def read_meta(archive: Path) -> dict:
    """Return the ``rockroll.json`` metadata of a layer ({} if it has none), decompressing
    only the start of the archive."""
    try:
        with open(archive, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zr, tarfile.open(
            fileobj=zr, mode="r|"
        ) as tar:
            member = tar.next()
            return _load_meta(tar, member) if member is not None and member.name == META_NAME else {}
    except SnapshotError:
        raise
    except (OSError, tarfile.TarError, zstandard.ZstdError, ValueError) as e:
        raise SnapshotError(f"cannot read metadata of layer {archive}: {e}") from e


def unpack_layer(archive: Path, dest: Path, *, whiteouts: str = "overlay", meter: Meter | None = None) -> dict:
    """Extract a layer into ``dest`` (which must not exist) and return its metadata ({} if none).

    A layer named ``<hex>.tar.zst`` (as ``pack_layer`` names it) is first checked against
    that digest. Extraction streams (bounded memory) into a temp sibling that is renamed to
    ``dest`` only after the whole archive was read and verified (one complete zstd frame,
    its checksum, a complete tar); on any error the temp dir is removed and ``dest`` never
    appears. Bad archives raise ``SnapshotError``; members that would escape the tree or
    create something forbidden raise ``UnsafeArchiveError`` (see ``_Extractor``).

    ``whiteouts="overlay"`` turns ``.wh.<name>`` back into a 0/0 char device and
    ``.wh..wh..opq`` into the ``trusted.overlay.opaque=y`` xattr (``user.overlay.opaque``
    when not privileged; mount with ``userxattr`` then), so ``dest`` works as an overlayfs
    layer. ``whiteouts="keep"`` leaves them as empty files, for consumers that apply layers
    themselves. Modes, mtimes and (as root) numeric owners are restored, except the
    setuid and setgid bits: sandboxes run with no_new_privs, where they do nothing, so on
    the host they could only serve an attack. With a ``meter``, every member is charged
    before it is written (its data, plus ``MEMBER_BYTES``): a bomb stops with
    ``StorageLimitError``/``StorageFullError`` at the limit and nothing is left behind.
    """
    if whiteouts not in ("overlay", "keep"):
        raise SpecError("whiteouts", f"must be 'overlay' or 'keep', not {whiteouts!r}")
    archive = Path(archive)
    if _DIGEST_NAME.fullmatch(archive.name):  # content-addressed: checked before anything is written
        try:
            ok = digest_file(archive) == f"sha256:{archive.name[:64]}"
        except OSError as e:
            raise SnapshotError(f"cannot read layer {archive}: {e}") from e
        if not ok:
            raise SnapshotError(f"layer {archive} is corrupt: its content does not match its digest")

    def extract(tmp: Path) -> dict:
        with open(archive, "rb") as raw:
            _check_frame(raw, archive)
            with zstandard.ZstdDecompressor().stream_reader(raw, closefd=False) as zr:
                with tarfile.open(fileobj=zr, mode="r|") as tar:
                    meta = _Extractor(tmp, whiteouts=whiteouts, meter=meter).run(tar)
                while zr.read(_CHUNK):  # on to the end of the frame: checks zstd's checksum
                    pass
        return meta

    return _extract_atomically(Path(dest), f"layer {archive}", extract)


def unpack_plain_tar(data: bytes | BinaryIO, dest: Path, *, meter: Meter | None = None) -> None:
    """Extract an uncompressed tar of a sandbox folder (members ``.`` and ``./...``, as
    ``tar -C dir -cf - .`` makes) into ``dest``, which must not exist, onto the host.

    Same checks, atomicity and ``meter`` as ``unpack_layer``, for a tar an agent may have crafted,
    except that ``.wh.`` names are ordinary files, owners are not restored (the files
    belong to the caller) and setuid/setgid/sticky bits are dropped.
    """
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data

    def extract(tmp: Path) -> dict:
        with tarfile.open(fileobj=src, mode="r|") as tar:
            return _Extractor(tmp, prefix=".", whiteouts=None, meter=meter).run(tar)

    _extract_atomically(Path(dest), "tar", extract)


def _extract_atomically(dest: Path, what: str, extract) -> dict:
    """Run ``extract(tmp)`` on a fresh temp sibling of ``dest``, then rename it to ``dest``;
    on any error remove it, so ``dest`` is either complete or absent."""
    if os.path.lexists(dest):
        raise SnapshotError(f"cannot unpack {what}: {dest} already exists")
    try:
        tmp = temp_dir(dest.parent, "unpack")
    except OSError as e:
        raise SnapshotError(f"cannot unpack {what} into {dest}: {e}") from e
    try:
        result = extract(tmp)
        if os.path.lexists(dest):
            raise SnapshotError(f"cannot unpack {what}: {dest} appeared while unpacking")
        os.rename(tmp, dest)
        return result
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, SnapshotError):
            raise
        # ArithmeticError: absurd numbers in a crafted header (mtime=1e99999, huge uid).
        if isinstance(e, (OSError, tarfile.TarError, zstandard.ZstdError, ValueError, ArithmeticError)):
            raise SnapshotError(f"cannot unpack {what}: {e}") from e
        raise


def _load_meta(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict:
    if not member.isreg() or member.size > _META_MAX:
        raise SnapshotError(f"{META_NAME} must be a regular file of at most {_META_MAX} bytes")
    meta = json.loads(tar.extractfile(member).read())
    if not isinstance(meta, dict):
        raise SnapshotError(f"{META_NAME} must hold a JSON object")
    return meta


def _check_frame(f: BinaryIO, archive: Path) -> None:
    """Require ``f`` to hold exactly one whole zstd frame, by walking its block headers (a
    few seeks per MiB, no decompression): python-zstandard's stream reader reports neither
    a frame cut short nor bytes after it. Leaves ``f`` at offset 0."""
    head = f.read(5)
    if len(head) < 5 or head[:4] != b"\x28\xb5\x2f\xfd":
        raise SnapshotError(f"layer {archive} is not a zstd frame")
    fhd, single_segment = head[4], head[4] & 0x20
    fcs_size = (1 if single_segment else 0, 2, 4, 8)[fhd >> 6]
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3] + fcs_size
    last = False
    while not last:
        f.seek(pos)
        block = f.read(3)
        if len(block) < 3:
            raise SnapshotError(f"layer {archive} is truncated")
        header = int.from_bytes(block, "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        pos += 3 + (1 if kind == 1 else size)  # an RLE block stores its byte once
    pos += 4 if fhd & 0x04 else 0  # content checksum
    end = os.fstat(f.fileno()).st_size
    if pos != end:
        raise SnapshotError(f"layer {archive} is {'truncated' if pos > end else 'followed by stray bytes'}")
    f.seek(0)


class _Extractor:
    """Writes streamed tar members under ``root`` after checking each one.

    Refused (``UnsafeArchiveError``): absolute names, ``..``/``.``/empty components, names
    outside the root ``prefix`` (``rootfs/``; a leading ``rockroll.json`` is the metadata),
    device nodes, duplicates, a member whose parent is not a directory created earlier by
    the archive (so nothing is ever written through an archive-made symlink), hardlinks to
    anything but an earlier non-directory member, relative symlinks that climb above the
    root, and malformed whiteouts. Setuid and setgid bits are dropped; past the ``meter``'s
    limit, ``StorageLimitError``. Absolute symlink targets are allowed: they are only
    meaningful inside the sandbox, whose mount namespace resolves ``/`` to the sandbox
    root, and this module never follows a link. Files are created with
    ``O_CREAT|O_EXCL|O_NOFOLLOW``.
    """

    def __init__(self, root: Path, *, prefix: str = ROOT, whiteouts: str | None = "overlay",
                 meter: Meter | None = None):
        # whiteouts: "overlay" applies them, "keep" checks them and writes them as files,
        # None (a plain tar headed for the host) treats .wh. names as ordinary files and
        # keeps neither owners nor the sticky bit. No layer keeps setuid/setgid: there is
        # no trusted source for which they would be worth it (see unpack_layer).
        self.root, self.prefix, self.whiteouts, self.meter = root, prefix, whiteouts, meter
        self.overlay = whiteouts == "overlay"
        self.chown = whiteouts is not None and os.geteuid() == 0
        self.mode_mask = 0o1777 if whiteouts is not None else 0o777
        self.seen: set[str] = set()  # rootfs-relative names created (or whited out)
        self.dirs: set[str] = {""}  # directories created by the archive
        self.linkable: set[str] = set()  # non-directories a hardlink may point at
        self.dir_attrs: list[tuple[Path, tarfile.TarInfo]] = []  # applied last: writing children changes mtime

    def run(self, tar: tarfile.TarFile) -> dict:
        meta: dict = {}
        first = True
        os.chmod(self.root, 0o755)  # mkdtemp's 0700 unless the archive says otherwise
        while (member := tar.next()) is not None:
            tar.members.clear()  # streamed: don't let tarfile keep every member in memory
            if first and member.name == META_NAME and self.whiteouts is not None:
                meta = _load_meta(tar, member)
            else:
                self.add(tar, member)
            first = False
        # tarfile stops silently at a missing or partial header (a cut-off stream); a complete
        # archive ends with a zero block, which tarfile has then read whole.
        if tar.fileobj.tell() != tar.offset + tarfile.BLOCKSIZE:
            raise tarfile.ReadError("truncated: the end-of-archive block is missing")
        for path, member in reversed(self.dir_attrs):  # children before parents
            self.set_attrs(path, member)
        return meta

    def add(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        rel = _rel(m.name, m.name, self.prefix)
        if self.meter is not None:  # before anything of it is written
            self.meter.charge(MEMBER_BYTES + (m.size if m.isreg() else 0))
        if m.ischr() or m.isblk():
            raise UnsafeArchiveError(m.name, "device nodes are refused (whiteouts are .wh. files)")
        if rel in self.seen:
            raise UnsafeArchiveError(m.name, "duplicate member")
        if rel == "":
            if not m.isdir():
                raise UnsafeArchiveError(m.name, f"{self.prefix} must be a directory")
            self.seen.add(rel)
            self.dir_attrs.append((self.root, m))
            return
        parent, _, base = rel.rpartition("/")
        if parent not in self.dirs:
            raise UnsafeArchiveError(m.name, "parent is not a directory created earlier in the archive")
        # Belt and braces: the parent on disk must be a real directory, not a symlink.
        if not stat.S_ISDIR(os.lstat(self.root / parent).st_mode):
            raise UnsafeArchiveError(m.name, "parent is not a directory")
        path = self.root / rel
        if self.whiteouts and base.startswith(WH_PREFIX) and self.whiteout(m, parent, base):
            self.seen.add(rel)
            return
        self.seen.add(rel)
        if m.isdir():
            os.mkdir(path, 0o700)
            self.dirs.add(rel)
            self.dir_attrs.append((path, m))
            return
        if m.isreg():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(tar.extractfile(m), out, _CHUNK)
                out.flush()
                self.set_attrs(out.fileno(), m)
        elif m.issym():
            if not m.linkname or _climbs(rel, m.linkname):
                raise UnsafeArchiveError(m.name, f"symlink target {m.linkname!r} leaves {self.prefix}/")
            os.symlink(m.linkname, path)
            self.set_attrs(path, m)
        elif m.islnk():
            target = _rel(m.linkname, m.name, self.prefix)
            if target not in self.linkable:
                raise UnsafeArchiveError(m.name, f"hardlink target {m.linkname!r} is not an earlier file member")
            # follow_symlinks=False: linking to an archive-made symlink must link the symlink
            # itself, never the host file it points at.
            os.link(self.root / target, path, follow_symlinks=False)
        elif m.isfifo():
            os.mkfifo(path, 0o600)
            self.set_attrs(path, m)
        else:
            raise UnsafeArchiveError(m.name, f"unsupported member type {m.type!r}")
        self.linkable.add(rel)

    def whiteout(self, m: tarfile.TarInfo, parent: str, base: str) -> bool:
        """Check a ``.wh.`` member; return True if it was applied as an overlay whiteout."""
        if not m.isreg() or m.size:
            raise UnsafeArchiveError(m.name, "a whiteout must be an empty regular file")
        parent_path = self.root / parent
        if base == WH_OPAQUE:
            if not self.overlay:
                return False
            try:
                os.setxattr(parent_path, "trusted.overlay.opaque", b"y", follow_symlinks=False)
            except PermissionError:  # unprivileged overlay mounts read user.* with `userxattr`
                os.setxattr(parent_path, "user.overlay.opaque", b"y", follow_symlinks=False)
            return True
        target = base[len(WH_PREFIX) :]
        if target in ("", ".", "..") or target.startswith(WH_PREFIX):
            raise UnsafeArchiveError(m.name, "malformed whiteout name")
        target_rel = f"{parent}/{target}" if parent else target
        if target_rel in self.seen:
            raise UnsafeArchiveError(m.name, "whiteout of an entry the layer also creates")
        self.seen.add(target_rel)  # a later member of that name would contradict the whiteout
        if not self.overlay:
            return False
        os.mknod(parent_path / target, stat.S_IFCHR, os.makedev(0, 0))
        return True

    def set_attrs(self, target: Path | int, m: tarfile.TarInfo) -> None:
        """Owner, then mode (chown clears setuid bits), then mtime; never through a symlink."""
        ns = _mtime_ns(m)
        if isinstance(target, int):
            if self.chown:
                os.chown(target, m.uid, m.gid)
            os.chmod(target, m.mode & self.mode_mask)
            os.utime(target, ns=(ns, ns))
            return
        if self.chown:
            os.chown(target, m.uid, m.gid, follow_symlinks=False)
        if not m.issym():  # Linux symlinks have no mode of their own
            os.chmod(target, m.mode & self.mode_mask, follow_symlinks=False)
        os.utime(target, ns=(ns, ns), follow_symlinks=False)


def _rel(name: str, member: str, prefix: str = ROOT) -> str:
    """Root-relative form of an archive name ("" for the root itself), or UnsafeArchiveError."""
    if name.startswith("/"):
        raise UnsafeArchiveError(member, f"absolute name {name!r}")
    parts = name.split("/")
    if ".." in parts:
        raise UnsafeArchiveError(member, f"'..' in {name!r}")
    if parts[0] != prefix:
        raise UnsafeArchiveError(member, f"{name!r} is outside {prefix}/")
    if any(p in ("", ".") for p in parts[1:]):
        raise UnsafeArchiveError(member, f"non-canonical name {name!r}")
    return "/".join(parts[1:])


def _climbs(rel: str, target: str) -> bool:
    """Whether a relative symlink at ``rel`` lexically climbs above rootfs (absolute: no)."""
    if target.startswith("/"):
        return False
    depth = rel.count("/")  # directories between rootfs/ and the link
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _mtime_ns(m: tarfile.TarInfo) -> int:
    # The pax text keeps nanoseconds; tarfile's float ``m.mtime`` does not.
    value = Decimal(m.pax_headers.get("mtime", m.mtime))
    if not value.is_finite() or abs(value) > 2**40:
        raise SnapshotError(f"member {m.name!r} has an impossible mtime {value}")
    return int(value.scaleb(9))
