"""The local snapshot store: layer tarballs by digest, and their unpacked directories.

``<home>/snapshots/sha256/<hex>.tar.zst`` are the portable tarballs (what ``Snapshot``
points at, what a hub or a service ships); ``<home>/layers/sha256/<hex>/`` are the same
layers unpacked once, ready to be stacked as overlayfs lower dirs, which is why
``restore()`` and ``fork()`` cost a remount and not an extraction.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import SnapshotError
from .layers import digest_file, read_meta, unpack_layer
from ..spec import Snapshot


# Snapshot-ref schemes other packages plug in (``"hub:name@ver#snap"`` from
# rockroll.envhub), registered rather than imported: the sandbox depends on nothing else.
_SNAPSHOT_RESOLVERS: dict[str, Callable[[str, "SnapshotStore"], Snapshot]] = {}


def register_snapshot_resolver(scheme: str, fn: Callable[[str, "SnapshotStore"], Snapshot]) -> None:
    """Make ``snapshot="<scheme>:<ref>"`` loadable: ``fn(ref, store)`` returns a ``Snapshot``
    whose ``layers`` (base first) are tarballs in ``store`` (it pulls them if needed) and whose
    ``image`` is the image the snapshot runs on. ``sha256`` is reserved for digests."""
    if not scheme or ":" in scheme or scheme == "sha256":
        raise ValueError(f"bad snapshot scheme {scheme!r}")
    _SNAPSHOT_RESOLVERS[scheme] = fn


def _resolver_for(ref: str):
    scheme, sep, _ = ref.partition(":")
    # A tarball path that happens to contain ':' ("./a:b.tar.zst") is no scheme: schemes are
    # plain words and the path would have to exist.
    if not sep or not scheme.isidentifier() or os.path.exists(ref):
        return None
    return _SNAPSHOT_RESOLVERS.get(scheme)


class SnapshotStore:
    def __init__(self, home: Path):
        self.tar_root = home / "snapshots"
        self.layer_root = home / "layers" / "sha256"

    def tarball(self, digest: str) -> Path:
        return self.tar_root / "sha256" / f"{_hex(digest)}.tar.zst"

    def layer_dir(self, digest: str) -> Path:
        """The unpacked layer, unpacking it (safely, atomically) on first use."""
        dest = self.layer_root / _hex(digest)
        if dest.is_dir():
            return dest
        src = self.tarball(digest)
        if not src.is_file():
            raise SnapshotError(f"layer {digest} is not in the local store ({src})")
        self.layer_root.mkdir(parents=True, exist_ok=True)
        try:
            unpack_layer(src, dest)
        except (FileExistsError, OSError) as e:
            if not dest.is_dir():  # lost a race with another unpacker: fine; else real error
                raise SnapshotError(f"cannot unpack layer {digest}: {e}") from e
        return dest

    def staging_dir(self) -> Path:
        """A fresh, empty path beside the layers (same filesystem, so adopting is a rename)."""
        self.layer_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".stage-", dir=self.layer_root))

    def adopt_layer(self, digest: str, staged: Path) -> Path:
        """Make ``staged`` (a copy of exactly what was packed) the unpacked layer of
        ``digest``; if that layer exists already, drop the copy."""
        dest = self.layer_root / _hex(digest)
        try:
            os.rename(staged, dest)
        except OSError:
            if not dest.is_dir():
                raise
            shutil.rmtree(staged, ignore_errors=True)
        return dest

    def import_tarball(self, path: Path) -> str:
        """Add a tarball from elsewhere; its digest is computed, never trusted."""
        digest = digest_file(path)
        dest = self.tarball(digest)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, dest)
        return digest

    def load(self, ref: "Snapshot | str | Path") -> Snapshot:
        """A ``Snapshot`` from a Snapshot, a digest (``sha256:...``), a tarball path, or a
        ``<scheme>:<ref>`` string of a registered resolver (``hub:name@1.0.0#warm``).

        Every layer of the chain is unpacked before this returns, so a crafted tarball
        is refused here (``UnsafeArchiveError``) before anything is mounted.
        """
        if isinstance(ref, str) and (fn := _resolver_for(ref)) is not None:
            snap = fn(ref.partition(":")[2], self)
            for digest in snap.layers:  # same guarantee as below: unpacked (and checked) first
                self.layer_dir(digest)
            return snap
        if isinstance(ref, Snapshot):
            if ref.path is not None and not self.tarball(ref.digest).exists():
                digest = self.import_tarball(Path(ref.path))
                if digest != ref.digest:
                    raise SnapshotError(f"snapshot file {ref.path} has digest {digest}, not {ref.digest}")
            digest = ref.digest
        elif isinstance(ref, Path) or (isinstance(ref, str) and not ref.startswith("sha256:")):
            digest = self.import_tarball(Path(ref))
        else:
            digest = ref
        self.layer_dir(digest)
        meta = read_meta(self.tarball(digest))
        parents = tuple(meta.get("parents", ()))
        for parent in parents:
            self.layer_dir(parent)
        path = self.tarball(digest)
        return Snapshot(id=_hex(digest)[:12], digest=digest, size=path.stat().st_size,
                        layers=parents + (digest,), image=meta.get("image", "host"), path=path)


def _hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
        raise SnapshotError(f"not a sha256 digest: {digest!r}")
    return hexpart


def copy_tree(src: Path, dest: Path) -> None:
    """Copy an overlay upper dir exactly: owners, modes, times, hardlinks, whiteouts (0/0
    char devices) and the opaque xattr. ``cp -a`` does all of it, with reflinks where the
    filesystem has them; ``dest`` must exist and be empty."""
    out = subprocess.run(["cp", "-a", "--reflink=auto", "--", f"{src}/.", str(dest)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SnapshotError(f"cannot copy the sandbox's files: {out.stderr.strip()}")
