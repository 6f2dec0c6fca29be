"""Overlay whiteouts applied by hand: merging an unpacked layer into an overlay upper
directory that is not mounted (the docker deployment builds a snapshot chain's image so)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

OPAQUE_XATTR = "trusted.overlay.opaque"  # docker's overlay2 mounts without userxattr

def apply_layer(layer: Path, upper: Path) -> None:
    """Merge an unpacked layer (overlay whiteouts, as ``SnapshotStore.layer_dir`` holds)
    into an overlay upper dir that is not mounted, as if stacked on top of it: a whiteout
    or a non-directory replaces what is there; an opaque directory drops what was under
    it; a plain directory merges (made opaque if it replaces a non-directory, which hid
    everything below). Owners, modes and mtimes are kept; hardlinks within the layer stay
    links. Nothing is followed: symlinks are copied as links."""
    links: dict[tuple[int, int], Path] = {}
    dirs: list[tuple[Path, os.stat_result]] = []  # attrs set last: filling a dir changes its mtime
    for root, dirnames, filenames in os.walk(layer):  # top-down: a dir is settled before its children
        dst_root = upper / os.path.relpath(root, layer)
        for name in dirnames + filenames:
            src, dst = os.path.join(root, name), dst_root / name
            st = os.lstat(src)
            if stat.S_ISDIR(st.st_mode):
                opaque = _is_opaque(src)
                existing = os.path.lexists(dst)
                if opaque or (existing and (dst.is_symlink() or not dst.is_dir())):
                    _remove_path(dst)
                    os.mkdir(dst)
                    os.setxattr(dst, OPAQUE_XATTR, b"y")
                elif not existing:
                    os.mkdir(dst)
                dirs.append((dst, st))
                continue
            _remove_path(dst)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # whiteout
                os.mknod(dst, stat.S_IFCHR, 0)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(dst)
            elif stat.S_ISREG(st.st_mode):
                if (st.st_dev, st.st_ino) in links:
                    os.link(links[(st.st_dev, st.st_ino)], dst)
                    continue
                shutil.copyfile(src, dst, follow_symlinks=False)
                if st.st_nlink > 1:
                    links[(st.st_dev, st.st_ino)] = dst
            else:
                continue  # layers hold no sockets or devices
            _set_attrs(dst, st)
    for path, st in reversed(dirs):
        _set_attrs(path, st)


def _is_opaque(path: str) -> bool:
    for key in (OPAQUE_XATTR, "user.overlay.opaque"):
        try:
            if os.getxattr(path, key, follow_symlinks=False) == b"y":
                return True
        except OSError:
            pass
    return False


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _set_attrs(path: Path, st: os.stat_result) -> None:
    """Owner, then mode (chown clears setuid bits), then mtime; never through a symlink."""
    os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
