"""A hub's storage: any fsspec URL (``file://``, ``s3://bucket/prefix``, ``memory://``).

Layout under the URL::

    blobs/sha256/<hex>               layer tarballs (sandbox.storage.layers format), content-addressed
    envs/<name>/<version>.json       manifests, immutable, written last
    envs/<name>/<version>.yanked     yank markers (a small JSON with the reason)

There is no index file: the index is *derived by listing* ``envs/``. A stored index would
be a read-modify-write shared by every publisher, so two publishing at once could drop each
other's versions; a listing cannot disagree with the manifests it lists, and a manifest
is visible only once complete (S3 objects appear whole; on ``file://`` it is written to a
temp name and hard-linked into place), so a listing never shows a half-published version.

Transfers stream in ``CHUNK`` pieces (bounded memory, whatever the blob size), hash the
bytes as they pass (a blob is read once per publish and once per pull; ``s3blobs.py`` for
S3's parallel parts), and show a tqdm bar on stderr when they are big enough to wait for.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path
from typing import Iterator

from rockroll.sandbox.storage.temps import temp_name

from .errors import BlobCorrupted, BlobMissing, HubError, StoreUnavailable
from .manifest import LayerRef

CHUNK = 8 << 20
S3_CONCURRENCY = 8  # parts in flight: CHUNK * (S3_CONCURRENCY + 1) of data per transfer (~110 MiB RSS peak)
PROGRESS_MIN = 16 << 20  # smaller transfers finish before a bar is worth drawing


def default_hub_url() -> str:
    """``$ROCKROLL_HUB``, else ``file://<state home>/hub`` (per user, beside the sandboxes)."""
    env = os.environ.get("ROCKROLL_HUB")
    if env:
        return env
    from rockroll.sandbox.home import state_home

    return f"file://{state_home() / 'hub'}"


def normalize_url(url: str) -> str:
    """A bare path becomes ``file://<absolute path>``; trailing slashes go."""
    if "://" not in url:
        url = f"file://{Path(url).expanduser().resolve()}"
    return url.rstrip("/") if not url.endswith("://") else url


class HubStore:
    """Blobs, manifests and yank markers at one URL. Errors: ``StoreUnavailable`` when the
    storage cannot be reached, ``BlobMissing`` for an absent blob; ``None``/``False``
    results mean "not there"."""

    def __init__(self, url: str | None = None, *, endpoint: str | None = None, **options):
        import fsspec

        self.url = normalize_url(url or default_hub_url())
        self.protocol = self.url.split("://", 1)[0]
        if self.protocol in ("s3", "s3a"):
            try:
                import s3fs  # noqa: F401 - lazy: the optional extra
            except ImportError as e:
                raise HubError("s3:// hubs need s3fs: pip install 'rockroll[s3]'") from e
            endpoint = endpoint or os.environ.get("ROCKROLL_S3_ENDPOINT")
            if endpoint:
                options.setdefault("endpoint_url", endpoint)
            # No instance/listing caches: another process may publish at any time, and a
            # server that went away must be noticed, not answered from memory.
            options.setdefault("skip_instance_cache", True)
            options.setdefault("use_listings_cache", False)
            options.setdefault("max_concurrency", S3_CONCURRENCY)
            options.setdefault("config_kwargs", {"connect_timeout": 5, "read_timeout": 120,
                                                 "retries": {"max_attempts": 3, "mode": "standard"}})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)
        if self.protocol in ("s3", "s3a"):
            self.fs.retries = 2  # s3fs's own retry loop on top of botocore's
        self.local = self.protocol in ("file", "local")
        self.root = self.root.rstrip("/")
        self._blobs = None  # S3Blobs, on the first blob transfer of an s3:// store

    def __repr__(self) -> str:
        return f"HubStore({self.url!r})"

    # ------------------------------------------------------------------- paths
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts]) if self.root else "/".join(parts)

    def blob_path(self, digest: str) -> str:
        return self.path("blobs", "sha256", digest.split(":", 1)[1])

    def manifest_path(self, name: str, version: str) -> str:
        return self.path("envs", name, f"{version}.json")

    def yank_path(self, name: str, version: str) -> str:
        return self.path("envs", name, f"{version}.yanked")

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Anything but 'not found' from the storage means it cannot be used right now."""
        try:
            yield
        except (FileNotFoundError, HubError, KeyboardInterrupt):
            raise
        except Exception as e:
            raise StoreUnavailable(f"{what} on {self.url} failed: {type(e).__name__}: {e}") from e

    # ------------------------------------------------------------------- small objects
    def read(self, path: str) -> bytes | None:
        with self._io(f"reading {path}"):
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                return None

    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` only if it does not exist; True if this call created it.

        ``file://``: temp file, then ``link()`` (atomic, fails if the name exists);
        S3: a conditional PUT (``If-None-Match: *``), so two publishers racing on one
        version cannot both win; other stores: check, then write.
        """
        with self._io(f"writing {path}"):
            if self.local:
                final = Path(self.fs._strip_protocol(path))
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = final.with_name(temp_name("tmp"))
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, final)
                    return True
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink(missing_ok=True)
            if self.protocol in ("s3", "s3a"):
                try:
                    self.fs.pipe_file(path, data, mode="create")
                    return True
                except FileExistsError:
                    return False
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True

    def write(self, path: str, data: bytes) -> None:
        """Overwrite ``path`` (yank markers only: manifests and blobs are never rewritten)."""
        with self._io(f"writing {path}"):
            if self.local:
                final = Path(self.fs._strip_protocol(path))
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = final.with_name(temp_name("tmp"))
                tmp.write_bytes(data)
                os.replace(tmp, final)
            else:
                self.fs.pipe_file(path, data)

    def delete(self, path: str) -> None:
        with self._io(f"deleting {path}"):
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

    def listing(self) -> dict[str, dict[str, bool]]:
        """{env name: {version: yanked}} from one recursive listing of ``envs/``."""
        if self.local:
            with self._io("listing envs"):
                return local_listing(Path(self.fs._strip_protocol(self.path("envs"))))
        with self._io("listing envs"):
            try:
                paths = self.fs.find(self.path("envs"))
            except FileNotFoundError:
                paths = []
        prefix = self.path("envs").lstrip("/") + "/"  # fsspec backends differ on the leading '/'
        rels = [p.lstrip("/")[len(prefix):] for p in paths if p.lstrip("/").startswith(prefix)]
        return _index(r.split("/") for r in rels if r.count("/") == 1)

    # ------------------------------------------------------------------- blobs
    def has_blob(self, layer: LayerRef) -> bool:
        """Present with the right size. (A short blob left by an interrupted copy to a store
        without atomic writes is re-uploaded; contents are verified by every puller.)"""
        with self._io(f"checking blob {layer.digest}"):
            try:
                return self.fs.info(self.blob_path(layer.digest)).get("size") == layer.size
            except FileNotFoundError:
                return False

    def put_blob(self, local: Path, layer: LayerRef) -> None:
        """Upload a layer's blob, checking on the way that its bytes hash to ``layer.digest``:
        if not, ``BlobCorrupted`` and nothing is written (every puller would reject it, and a
        published version is immutable)."""
        path = self.blob_path(layer.digest)
        with self._io(f"uploading blob {layer.digest}"), _progress(layer.size, f"push {layer.digest[7:19]}") as bar:
            if self.protocol in ("s3", "s3a"):
                # Multipart, hashed as it goes and completed only if the hash matches: the
                # object appears only when complete, so a dead upload leaves nothing to see.
                self._s3().put(local, *self._bucket_key(path), layer.digest, bar.update)
                return
            if self.local:
                final = Path(self.fs._strip_protocol(path))
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = final.with_name(temp_name("tmp"))
                try:
                    with open(local, "rb") as src, open(tmp, "wb") as dst:
                        got = _copy(src, dst, bar)
                        dst.flush()
                        os.fsync(dst.fileno())
                    _refuse_unless(got, layer.digest, local)
                    os.replace(tmp, final)
                finally:
                    tmp.unlink(missing_ok=True)
                return
            from rockroll.sandbox.storage.layers import digest_file

            _refuse_unless(digest_file(local), layer.digest, local)  # no atomic write: check first
            with open(local, "rb") as src, self.fs.open(path, "wb") as dst:
                _copy(src, dst, bar)

    def get_blob(self, layer: LayerRef, dest: Path, *, max_bytes: int | None = None) -> str:
        """Download a blob to ``dest``; return the sha256 digest of the bytes written (the
        caller compares it with ``layer.digest`` and renames ``dest`` into place). One larger
        than ``max_bytes`` on the hub is refused before a byte is fetched (``StorageLimitError``
        naming ``max_layer_bytes``)."""
        path = self.blob_path(layer.digest)
        try:
            if max_bytes is not None:
                with self._io(f"sizing blob {layer.digest}"):
                    size = self.fs.size(path)
                if size > max_bytes:
                    from rockroll.sandbox.errors import StorageLimitError  # noqa: PLC0415 - keep import cheap

                    raise StorageLimitError("max_layer_bytes", max_bytes, f"hub blob {layer.digest} is {size} bytes")
            with self._io(f"downloading blob {layer.digest}"), _progress(layer.size, f"pull {layer.digest[7:19]}") as bar:
                if self.protocol in ("s3", "s3a"):
                    # Ranged GETs in parallel, written and hashed in order.
                    return self._s3().get(*self._bucket_key(path), layer.size, dest, bar.update)
                with self.fs.open(path, "rb", block_size=CHUNK) as src, open(dest, "wb") as dst:
                    return _copy(src, dst, bar)
        except FileNotFoundError:
            raise BlobMissing(layer.digest, self.url) from None

    def _s3(self):
        """The blob transfer client of this store (made once: its connections are reused)."""
        if self._blobs is None:
            from .s3blobs import S3Blobs

            self._blobs = S3Blobs(self.fs, chunk=CHUNK, concurrency=S3_CONCURRENCY)
        return self._blobs

    def _bucket_key(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key


def local_listing(envs_dir: Path) -> dict[str, dict[str, bool]]:
    """``listing()`` of a local hub folder with plain ``os`` calls: cheap enough for
    ``import rockroll`` (no fsspec import)."""
    try:
        names = os.listdir(envs_dir)
    except FileNotFoundError:
        return {}
    pairs = []
    for name in names:
        try:
            pairs.extend((name, f) for f in os.listdir(envs_dir / name))
        except (NotADirectoryError, FileNotFoundError):
            continue
    return _index(pairs)


def _index(pairs) -> dict[str, dict[str, bool]]:
    """(env name, file name) pairs of ``envs/`` -> {name: {version: yanked}}."""
    envs: dict[str, dict[str, bool]] = {}
    yanks = set()
    for name, file in pairs:
        if file.startswith("."):
            continue  # temp files of a publish in flight
        if file.endswith(".json"):
            envs.setdefault(name, {})[file[:-5]] = False
        elif file.endswith(".yanked"):
            yanks.add((name, file[:-7]))
    for name, version in yanks:
        if version in envs.get(name, {}):
            envs[name][version] = True
    return envs


def _copy(src, dst, bar) -> str:
    """Copy in ``CHUNK`` pieces; the sha256 digest of what was copied."""
    h = hashlib.sha256()
    while chunk := src.read(CHUNK):
        dst.write(chunk)
        h.update(chunk)
        bar.update(len(chunk))
    return f"sha256:{h.hexdigest()}"


def _refuse_unless(got: str, digest: str, local: Path) -> None:
    if got != digest:
        raise BlobCorrupted(digest, f"the local copy {local} does not match; build again")


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                leave=False, disable=True if total < PROGRESS_MIN else None)


def _callback(bar):
    """An fsspec callback forwarding transfer progress to a tqdm bar."""
    from fsspec.callbacks import Callback

    class _Bar(Callback):
        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            bar.update(inc)

    return _Bar()
