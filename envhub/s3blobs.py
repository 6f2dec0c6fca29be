"""Blob transfers to and from S3, hashed on the fly: parallel multipart upload, parallel
ranged download, one pooled connection set per store.

Why not s3fs's ``put_file``/``get_file``: they move parts in lock-step batches (the next
batch waits for the slowest part of this one), their download opens a whole-object GET
it then drops, and neither hashes, so a publish read every blob twice (verify, then
upload) and a pull read it twice again (download, then verify). Here parts stream through
a sliding window of ``concurrency`` requests on a thread pool (botocore releases the GIL
on I/O, hashlib on large buffers), and the sha256 is computed in order as the bytes go
by: an upload whose bytes do not hash to the layer's digest is aborted before it is
completed, so nothing a reader could see is ever written; a download returns the digest
of what it wrote, and the caller compares.

Memory per transfer: about ``chunk * (concurrency + 1)`` bytes of data (8 x 8 MiB in flight
plus the part being read: ~110 MiB at the peak of a publish, by ``bench/hub.py``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import os
import threading
import zlib
from pathlib import Path
from typing import Callable

from .errors import BlobCorrupted

MIN_PART = 5 << 20  # S3's smallest part (but the last)


class S3Blobs:
    """Transfers of whole objects in one bucket, sharing one botocore client (thread-safe,
    with a connection pool as wide as the transfer's concurrency: connections are reused
    across parts and blobs)."""

    def __init__(self, fs, *, chunk: int, concurrency: int):
        import botocore.config
        import botocore.session

        self.chunk, self.concurrency = max(chunk, MIN_PART), concurrency
        config = dict(fs.config_kwargs)
        config["max_pool_connections"] = concurrency + 1
        # the same endpoint, credentials and options as the store's s3fs (an explicit
        # key/secret given to HubStore, else botocore's usual chain: env, config files)
        kwargs = {k: v for k, v in fs.client_kwargs.items() if k in ("region_name", "endpoint_url", "verify")}
        if fs.endpoint_url:
            kwargs["endpoint_url"] = fs.endpoint_url
        if fs.key or fs.secret:
            kwargs.update(aws_access_key_id=fs.key, aws_secret_access_key=fs.secret, aws_session_token=fs.token)
        session = botocore.session.get_session()
        kwargs.setdefault("region_name", session.get_config_variable("region") or "us-east-1")
        self.client = session.create_client("s3", config=botocore.config.Config(**config), **kwargs)
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="rockroll-s3")

    # ------------------------------------------------------------------ upload
    def put(self, local: Path, bucket: str, key: str, digest: str, progress: Callable[[int], None]) -> None:
        """Upload ``local`` as ``key``, or raise ``BlobCorrupted`` (nothing written) if its
        bytes do not hash to ``digest``."""
        size = os.path.getsize(local)
        with open(local, "rb") as f:
            if size < 2 * self.chunk:  # one request: hash first, then send
                data = f.read()
                _check(hashlib.sha256(data), digest, local)
                self.client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumCRC32=_crc32(data))
                progress(size)
                return
            upload = self.client.create_multipart_upload(Bucket=bucket, Key=key,
                                                         ChecksumAlgorithm="CRC32")["UploadId"]
            h, parts, crcs = hashlib.sha256(), [], []
            try:
                window = threading.BoundedSemaphore(self.concurrency)
                number = 0
                while data := f.read(self.chunk):
                    h.update(data)
                    number += 1
                    window.acquire()
                    crc = _crc32(data)  # S3 checks each part against it on arrival
                    fut = self._pool.submit(self._part, bucket, key, upload, number, data, crc, progress)
                    fut.add_done_callback(lambda _: window.release())
                    parts.append(fut)
                    crcs.append(crc)
                _check(h, digest, local)  # before completing: a bad blob never becomes visible
                etags = [{"PartNumber": i, "ETag": p.result(), "ChecksumCRC32": crc}
                         for i, (p, crc) in enumerate(zip(parts, crcs), 1)]
                self.client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload,
                                                      MultipartUpload={"Parts": etags})
            except BaseException:
                for p in parts:
                    p.cancel()
                concurrent.futures.wait(parts)
                try:
                    self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
                except Exception:  # noqa: BLE001 - the upload's own error is the one to report
                    pass
                raise

    def _part(self, bucket, key, upload, number, data, crc, progress) -> str:
        etag = self.client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                                       Body=data, ChecksumCRC32=crc)["ETag"]
        progress(len(data))
        return etag

    # ------------------------------------------------------------------ download
    def get(self, bucket: str, key: str, size: int, dest: Path, progress: Callable[[int], None]) -> str:
        """Download ``key`` (expected ``size`` bytes) to ``dest``; return the sha256 digest of
        the bytes written. ``FileNotFoundError`` if there is no such object."""
        h = hashlib.sha256()
        with open(dest, "wb") as out:
            if size < 2 * self.chunk:
                data = self._range(bucket, key, None)
                h.update(data)
                out.write(data)
                progress(len(data))
                return _digest(h)
            ranges = [(start, min(start + self.chunk, size) - 1) for start in range(0, size, self.chunk)]
            pending: list[concurrent.futures.Future] = []
            try:
                for start, end in ranges:
                    pending.append(self._pool.submit(self._range, bucket, key, (start, end)))
                    if len(pending) >= self.concurrency:  # a sliding window, written in order
                        _write(pending.pop(0).result(), out, h, progress)
                while pending:
                    _write(pending.pop(0).result(), out, h, progress)
            finally:
                for p in pending:
                    p.cancel()
            # A shorter object leaves a short file (its last ranges come back empty); the
            # caller's digest check refuses it, as it refuses any other damage.
            return _digest(h)

    def _range(self, bucket: str, key: str, span: tuple[int, int] | None) -> bytes:
        kwargs = {"Range": f"bytes={span[0]}-{span[1]}"} if span else {}
        try:
            resp = self.client.get_object(Bucket=bucket, Key=key, **kwargs)
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(key) from None
        except self.client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # the object is shorter than the manifest says: truncated
            raise
        with resp["Body"] as body:
            return body.read()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _write(data: bytes, out, h, progress) -> None:
    out.write(data)
    h.update(data)
    progress(len(data))


def _crc32(data: bytes) -> str:
    """S3's CRC32 checksum header value. Given, botocore sends it as is; left to botocore, it
    streams each part through its own chunked-encoding wrapper to compute it, in Python."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _digest(h) -> str:
    return f"sha256:{h.hexdigest()}"


def _check(h, digest: str, local: Path) -> None:
    if _digest(h) != digest:
        raise BlobCorrupted(digest, f"the local copy {local} does not match; build again")
