"""Routes of the service's snapshot store: list, upload a tarball, download one.

An upload is bounded while it streams (``max_layer_bytes`` of compressed bytes, the
free-space reserve, what the token's quota has left), then unpacked under the store's
``StorageLimits`` and what the quota still has left; any refusal leaves no temp file,
tarball or layer behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from ..errors import SandboxError, SnapshotError
from ..protocol.wire import DIGEST_PATTERN, SnapshotOut
from ..storage.layers import digest_file, read_meta
from ..storage.snapshots import SnapshotStore
from ..storage.temps import temp_prefix
from .deps import Fleet, Store
from .quota import token_key

router = APIRouter()


@router.get("/snapshots", response_model=list[SnapshotOut])
async def list_snapshots(store: Store) -> list[SnapshotOut]:
    return await asyncio.to_thread(_list_snapshots, store)


@router.post("/snapshots", response_model=SnapshotOut, status_code=201,
             openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                 "schema": {"type": "string", "format": "binary"}}}}})
async def upload_snapshot(request: Request, store: Store) -> SnapshotOut:
    """Import a snapshot tarball (``.tar.zst``); its parents must already be here.
    413 past ``max_layer_bytes``/``max_chain_bytes``, 507 below the free-space reserve or
    past the token's quota (the body's ``limit`` names which). The quota bounds the stream
    and then the unpacking (tarball and layer together), so a refused upload never wrote
    more than the quota had left."""
    quota, key = request.app.state.quota, token_key(request.app.state.token)
    left = quota.left(key)  # used up: 507 before a byte is read
    meter = store.limits.meter(store.tar_root.parent, what="snapshot upload", bound=quota.bound(left))
    announced = request.headers.get("content-length", "")
    if announced.isdigit():  # refused before a byte is read
        meter.check(int(announced))
    store.tar_root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store.tar_root, prefix=temp_prefix("upload"))  # a kill -9 leaves it to gc
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                meter.charge(len(chunk))
                f.write(chunk)
        digest = await asyncio.to_thread(digest_file, tmp)
        existed = store.tarball(digest).exists()
        unpacked = store.layer_root.joinpath(digest[7:]).is_dir()
        await asyncio.to_thread(store.import_tarball, Path(tmp))
        try:  # unpacks and checks the whole chain: a crafted tarball is refused here
            # the layer may unpack to what the quota has left besides its tarball
            # (unbounded by it if the token holds this snapshot already: it costs nothing)
            room = None if digest in quota.held(key) else quota.bound(left - meter.used)
            snap = await asyncio.to_thread(store.load, digest, bound=room)
            quota.charge(key, digest, await asyncio.to_thread(store.stored_bytes, digest))
        except SandboxError:
            if not existed:
                store.tarball(digest).unlink(missing_ok=True)
            if not unpacked:
                await asyncio.to_thread(store.drop_layer, digest)
            raise
    finally:
        Path(tmp).unlink(missing_ok=True)
    request.app.state.fleet.metrics.snapshot_bytes.labels("in").inc(meter.used)
    return SnapshotOut.of(snap)


@router.get("/snapshots/{digest}",
            responses={200: {"content": {"application/zstd": {}}, "description": "the layer tarball"}})
async def download_snapshot(digest: str, store: Store, fleet: Fleet) -> Response:
    path = _known_tarball(store, digest)
    fleet.metrics.snapshot_bytes.labels("out").inc(path.stat().st_size)
    return FileResponse(path, media_type="application/zstd", filename=path.name)


def _known_tarball(store: SnapshotStore, digest: str) -> Path:
    if not re.fullmatch(DIGEST_PATTERN, digest):
        raise SnapshotError(f"not a sha256 digest: {digest!r}")
    path = store.tarball(digest)
    if not path.is_file():
        raise SnapshotError(f"no snapshot {digest} on this service")
    return path


def _list_snapshots(store: SnapshotStore) -> list[SnapshotOut]:
    out = []
    for path in sorted((store.tar_root / "sha256").glob("*.tar.zst")):
        digest = "sha256:" + path.name[:64]
        try:
            meta = read_meta(path)
            size = path.stat().st_size
        except (SandboxError, OSError):
            continue  # a half-written or foreign file: not a snapshot we can offer
        out.append(SnapshotOut(id=path.name[:12], digest=digest, size=size,
                               layers=[*meta.get("parents", ()), digest], image=meta.get("image", "host")))
    return out
