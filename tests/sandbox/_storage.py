"""Crafted layers and the measures the storage-plane tests read after an attack: bytes a
thread wrote, leftovers, and whether another local user can reach a path."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import zstandard

OTHER_UID = 54321  # no such user: the test makes it up, as an attacker's account would be


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, read in pieces: a bomb's content never sits in memory whole."""

    def __init__(self, n: int):
        self.left = n

    def readinto(self, b) -> int:
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k

    def readable(self) -> bool:
        return True


def crafted_layer(path: Path, files: dict[str, tuple[int, int | bytes]], *, dirs: dict[str, int] | None = None,
                  meta: dict | None = None) -> Path:
    """A layer tarball at ``path``: ``files`` maps a rootfs name to (mode, content or a count
    of zero bytes); ``dirs`` maps directory names to modes. Returns ``path``."""
    with open(path, "wb") as raw, zstandard.ZstdCompressor(write_checksum=True).stream_writer(raw) as zw:
        with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            if meta is not None:
                data = json.dumps(meta).encode()
                info = tarfile.TarInfo("rockroll.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            root = tarfile.TarInfo("rootfs")
            root.type, root.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(root)
            for name, mode in (dirs or {}).items():
                info = tarfile.TarInfo(f"rootfs/{name}")
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
            for name, (mode, content) in files.items():
                info = tarfile.TarInfo(f"rootfs/{name}")
                info.mode = mode
                if isinstance(content, int):
                    info.size = content
                    tar.addfile(info, io.BufferedReader(_Zeros(content)))
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
    return path


def thread_wchar(io_file: str = "/proc/thread-self/io") -> int:
    """Bytes this thread (or, given ``/proc/<pid>/io``, that process) has passed to
    write(2) and friends so far."""
    for line in Path(io_file).read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError(f"no wchar in {io_file}")


def leftovers(root: Path) -> list[str]:
    """Temp files and half-unpacked dirs anywhere under ``root``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*")
                  if any(tag in p.name for tag in (".unpack-", ".upload-", ".pull-", ".tmp", ".stage-")))


def as_other_user(*argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``OTHER_UID``, a local user of the host with no relation to rockroll."""
    return subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "--", *argv],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)


def other_user_reaches(path: Path) -> dict[str, bool]:
    """What ``OTHER_UID`` can do with ``path``: list it (dir), read it, run it."""
    return {
        "stat": as_other_user("stat", "--", str(path)).returncode == 0,
        "read": as_other_user("sh", "-c", 'if [ -d "$1" ]; then ls -- "$1"; else cat -- "$1"; fi', "-",
                              str(path)).returncode == 0,
        # through a shell: setpriv itself may exec a path its new uid could not reach
        "run": as_other_user("sh", "-c", '"$1"', "-", str(path)).returncode == 0 if path.is_file() else False,
    }
