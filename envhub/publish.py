"""Publish a built env to a hub, and yank a published version.

Order is what makes it safe: blobs first (skipping those already there: dedup across
versions and envs), the manifest last and only if absent. A publisher that dies half way
leaves only unreferenced blobs, never a visible version; a retry skips what arrived.
Versions are immutable: the same manifest again is a no-op, a different one is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from .cache import LocalCache
from .errors import BlobCorrupted, EnvNotFound, HubError, VersionConflict
from .manifest import EnvManifest, LayerRef
from .pull import forget
from .store import HubStore
from .version import EnvRef


@dataclass
class PublishResult:
    ref: str
    hub: str
    created: bool  # False: this exact version was already published (no-op)
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0


def publish(manifest: EnvManifest, store: HubStore, *, cache: LocalCache | None = None,
            on_blob: Callable[[LayerRef], None] | None = None) -> PublishResult:
    """Upload ``manifest``'s blobs from the local store, then the manifest.
    ``on_blob`` is called after each uploaded blob (progress, tests' fault injection)."""
    cache = cache or LocalCache()
    data = manifest.to_json()
    result = PublishResult(manifest.ref, store.url, created=False)
    existing = store.read(store.manifest_path(manifest.name, manifest.version))
    if existing is not None:
        _same_or_refuse(existing, data, manifest, store)
        return result
    for layer in manifest.blobs():
        if store.has_blob(layer):
            result.skipped.append(layer.digest)
            continue
        local = cache.layers.tarball(layer.digest)
        if not local.is_file():
            raise HubError(f"blob {layer.digest} of {manifest.ref} is not in the local store ({local}); "
                           "build the package again")
        # Never publish a bad blob: every puller would reject it, and the version is immutable.
        # put_blob hashes what it sends and refuses a mismatch before anything is visible.
        if local.stat().st_size != layer.size:
            raise BlobCorrupted(layer.digest, f"the local copy {local} does not match; build again")
        store.put_blob(local, layer)
        result.uploaded.append(layer.digest)
        result.bytes_uploaded += layer.size
        if on_blob is not None:
            on_blob(layer)
    if not store.create(store.manifest_path(manifest.name, manifest.version), data):
        # Another publisher got there between our check and our write.
        _same_or_refuse(store.read(store.manifest_path(manifest.name, manifest.version)) or b"", data, manifest, store)
        return result
    result.created = True
    cache.save_manifest(store.url, manifest)
    forget(manifest.name)
    return result


def _same_or_refuse(existing: bytes, data: bytes, manifest: EnvManifest, store: HubStore) -> None:
    if existing == data:
        return
    try:
        old = json.loads(existing)
        new = json.loads(data)
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    except ValueError:
        diff = ["(unreadable manifest)"]
    raise VersionConflict(f"{manifest.ref} is already published on {store.url} with different content "
                          f"(differs in: {', '.join(diff)}); versions are immutable: bump the version")


def yank(ref: str, store: HubStore, *, reason: str = "", undo: bool = False) -> str:
    """Hide an exact version from resolution (``name``, ``name@1``, ``latest`` skip it);
    those who pinned it still pull it, with a ``YankedWarning``. ``undo`` un-yanks."""
    parsed = EnvRef.parse(ref)
    if not parsed.exact:
        raise EnvNotFound(f"yank needs an exact version (name@1.2.3), not {ref!r}")
    if store.read(store.manifest_path(parsed.name, parsed.spec)) is None:
        raise EnvNotFound(f"{parsed.name}@{parsed.spec} is not published on {store.url}")
    path = store.yank_path(parsed.name, parsed.spec)
    if undo:
        store.delete(path)
    else:
        store.write(path, json.dumps({"reason": reason}).encode())
    forget(parsed.name)
    return f"{parsed.name}@{parsed.spec}"
