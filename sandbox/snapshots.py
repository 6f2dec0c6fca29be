"""The local snapshot store: layer tarballs by digest, and their unpacked directories.

``<home>/snapshots/sha256/<hex>.tar.zst`` are the portable tarballs (what ``Snapshot``
points at, what a hub or a service ships); ``<home>/layers/sha256/<hex>/`` are the same
layers unpacked once, ready to be stacked as overlayfs lower dirs, which is why
``restore()`` and ``fork()`` cost a remount and not an extraction.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import SnapshotError
from .layers import digest_file, read_meta, unpack_layer
from .spec import Snapshot


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
        """A ``Snapshot`` from a Snapshot, a digest (``sha256:...``) or a tarball path.

        Every layer of the chain is unpacked before this returns, so a crafted tarball
        is refused here (``UnsafeArchiveError``) before anything is mounted.
        """
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
