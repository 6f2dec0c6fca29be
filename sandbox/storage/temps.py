"""Temporary names in the storage, and sweeping the ones whose writer is gone.

Every temp file or folder written beside a final name (a tarball being packed, a layer
being unpacked or staged, a blob being downloaded, a record being replaced) is named
``.<kind>-<pid>-<start>-<random><suffix>``: the writer's pid and kernel start time
(``sandbox/lifecycle.py``). Renamed into place when complete, it never becomes visible
half-written; but a kill -9 leaves it behind, and nothing else would delete it (a 200 MB
``snapshot()`` killed three times left 217 MiB). ``sweep`` removes exactly the temps whose
writer no longer runs, whatever its age, and never one a live writer holds — called by
``rockroll sandbox gc``, ``rockroll hub gc`` and the first sandbox of every run.

A temp named by an older version (``.tmp-<random>``, ``.<name>.unpack-<random>``, ...)
names no owner: it goes once it is ``LEGACY_GRACE_S`` old.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .. import lifecycle

LEGACY_GRACE_S = 3600
_OWNED = re.compile(r"^\.[a-z]+-(\d+)-(\d+)-")
# temp names of versions before this module: none is a final name of the stores
_LEGACY = re.compile(r"^\.(tmp-|stage-|pull-|base-|.+\.unpack-|.+\.[0-9a-f]{8}$|.+\.\d+\.[0-9a-f]{32}$)"
                     r"|^[0-9a-f]{64}\.tar\.\d+\.tmp$")


def temp_name(kind: str, suffix: str = "") -> str:
    """A fresh temp name (no directory) owned by this process."""
    return f".{kind}-{lifecycle.tag()}-{uuid.uuid4().hex[:12]}{suffix}"


def temp_prefix(kind: str) -> str:
    """A prefix for ``tempfile.mkstemp``/``mkdtemp`` owned by this process."""
    return f".{kind}-{lifecycle.tag()}-"


def temp_dir(parent: Path, kind: str) -> Path:
    """A fresh, empty temp folder in ``parent``, owned by this process."""
    return Path(tempfile.mkdtemp(prefix=temp_prefix(kind), dir=parent))


@dataclass
class Swept:
    removed: list[Path] = field(default_factory=list)
    freed_bytes: int = 0


def is_stale(name: str, mtime) -> bool | None:
    """True: a temp left by a dead writer; False: a temp a live writer may hold; None: not
    a temp name at all. ``mtime()`` is asked only for a name that names no owner."""
    m = _OWNED.match(name)
    if m:
        return not lifecycle.alive(int(m.group(1)), int(m.group(2)))
    if _LEGACY.search(name):
        return time.time() - mtime() >= LEGACY_GRACE_S
    return None


def sweep(dirs, *, dry_run: bool = False) -> Swept:
    """Remove the temps of dead writers directly inside each of ``dirs`` (missing ones are
    skipped); what was (or, ``dry_run``, would be) removed, and its bytes."""
    out = Swept()
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            try:
                if not is_stale(e.name, lambda: e.stat(follow_symlinks=False).st_mtime):
                    continue
                out.freed_bytes += _bytes(e)
            except FileNotFoundError:
                continue  # its writer finished (renamed it) meanwhile
            out.removed.append(Path(e.path))
            if dry_run:
                continue
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass
    return out


def _bytes(entry: os.DirEntry) -> int:
    if not entry.is_dir(follow_symlinks=False):
        return entry.stat(follow_symlinks=False).st_size
    total = 0
    for root, _, files in os.walk(entry.path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
