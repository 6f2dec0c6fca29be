"""The hub client's local state, under the sandbox state home:

    <home>/snapshots/sha256/<hex>.tar.zst      layer tarballs  } the sandbox's SnapshotStore:
    <home>/layers/sha256/<hex>/                unpacked layers } sandboxes mount these directly
    <home>/hub-cache/<hub id>/url              which hub a cache folder belongs to
    <home>/hub-cache/<hub id>/envs/<name>/<version>.json   manifests seen (immutable, so always valid)
    <home>/hub-cache/<hub id>/listing.json     the hub's last listing (offline resolution)
    <home>/hub-cache/owned/<hex>               layers the hub put in the store (the only ones gc may delete)
    <home>/hub-builds/<name>/<version>.json    manifests of local builds (not published yet)

Layers are shared by every env (and hub) that names them: the store is content-addressed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rockroll.sandbox.home import state_home
from rockroll.sandbox.storage.snapshots import SnapshotStore
from rockroll.sandbox.storage.temps import temp_name

from .errors import HubError
from .manifest import EnvManifest

GC_GRACE_S = 600  # never collect what was written this recently: a pull may be about to mount it


def hub_id(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(temp_name("write"))
    tmp.write_bytes(data)
    os.replace(tmp, path)


class LocalCache:
    def __init__(self, home: Path | None = None):
        self.home = Path(home) if home else state_home()
        self.layers = SnapshotStore(self.home)
        self.root = self.home / "hub-cache"

    # ----------------------------------------------------------- manifests and listings
    def hub_dir(self, url: str) -> Path:
        d = self.root / hub_id(url)
        if not (d / "url").exists():
            write_atomic(d / "url", url.encode())
        return d

    def manifest_file(self, url: str, name: str, version: str) -> Path:
        return self.root / hub_id(url) / "envs" / name / f"{version}.json"

    def save_manifest(self, url: str, manifest: EnvManifest) -> None:
        self.hub_dir(url)
        write_atomic(self.manifest_file(url, manifest.name, manifest.version), manifest.to_json())

    def load_manifest(self, url: str, name: str, version: str) -> EnvManifest | None:
        path = self.manifest_file(url, name, version)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return EnvManifest.from_json(raw, str(path))

    def save_listing(self, url: str, listing: dict[str, dict[str, bool]]) -> None:
        write_atomic(self.hub_dir(url) / "listing.json", json.dumps(listing, sort_keys=True).encode())

    def load_listing(self, url: str) -> dict[str, dict[str, bool]]:
        """The last listing seen, plus every cached manifest (so an env pulled by exact
        version resolves offline even if it was never listed)."""
        d = self.root / hub_id(url)
        try:
            listing = json.loads((d / "listing.json").read_text())
        except (OSError, ValueError):
            listing = {}
        envs = d / "envs"
        if envs.is_dir():
            for env_dir in envs.iterdir():
                for f in env_dir.glob("*.json"):
                    listing.setdefault(env_dir.name, {}).setdefault(f.name[:-5], False)
        return listing

    # ----------------------------------------------------------- layers
    def mark_owned(self, digest: str) -> None:
        marker = self.root / "owned" / digest.split(":", 1)[1]
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()

    def has_layer(self, digest: str) -> bool:
        return (self.layers.layer_root / digest.split(":", 1)[1]).is_dir()

    def build_file(self, name: str, version: str) -> Path:
        return self.home / "hub-builds" / name / f"{version}.json"

    def cached_manifests(self) -> list[tuple[Path, EnvManifest]]:
        out = []
        files = list(self.root.glob("*/envs/*/*.json")) + list((self.home / "hub-builds").glob("*/*.json"))
        for f in files:
            try:
                out.append((f, EnvManifest.from_json(f.read_bytes(), str(f))))
            except (OSError, HubError):
                continue  # unreadable: it protects nothing, and gc never deletes manifests it cannot read
        return out


@dataclass
class GcResult:
    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    in_use: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)


def live_lower_dirs(home: Path) -> set[str] | None:
    """The overlay lower dirs of every live sandbox of ``home`` (read from the mountinfo of
    each sandbox's init, found through the run registry), or None if some live sandbox
    cannot be inspected (starting, or unreadable): then gc deletes nothing."""
    from rockroll.sandbox.deployment.reaper import list_runs

    lowers: set[str] = set()
    for run in list_runs(home):
        if not run.alive:
            continue  # its sandboxes are dead; `rockroll sandbox gc` reaps them
        for sb in run.sandboxes:
            try:
                pid = json.loads((home / "runs" / run.run_id / sb / "guest.json").read_text())["init_pid"]
                with open(f"/proc/{pid}/mountinfo") as f:
                    text = f.read()
            except (OSError, ValueError, KeyError):
                return None
            for line in text.splitlines():
                fields = line.partition(" - ")[2].split()
                if len(fields) >= 3 and fields[0] == "overlay":
                    for opt in fields[2].split(","):
                        if opt.startswith("lowerdir="):
                            lowers.update(p.replace("\\040", " ") for p in opt[9:].split(":"))
    return lowers


def gc(cache: LocalCache, *, evict: tuple[str, ...] = (), dry_run: bool = False) -> GcResult:
    """Delete hub layers (tarball + unpacked dir) that no cached manifest or local build
    names, that no live sandbox mounts, and that are older than ``GC_GRACE_S``.

    Conservative by construction: only layers the hub itself put in the store (``owned``)
    are candidates, so user snapshots are never touched; if a live sandbox cannot be
    inspected nothing is deleted. ``evict`` (``name`` or ``name@version``) first drops those
    cached manifests, so their layers become collectable.
    """
    result = GcResult()
    for ref in evict:
        name, _, version = ref.partition("@")
        for f in cache.root.glob(f"*/envs/{name}/{version or '*'}.json"):
            if not dry_run:
                f.unlink(missing_ok=True)
            result.evicted.append(f"{name}@{f.name[:-5]}")
    keep = {l.digest.split(":", 1)[1] for _, m in cache.cached_manifests() for l in m.blobs()}
    owned_dir = cache.root / "owned"
    candidates = [p.name for p in owned_dir.iterdir()] if owned_dir.is_dir() else []
    candidates = [h for h in candidates if h not in keep]
    if not candidates:
        return result
    lowers = live_lower_dirs(cache.home)
    if lowers is None:
        raise HubError("gc: a live sandbox could not be inspected (starting up?); nothing deleted, try again")
    lowers = {os.path.realpath(p) for p in lowers}
    now = time.time()
    for hexd in candidates:
        tar = cache.layers.tar_root / "sha256" / f"{hexd}.tar.zst"
        layer = cache.layers.layer_root / hexd
        if os.path.realpath(layer) in lowers:
            result.in_use.append(f"sha256:{hexd}")
            continue
        recent = [p for p in (tar, layer) if p.exists() and now - p.stat().st_ctime < GC_GRACE_S]
        if recent:
            result.in_use.append(f"sha256:{hexd}")
            continue
        size = tar.stat().st_size if tar.exists() else 0
        if not dry_run:
            tar.unlink(missing_ok=True)
            cache.layers.drop_layer(f"sha256:{hexd}")
            (owned_dir / hexd).unlink(missing_ok=True)
        result.removed.append(f"sha256:{hexd}")
        result.freed_bytes += size
    return result
