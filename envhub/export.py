"""A hub env (or any sandbox image, at any snapshot) as a Docker image.

For people and tools that want containers: ``export_docker("hub:swe-toolz@0.12.1", "me/toolz:1")``.
The root filesystem is read from *inside* a local sandbox on that image (so layers,
snapshots and whiteouts are already merged by the overlay, exactly as a sandbox sees
them), streamed out as a gzip tar and given to ``docker import``. Only ``rootfs`` envs (a
Debian or Docker base) make complete images; a ``host``-based env would lack the host's
read-only system folders, so it is refused.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from rockroll.sandbox import SandboxSpec, open_sandbox

from .errors import HubError

__all__ = ["export_docker"]

_ARCHIVE = "/var/tmp/.rockroll-rootfs.tar.gz"
_EXCLUDE = ("./proc", "./sys", "./dev", "./tmp", "./run", "." + _ARCHIVE)


def export_docker(image: str, tag: str, *, snapshot: str | None = None, workdir: str = "/workspace",
                  prepare: Sequence[str] = (), timeout: float = 600.0) -> str:
    """``docker import`` the root filesystem of ``image`` (at ``snapshot``) as ``tag``, after
    running the ``prepare`` commands in it; returns the image id."""
    if image == "host" or not (image.startswith("hub:") or image.startswith("debian:") or image.startswith("docker:")):
        raise HubError(f"{image!r}: only images with a whole root filesystem can be exported")
    if shutil.which("docker") is None:
        raise HubError("the docker CLI is not installed")
    spec = SandboxSpec(image=image, workdir=workdir, memory_mb=2048, timeout_s=timeout)
    with tempfile.TemporaryDirectory(prefix="rockroll-export-") as tmp, open_sandbox(spec, snapshot=snapshot) as sb:
        if not sb.exists("/etc/os-release"):
            raise HubError(f"{image!r} has no /etc/os-release: not a whole root filesystem")
        for cmd in prepare:
            r = sb.run(cmd, timeout=timeout)
            if not r.ok:
                raise HubError(f"prepare command failed ({cmd!r}): {r.stderr.strip()[-500:]}")
        excludes = " ".join(f"--exclude={shlex.quote(e)}" for e in _EXCLUDE)
        r = sb.run(f"tar --numeric-owner --one-file-system -C / {excludes} -cf - . | gzip -1 > {_ARCHIVE}",
                   timeout=timeout)
        if r.exit_code not in (0, 1):  # 1: files changed while read (logs); the copy is still whole
            raise HubError(f"packing the root filesystem failed: {r.stderr.strip()[-500:]}")
        archive = Path(tmp) / "rootfs.tar.gz"
        sb.download(_ARCHIVE, archive)
        proc = subprocess.run(["docker", "import", "--change", f"WORKDIR {workdir}", str(archive), tag],
                              capture_output=True, text=True)
        if proc.returncode:
            raise HubError(f"docker import failed: {proc.stderr.strip()}")
        return proc.stdout.strip()
