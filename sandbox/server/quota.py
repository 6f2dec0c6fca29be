"""The service's per-token storage quota: how many bytes of snapshots a token may hold.

Each snapshot a token uploads or takes of a sandbox (``POST /v1/sandboxes/{id}/snapshots``)
is charged once to it, for what it takes on the host: the tarball plus its unpacked layer;
a snapshot the token holds already costs nothing again. Uploads are bounded while they
stream and unpack by what the quota has left; a snapshot of a sandbox is refused before it
starts when nothing is left, and removed again (if it is new) when it does not fit.
Charges live in ``<home>/service-quota/<key>.json`` (``{digest: bytes}``), so a restart
does not reset them; ``key`` is a short hash of the token, which is what ``/metrics``
shows (never the token).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from ..errors import StorageFullError
from ..storage.limits import Bound

GiB = 1 << 30
DEFAULT_QUOTA = 16 * GiB


def token_key(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()[:12]


class TokenQuota:
    def __init__(self, root: Path, quota: int = DEFAULT_QUOTA):
        self.root, self.quota = root, quota
        self._lock = threading.Lock()

    def held(self, key: str) -> dict[str, int]:
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def used(self, key: str) -> int:
        return sum(self.held(key).values())

    def left(self, key: str) -> int:
        """Bytes ``key`` may still store; ``StorageFullError`` if none."""
        left = self.quota - self.used(key)
        if left <= 0:
            raise StorageFullError("token_storage_quota", self.quota,
                                   f"this token holds {self.used(key)} bytes of snapshots")
        return left

    def bound(self, left: int) -> Bound:
        """``left`` bytes of this quota as a ``Meter`` bound: writing past it is refused
        with ``StorageFullError`` (507) naming ``token_storage_quota``."""
        return Bound(left, "token_storage_quota", self.quota, StorageFullError)

    def charge(self, key: str, digest: str, nbytes: int) -> None:
        """Record that ``key`` holds ``digest`` (``nbytes`` on disk); a digest it already
        holds costs nothing again. ``StorageFullError`` (nothing recorded) past the quota."""
        with self._lock:
            held = self.held(key)
            if digest in held:
                return
            if sum(held.values()) + nbytes > self.quota:
                raise StorageFullError("token_storage_quota", self.quota,
                                       f"snapshot {digest} ({nbytes} bytes on disk) does not fit: this "
                                       f"token holds {sum(held.values())} bytes")
            held[digest] = nbytes
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(held, sort_keys=True))
            os.replace(tmp, self.root / f"{key}.json")

    def usage(self) -> dict[str, int]:
        """Bytes held, by token key (for ``/metrics``)."""
        if not self.root.is_dir():
            return {}
        return {p.stem: sum(self.held(p.stem).values()) for p in sorted(self.root.glob("*.json"))}
