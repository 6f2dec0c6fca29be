"""Bounds on what the storage plane writes to the host.

A layer, an uploaded snapshot or a pulled hub blob comes from someone the host does not
trust (a sandbox's agent, an API client, whoever can write to a hub). Compressed, a few KiB
can expand to terabytes, so sizes are counted while bytes are written, never taken from a
header: a ``Meter`` is charged before each write and refuses the write that would pass the
limit, so at most the limit's bytes ever land; the caller then removes the partial output.

Settings (``StorageLimits``), each also an environment variable so every process of a host
(the service, ``rockroll hub pull``, a trainer) applies the same ones:

- ``max_layer_bytes`` (``ROCKROLL_MAX_LAYER_BYTES``, 4 GiB): unpacked bytes of one layer;
  also bounds a compressed upload or hub blob, and a file or folder a sandbox hands the host.
- ``max_chain_bytes`` (``ROCKROLL_MAX_CHAIN_BYTES``, 16 GiB): unpacked bytes of a snapshot
  chain (or a hub env's layers) together.
- ``min_free_bytes`` (``ROCKROLL_MIN_FREE_BYTES``, 2 GiB): free space the disk keeps; a
  write that would go below it is refused (0: no reserve).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import SpecError, StorageFullError, StorageLimitError

GiB = 1 << 30
MEMBER_BYTES = 512  # what one archive member costs besides its data (an inode, a tar header)
_FREE_CHECK = 8 << 20  # statvfs at most once per this many bytes charged
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str | int, field: str) -> int:
    """``"4G"``, ``"512M"``, ``"1073741824"`` -> bytes (binary units; a trailing ``B``/``iB``
    is allowed). Raises ``SpecError`` naming ``field``."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
        if not m:
            raise SpecError(field, f"not a size: {text!r} (use bytes or K/M/G/T, e.g. 4G)")
        value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 0:
        raise SpecError(field, f"must be >= 0, not {value}")
    return value


@dataclass(frozen=True)
class StorageLimits:
    """How much one layer, one chain may unpack to, and the free space the disk keeps."""

    max_layer_bytes: int = 4 * GiB
    max_chain_bytes: int = 16 * GiB
    min_free_bytes: int = 2 * GiB

    def __post_init__(self) -> None:
        for f in fields(self):
            value = parse_bytes(getattr(self, f.name), f.name)
            if value == 0 and f.name != "min_free_bytes":
                raise SpecError(f.name, "must be > 0 (nothing could be stored)")
            object.__setattr__(self, f.name, value)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "StorageLimits":
        """The defaults, overridden by ``ROCKROLL_<FIELD>`` variables (``ROCKROLL_MAX_LAYER_BYTES=8G``)."""
        environ = os.environ if environ is None else environ
        given = {f.name: environ[env_name(f.name)] for f in fields(cls) if environ.get(env_name(f.name))}
        return cls(**given)

    def meter(self, where: Path, *, room: int | None = None, what: str = "layer",
              bound: "Bound | None" = None) -> "Meter":
        """A meter for one layer written under ``where``: bounded by ``max_layer_bytes``,
        by ``room`` (what the chain has left) and by ``bound`` (the caller's own, such as
        what a token's quota has left), whichever is smallest."""
        bounds = [Bound(self.max_layer_bytes, "max_layer_bytes", self.max_layer_bytes)]
        if room is not None:
            bounds.append(Bound(room, "max_chain_bytes", self.max_chain_bytes))
        if bound is not None:
            bounds.append(bound)
        # bytes only grow, so the smallest bound is the one that refuses (ties: the first named)
        return Meter(min(bounds, key=lambda b: b.left), where, self.min_free_bytes, what)

    def check_free(self, where: Path, incoming: int = 0, what: str = "data") -> None:
        check_free(where, self.min_free_bytes, incoming, what)


def free_bytes(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


def check_free(where: Path, reserve: int, incoming: int = 0, what: str = "data", free: int | None = None) -> None:
    """Refuse (``StorageFullError``) when writing ``incoming`` bytes under ``where`` would
    leave less than ``reserve`` bytes free (``free``: what is free now, if known)."""
    if not reserve:
        return
    free = free_bytes(where) if free is None else free
    if free - incoming < reserve:
        raise StorageFullError("min_free_bytes", reserve,
                               f"refused {what}: {free} bytes free on {where}, {incoming} more would "
                               "go below the free-space reserve")


def env_name(field: str) -> str:
    return f"ROCKROLL_{field.upper()}"


@dataclass(frozen=True)
class Bound:
    """One ceiling of a ``Meter``: at most ``left`` bytes, refused with ``error`` naming the
    setting ``name`` (whose value is ``value``): ``StorageLimitError`` (413) for a size
    limit, ``StorageFullError`` (507) for a quota that is used up."""

    left: int
    name: str
    value: int
    error: type[StorageLimitError] = StorageLimitError

    def __post_init__(self) -> None:
        object.__setattr__(self, "left", max(self.left, 0))


class Meter:
    """Counts bytes written against a ``Bound``; ``charge(n)`` before writing ``n`` bytes
    raises the bound's error if they would pass it (so nothing beyond it is written), and
    ``StorageFullError`` if the disk would go below its reserve: the free space is read
    every few MiB and what was charged since is taken off it, so our own writes never
    cross the reserve."""

    def __init__(self, bound: Bound, where: Path, min_free: int, what: str):
        self.bound, self.limit, self.where, self.what = bound, bound.left, where, what
        self.min_free = min_free
        self.used = 0
        self._free: int | None = None  # free bytes at the last look
        self._since = 0  # bytes charged since then

    def check(self, n: int) -> None:
        """Refuse ``n`` more bytes if they would pass the limit (without charging them)."""
        if self.used + n > self.limit:
            b = self.bound
            raise b.error(b.name, b.value, f"{self.what} is larger than allowed: {self.used + n} bytes "
                                           f"would pass the {self.limit} left")

    def charge(self, n: int) -> None:
        self.check(n)
        if self.min_free:
            if self._free is None or self._since + n >= _FREE_CHECK:
                self._free, self._since = free_bytes(self.where), 0
            check_free(self.where, self.min_free, self._since + n, self.what, free=self._free)
            self._since += n
        self.used += n
