"""Resolve an env ref against a hub and bring its layers into the local store.

``pull("counter@1")`` lists the hub (one request), picks the version (``version.select``),
reads the manifest, downloads only the blobs the local store lacks, verifies each against
its digest before anything uses it, and unpacks it once into the content-addressed layer
cache that every env sharing the layer uses.

Offline: manifests are immutable, so an exact pin whose manifest is cached never touches
the network; a range (``counter@1``) needs the listing, and falls back to the last one
seen when the hub cannot be reached. In-process, results are memoised, so the sandbox's
image resolver costs a dict lookup and a few ``stat`` calls per sandbox start.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from rockroll.sandbox.errors import StorageLimitError
from rockroll.sandbox.storage.layers import digest_file
from rockroll.sandbox.storage.temps import temp_name

from .cache import LocalCache
from .errors import BlobCorrupted, EnvNotFound, StoreUnavailable, YankedWarning
from .manifest import EnvManifest, LayerRef
from .store import HubStore, default_hub_url, normalize_url
from .version import EnvRef, select


@dataclass(frozen=True)
class PulledEnv:
    """An env whose layers are all unpacked locally."""

    hub: str
    manifest: EnvManifest
    layer_dirs: tuple[Path, ...]  # top first: overlay lowerdir order
    yanked: bool = False
    private_dir: Path | None = None  # the host-only files, unpacked (in no sandbox layer)

    @property
    def image(self) -> str:
        return f"hub:{self.manifest.ref}"

    def find(self, sandbox_path: str | None) -> Path | None:
        """The host path of a file the env's layers hold (top layer wins), e.g. its tasks."""
        if not sandbox_path:
            return None
        for d in self.layer_dirs:
            p = d / sandbox_path.lstrip("/")
            if os.path.lexists(p):
                return p
        return None

    @property
    def tasks_file(self) -> Path | None:
        return self.find(self.manifest.tasks)

    @property
    def python_path(self) -> Path | None:
        return self.find(self.manifest.python)


# In-process memo: (local home, hub url, name, spec) -> PulledEnv, and (home, name, spec)
# -> the last one pulled from any hub (what a bare "hub:name@1.0.0" image means). Module state on purpose:
# it is what keeps sandbox starts off the network; entries only ever point at immutable
# manifests, and yank/publish in this process drop the entries of that env.
_MEMO: dict[tuple[str, str, str, str], PulledEnv] = {}
_LAST: dict[tuple[str, str, str], PulledEnv] = {}
_LOCK = threading.Lock()


def forget(name: str | None = None) -> None:
    """Drop memoised resolutions (of one env, or all)."""
    with _LOCK:
        for memo in (_MEMO, _LAST):
            for key in [k for k in memo if name is None or k[-2] == name]:
                del memo[key]


def memoised(ref: str | EnvRef, home: Path) -> PulledEnv | None:
    """The env a bare ``name@spec`` was last pulled as in this process (any hub) into ``home``."""
    ref = EnvRef.parse(ref) if isinstance(ref, str) else ref
    with _LOCK:
        env = _LAST.get((str(home), ref.name, ref.spec))
    return env if env is not None and all(d.is_dir() for d in env.layer_dirs) else None


def resolve(ref: str | EnvRef, store: HubStore, cache: LocalCache) -> tuple[EnvManifest, bool]:
    """The manifest a ref means, and whether that version is yanked."""
    ref = EnvRef.parse(ref) if isinstance(ref, str) else ref
    if ref.exact:
        cached = cache.load_manifest(store.url, ref.name, ref.spec)
        if cached is not None:  # immutable: no need to ask the hub
            yanked = cache.load_listing(store.url).get(ref.name, {}).get(ref.spec, False)
            return cached, _warn_if_yanked(cached, yanked)
    try:
        listing = store.listing()
        cache.save_listing(store.url, listing)
    except StoreUnavailable as e:
        listing = cache.load_listing(store.url)
        if ref.name not in listing:
            raise
        print(f"warning: {e}; resolving {ref} from the local cache", file=sys.stderr)
    versions = listing.get(ref.name)
    if not versions:
        raise EnvNotFound(f"no env named {ref.name!r} in {store.url}")
    version, yanked = select(versions, ref.spec, ref.name)
    manifest = cache.load_manifest(store.url, ref.name, version)
    if manifest is None:
        raw = store.read(store.manifest_path(ref.name, version))
        if raw is None:
            raise EnvNotFound(f"{ref.name}@{version} vanished from {store.url} while resolving")
        manifest = EnvManifest.from_json(raw, f"{store.url}/{store.manifest_path(ref.name, version)}")
        if (manifest.name, manifest.version) != (ref.name, version):
            raise EnvNotFound(f"manifest at {ref.name}@{version} describes {manifest.ref}")
        cache.save_manifest(store.url, manifest)
    return manifest, _warn_if_yanked(manifest, yanked)


def _warn_if_yanked(manifest: EnvManifest, yanked: bool) -> bool:
    if yanked:
        warnings.warn(f"{manifest.ref} was yanked by its publisher; pulling it because it is pinned",
                      YankedWarning, stacklevel=3)
    return yanked


def pull(ref: str | EnvRef, *, hub: str | HubStore | None = None, cache: LocalCache | None = None,
         endpoint: str | None = None) -> PulledEnv:
    """Resolve ``ref`` on ``hub`` (default hub if None) and make its layers local."""
    ref = EnvRef.parse(ref) if isinstance(ref, str) else ref
    cache = cache or LocalCache()
    url = hub.url if isinstance(hub, HubStore) else normalize_url(hub or default_hub_url())
    with _LOCK:
        hit = _MEMO.get((str(cache.home), url, ref.name, ref.spec))
    if hit is not None and all(d.is_dir() for d in hit.layer_dirs):
        return hit
    store = hub if isinstance(hub, HubStore) else HubStore(url, endpoint=endpoint)
    manifest, yanked = resolve(ref, store, cache)
    blobs = [layer.digest for layer in manifest.blobs()]
    for layer in manifest.blobs():
        fetch_layer(layer, store, cache)
    # Unpacked together, so the env's layers, snapshots and private files stay within
    # max_chain_bytes as well as max_layer_bytes each (a hub's writers are not trusted).
    dirs = dict(zip(blobs, cache.layers.unpack_chain(blobs)))
    private = dirs[manifest.private.digest] if manifest.private else None
    env = PulledEnv(store.url, manifest, tuple(dirs[l.digest] for l in reversed(manifest.layers)), yanked, private)
    with _LOCK:
        for spec in {ref.spec, manifest.version}:
            _MEMO[(str(cache.home), store.url, ref.name, spec)] = env
            _LAST[(str(cache.home), ref.name, spec)] = env
    return env


def fetch_layer(layer: LayerRef, store: HubStore, cache: LocalCache) -> Path:
    """Make one layer's tarball local, verified against its digest before anything uses
    it; return it (``pull`` unpacks). A blob larger than ``max_layer_bytes``, or one the
    free-space reserve has no room for, is refused before it is downloaded."""
    tarball = cache.layers.tarball(layer.digest)
    if cache.has_layer(layer.digest) or (tarball.exists() and digest_file(tarball) == layer.digest):
        return tarball
    tarball.unlink(missing_ok=True)  # a corrupt local copy: fetch it again
    limits = cache.layers.limits
    if layer.size > limits.max_layer_bytes:
        raise StorageLimitError("max_layer_bytes", limits.max_layer_bytes,
                                f"hub blob {layer.digest} is {layer.size} bytes")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    limits.check_free(tarball.parent, layer.size, f"hub blob {layer.digest}")
    tmp = tarball.with_name(temp_name("pull", ".part"))
    try:
        got = store.get_blob(layer, tmp, max_bytes=limits.max_layer_bytes)  # hashed as it arrived
        size = tmp.stat().st_size
        if got != layer.digest:
            what = (f"truncated ({size} of {layer.size} bytes)" if size < layer.size else
                    f"corrupted: its bytes hash to {got}")
            raise BlobCorrupted(layer.digest, f"the copy in {store.url} is {what}; the local copy was "
                                              "deleted and a retry downloads it again")
        os.replace(tmp, tarball)
    finally:
        tmp.unlink(missing_ok=True)
    cache.mark_owned(layer.digest)
    return tarball
