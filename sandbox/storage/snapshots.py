"""The local snapshot store: layer tarballs by digest, and their unpacked directories.

``<home>/snapshots/sha256/<hex>.tar.zst`` are the portable tarballs (what ``Snapshot``
points at, what a hub or a service ships); ``<home>/layers/sha256/<hex>/`` are the same
layers unpacked once, ready to be stacked as overlayfs lower dirs, which is why
``restore()`` and ``fork()`` cost a remount and not an extraction; ``<hex>.bytes`` beside
each records what it unpacked to, for the chain bound (``StorageLimits``).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Callable

from ..errors import SnapshotError, StorageLimitError
from ..home import private_home
from ..spec import Snapshot
from .layers import MEMBER_BYTES, digest_file, read_meta, unpack_layer
from .limits import Bound, StorageLimits
from .temps import Swept, sweep, temp_dir, temp_name


# Snapshot-ref schemes other packages plug in (``"hub:name@ver#snap"`` from
# rockroll.envhub), registered rather than imported: the sandbox depends on nothing else.
_SNAPSHOT_RESOLVERS: dict[str, Callable[[str, "SnapshotStore"], Snapshot]] = {}
_SNAPSHOT_FORMS: dict[str, str] = {}  # scheme -> how to write such a ref, for error messages


def register_snapshot_resolver(scheme: str, fn: Callable[[str, "SnapshotStore"], Snapshot], *,
                               form: str | None = None) -> None:
    """Make ``snapshot="<scheme>:<ref>"`` loadable: ``fn(ref, store)`` returns a ``Snapshot``
    whose ``layers`` (base first) are tarballs in ``store`` (it pulls them if needed) and whose
    ``image`` is the image the snapshot runs on. ``sha256`` is reserved for digests. ``form``
    shows how to write such a ref (``"hub:<name>@<version>#<snapshot>"``) where an unknown
    snapshot is refused."""
    if not scheme or ":" in scheme or scheme == "sha256":
        raise ValueError(f"bad snapshot scheme {scheme!r}")
    _SNAPSHOT_RESOLVERS[scheme] = fn
    _SNAPSHOT_FORMS[scheme] = form or f"{scheme}:<ref>"


def _resolver_for(ref: str):
    scheme, sep, _ = ref.partition(":")
    # A tarball path that happens to contain ':' ("./a:b.tar.zst") is no scheme: schemes are
    # plain words and the path would have to exist.
    if not sep or not scheme.isidentifier() or os.path.exists(ref):
        return None
    return _SNAPSHOT_RESOLVERS.get(scheme)


class SnapshotStore:
    def __init__(self, home: Path, limits: StorageLimits | None = None):
        private_home(home)
        self.limits = limits or StorageLimits.from_env()
        self.tar_root = home / "snapshots"
        self.layer_root = home / "layers" / "sha256"

    def tarball(self, digest: str) -> Path:
        return self.tar_root / "sha256" / f"{_hex(digest)}.tar.zst"

    def layer_dir(self, digest: str, *, room: int | None = None, bound: Bound | None = None) -> Path:
        """The unpacked layer, unpacking it (safely, atomically) on first use, bounded by
        ``max_layer_bytes``, by ``room`` (what its chain has left) and by ``bound`` (the
        caller's, e.g. what a token's quota has left), whichever is smallest."""
        dest = self.layer_root / _hex(digest)
        if dest.is_dir():
            return dest
        src = self.tarball(digest)
        if not src.is_file():
            raise SnapshotError(f"layer {digest} is not in the local store ({src})")
        self.layer_root.mkdir(parents=True, exist_ok=True)
        meter = self.limits.meter(self.layer_root, room=room, what=f"layer {digest}", bound=bound)
        try:
            unpack_layer(src, dest, meter=meter)
        except (SnapshotError, OSError) as e:
            # Another thread or process unpacked the same layer first (sandboxes of a new image
            # starting together): unpack_layer refuses a dest that appears meanwhile, and since a
            # layer is renamed into place whole, the winner's copy is the layer. Else a real error.
            if not dest.is_dir():
                if isinstance(e, SnapshotError):
                    raise
                raise SnapshotError(f"cannot unpack layer {digest}: {e}") from e
            return dest
        _write_int(self._bytes_file(digest), meter.used)
        return dest

    def unpack_chain(self, digests: "tuple[str, ...] | list[str]", *, bound: Bound | None = None) -> list[Path]:
        """Unpack every layer of a chain (base first; already unpacked ones are kept), so
        that together they stay within ``max_chain_bytes``; return their dirs, base first.
        ``bound`` bounds the top layer's unpacking too (see ``load``)."""
        dirs, used = [], 0
        for i, digest in enumerate(digests):
            room = self.limits.max_chain_bytes - used
            if room <= 0:
                raise StorageLimitError("max_chain_bytes", self.limits.max_chain_bytes,
                                        f"the chain up to layer {digest} unpacks to {used} bytes")
            dirs.append(self.layer_dir(digest, room=room, bound=bound if i == len(digests) - 1 else None))
            used += self.layer_bytes(digest)
        if used > self.limits.max_chain_bytes:
            raise StorageLimitError("max_chain_bytes", self.limits.max_chain_bytes,
                                    f"the chain of layer {digests[-1]} unpacks to {used} bytes")
        return dirs

    def layer_bytes(self, digest: str) -> int:
        """What an unpacked layer takes, as its meter counted it (counted now, once, for a
        layer adopted from a sandbox or unpacked by an older version)."""
        path = self._bytes_file(digest)
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            pass
        total = 0
        for root, dirnames, filenames in os.walk(self.layer_root / _hex(digest)):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(root, name))
                total += MEMBER_BYTES + (st.st_size if stat.S_ISREG(st.st_mode) else 0)
        _write_int(path, total)
        return total

    def digests(self) -> set[str]:
        """The digests of every tarball in the store."""
        folder = self.tar_root / "sha256"
        names = os.listdir(folder) if folder.is_dir() else ()
        return {f"sha256:{n[:64]}" for n in names if n.endswith(".tar.zst") and len(n) == 72}

    def stored_bytes(self, digest: str) -> int:
        """What a layer takes in this store: its tarball plus its unpacked files."""
        return self.tarball(digest).stat().st_size + self.layer_bytes(digest)

    def drop_layer(self, digest: str) -> None:
        """Remove an unpacked layer (one refused after unpacking); its tarball stays."""
        shutil.rmtree(self.layer_root / _hex(digest), ignore_errors=True)
        self._bytes_file(digest).unlink(missing_ok=True)

    def remove(self, digest: str) -> None:
        """Remove a layer whole, tarball and unpacked dir (one refused after it was written)."""
        self.tarball(digest).unlink(missing_ok=True)
        self.drop_layer(digest)

    def _bytes_file(self, digest: str) -> Path:
        return self.layer_root / f"{_hex(digest)}.bytes"

    def sweep_temps(self, *, dry_run: bool = False) -> Swept:
        """Remove what writers killed mid-way left in the store: packed tarballs, unpacked and
        staged layers, records (``temps.py``: only those whose writer no longer runs)."""
        return sweep([self.tar_root / "sha256", self.layer_root, self.layer_root.parent], dry_run=dry_run)

    def staging_dir(self) -> Path:
        """A fresh, empty path beside the layers (same filesystem, so adopting is a rename)."""
        self.layer_root.mkdir(parents=True, exist_ok=True)
        return temp_dir(self.layer_root, "stage")

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
        """Add a tarball from elsewhere; its digest is computed, never trusted. A file
        larger than ``max_layer_bytes`` (compressed!) or one the free-space reserve has no
        room for is refused."""
        size = os.stat(path).st_size
        if size > self.limits.max_layer_bytes:
            raise StorageLimitError("max_layer_bytes", self.limits.max_layer_bytes,
                                    f"snapshot file {path} is {size} bytes")
        digest = digest_file(path)
        dest = self.tarball(digest)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.limits.check_free(dest.parent, size, f"snapshot file {path}")
            tmp = dest.with_name(temp_name("import"))
            try:
                shutil.copyfile(path, tmp)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
        return digest

    def load(self, ref: "Snapshot | str | Path", *, bound: Bound | None = None) -> Snapshot:
        """A ``Snapshot`` from a Snapshot, a digest (``sha256:...``), a tarball path, or a
        ``<scheme>:<ref>`` string of a registered resolver (``hub:name@1.0.0#warm``).

        Every layer of the chain is unpacked before this returns, so a crafted tarball
        is refused here (``UnsafeArchiveError``, or ``StorageLimitError`` past a limit)
        before anything is mounted. ``bound`` is one more ceiling on unpacking the top
        layer (the one ``ref`` names, if it is not unpacked yet): the service passes what the
        token's quota has left, so an upload stops as soon as it passes it.
        """
        if isinstance(ref, str) and (fn := _resolver_for(ref)) is not None:
            snap = fn(ref.partition(":")[2], self)
            self.unpack_chain(snap.layers, bound=bound)  # same guarantee as below: unpacked (and checked) first
            return snap
        if isinstance(ref, Snapshot):
            if ref.path is not None and not self.tarball(ref.digest).exists():
                digest = self.import_tarball(Path(ref.path))
                if digest != ref.digest:
                    raise SnapshotError(f"snapshot file {ref.path} has digest {digest}, not {ref.digest}")
            digest = ref.digest
        elif isinstance(ref, Path) or (isinstance(ref, str) and not ref.startswith("sha256:")):
            if not Path(ref).is_file():
                forms = ["a Snapshot", "sha256:<digest>", "the path of a .tar.zst file",
                         *(_SNAPSHOT_FORMS[s] for s in sorted(_SNAPSHOT_FORMS))]
                raise SnapshotError(f"no snapshot {str(ref)!r} (a snapshot is given as "
                                    f"{', '.join(forms[:-1])} or {forms[-1]})")
            digest = self.import_tarball(Path(ref))
        else:
            digest = ref
        if not self.tarball(digest).is_file():
            self.layer_dir(digest)  # raises: not in the store
        meta = read_meta(self.tarball(digest))
        parents = tuple(meta.get("parents", ()))
        self.unpack_chain(parents + (digest,), bound=bound)
        path = self.tarball(digest)
        return Snapshot(id=_hex(digest)[:12], digest=digest, size=path.stat().st_size,
                        layers=parents + (digest,), image=meta.get("image", "host"), path=path)


def _write_int(path: Path, value: int) -> None:
    # unique per writer: threads of one process (a fork's sandboxes) write the same record at once
    tmp = path.with_name(temp_name("record"))
    tmp.write_text(str(value))
    os.replace(tmp, path)


def _hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
        raise SnapshotError(f"not a sha256 digest: {digest!r}")
    return hexpart


def copy_tree(src: Path, dest: Path) -> None:
    """Copy an overlay upper dir exactly: owners, modes, times, hardlinks, whiteouts (0/0
    char devices) and the opaque xattr. ``cp -a`` does all of it, with reflinks where the
    filesystem has them; ``dest`` must exist and be empty. Setuid and setgid bits are
    then dropped from the copy (so from the layer packed from it), as unpacking drops them."""
    out = subprocess.run(["cp", "-a", "--reflink=auto", "--", f"{src}/.", str(dest)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SnapshotError(f"cannot copy the sandbox's files: {out.stderr.strip()}")
    # find never follows links (-P) and ! -type l keeps chmod off them; the copy is ours alone.
    out = subprocess.run(["find", str(dest), "-perm", "/6000", "!", "-type", "l",
                          "-exec", "chmod", "ug-s", "--", "{}", "+"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SnapshotError(f"cannot drop setuid bits from the sandbox's files: {out.stderr.strip()}")
