"""Garbage on a hub's own storage: blobs no manifest names, uploads never finished.

A publish writes blobs first and the manifest last, so a publisher killed half way never
makes the hub list a broken version; what it leaves is invisible but not free: blobs no
manifest references and, on S3, multipart uploads that were started and never completed
or aborted (S3 bills their parts until they are aborted; ``s3blobs.put`` aborts its own on
every error or signal it can catch, a kill -9 it cannot). ``hub_gc`` removes both, and the
temp files a killed ``file://`` publish left, once they are older than ``grace_s``: a
publish in flight has uploaded blobs its manifest does not name yet, and its parts and
temps are recent (an upload's age is that of its newest part, or its start if it has none). It reads every manifest first and deletes nothing if one cannot be read.

Unattended on S3 the same is a lifecycle rule (docs/envhub.md): abort incomplete multipart
uploads after a day. Orphan blobs need this gc: a lifecycle rule cannot tell which
objects a manifest names.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

from .errors import HubError
from .manifest import EnvManifest
from .store import HubStore

HUB_GC_GRACE_S = 24 * 3600.0


@dataclass
class HubGcResult:
    removed: list[str] = field(default_factory=list)  # blob digests
    freed_bytes: int = 0
    recent: list[str] = field(default_factory=list)  # unreferenced, but within the grace period
    aborted_uploads: list[str] = field(default_factory=list)  # "<key> (<upload id>)"
    temps: list[str] = field(default_factory=list)  # paths of a file:// hub's leftover temp files
    referenced: int = 0


def hub_gc(store: HubStore, *, grace_s: float = HUB_GC_GRACE_S, dry_run: bool = False) -> HubGcResult:
    """Delete from ``store`` the blobs no manifest (yanked ones included: they can still be
    pulled) references, abandoned multipart uploads and leftover temp files, each only
    if older than ``grace_s``."""
    result, now = HubGcResult(), time.time()
    keep = _referenced(store)
    result.referenced = len(keep)
    with store._io("listing blobs"):
        try:
            blobs = store.fs.find(store.path("blobs"), detail=True)
        except FileNotFoundError:
            blobs = {}
        temps = _temps(store) if store.local else {}
    for path, info in {**blobs, **temps}.items():
        name = path.rstrip("/").rsplit("/", 1)[-1]
        old = now - _mtime(info, now) >= grace_s
        if name.startswith("."):  # a temp file of a file:// publish
            if old:
                result.temps.append(path)
                if not dry_run:
                    store.delete(path)
            continue
        digest = f"sha256:{name}"
        if digest in keep:
            continue
        if not old:
            result.recent.append(digest)
            continue
        result.removed.append(digest)
        result.freed_bytes += int(info.get("size") or 0)
        if not dry_run:
            store.delete(path)
    if store.protocol in ("s3", "s3a"):
        result.aborted_uploads = _abort_uploads(store, now - grace_s, dry_run)
    return result


def _referenced(store: HubStore) -> set[str]:
    keep = set()
    for name, versions in store.listing().items():
        for version in versions:
            path = store.manifest_path(name, version)
            raw = store.read(path)
            if raw is None:
                continue  # deleted since the listing
            try:
                manifest = EnvManifest.from_json(raw, path)
            except HubError as e:
                raise HubError(f"gc: cannot read {path} ({e}); nothing deleted: a blob it names "
                               "might be taken for garbage") from e
            keep.update(layer.digest for layer in manifest.blobs())
    return keep


def _temps(store: HubStore) -> dict[str, dict]:
    """A ``file://`` hub's temp files (``.tmp-*`` beside blobs and manifests)."""
    out = {}
    for path, info in store.fs.find(store.root, detail=True).items():
        if path.rstrip("/").rsplit("/", 1)[-1].startswith(".") and "/blobs/" not in path:
            out[path] = info
    return out


def _mtime(info: dict, now: float) -> float:
    """When an object was written, from whichever field the filesystem gives (unknown:
    now, so it is kept)."""
    for key in ("LastModified", "mtime", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return now


def _abort_uploads(store: HubStore, before: float, dry_run: bool) -> list[str]:
    client = store._s3().client
    bucket, prefix = store._bucket_key(store.path("x"))
    prefix = prefix[:-1]  # the hub's prefix ("" for a whole bucket), with its trailing '/'
    aborted = []
    with store._io("listing multipart uploads"):
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
            for up in page.get("Uploads", []):
                if _last_activity(client, bucket, up) >= before:
                    continue  # a publish may be sending its parts right now
                aborted.append(f"{up['Key']} ({up['UploadId']})")
                if not dry_run:
                    client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    return aborted


def _last_activity(client, bucket: str, up: dict) -> float:
    """When an upload last moved: its start or its newest part (a long publish that started
    before the grace period but is still sending parts is in flight, not abandoned)."""
    times = [up["Initiated"].timestamp()]
    for page in client.get_paginator("list_parts").paginate(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"]):
        times.extend(part["LastModified"].timestamp() for part in page.get("Parts", []))
    return max(times)
