"""Base layers for env packages that do not sit on the host image: a Debian rootfs
(debootstrap, via ``sandbox.deployment.images``) or a Docker image's filesystem (``docker export``),
each packed once into a reproducible layer and remembered by its source.

They are also image schemes of the local backend (``image="debian:bookworm"``,
``image="docker:python:3.12-slim"``), which is how a build sandbox runs on them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from rockroll.sandbox.deployment.rootfs import write_sandbox_etc
from rockroll.sandbox.storage.layers import pack_layer
from rockroll.sandbox.storage.temps import temp_dir

from .cache import LocalCache
from .errors import BuildError
from .manifest import LayerRef


def _remembered(cache: LocalCache, key: str) -> LayerRef | None:
    try:
        data = json.loads((cache.root / "bases" / f"{key}.json").read_text())
        layer = LayerRef(data["digest"], data["size"])
    except (OSError, ValueError, KeyError):
        return None
    return layer if cache.layers.tarball(layer.digest).is_file() else None


def _remember(cache: LocalCache, key: str, layer: LayerRef) -> None:
    path = cache.root / "bases" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"digest": layer.digest, "size": layer.size}))


def _pack_rootfs(cache: LocalCache, staged: Path) -> LayerRef:
    # /dev holds device nodes on a debootstrapped tree; the sandbox mounts its own /dev,
    # and a layer may not carry devices, so the base layer has an empty /dev.
    dev = staged / "dev"
    if dev.is_dir():
        shutil.rmtree(dev)
        dev.mkdir(mode=0o755)
    (staged / ".dockerenv").unlink(missing_ok=True)
    # A base layer is published and sits under sandboxes without network: nothing of the
    # build host's name resolution (debootstrap copies resolv.conf and hostname) goes in.
    if (staged / "etc").is_dir():
        write_sandbox_etc(staged / "etc")
    info = pack_layer(staged, cache.layers.tar_root, reproducible=True)
    cache.mark_owned(info.digest)
    return LayerRef(info.digest, info.size)


def debian_base_layer(suite: str, cache: LocalCache) -> LayerRef:
    """The base layer of a minimal Debian ``suite``; the debootstrap rootfs is the one
    ``sandbox.deployment.images`` caches (built on first use: minutes, needs the Debian mirror)."""
    from rockroll.sandbox.deployment import images

    key = f"debian-{suite}"
    if (layer := _remembered(cache, key)) is not None:
        return layer
    tag = images.docker_image_tag(suite, ())
    rootfs = images.rootfs_cache_dir(tag)
    try:
        with images._exclusive(rootfs.with_name(rootfs.name + ".lock")):
            if not rootfs.is_dir():
                images.build_debian_rootfs(rootfs, suite)
    except images.ImageBuildError as e:
        raise BuildError(f"base debian:{suite}: {e}") from e
    cache.layers.layer_root.mkdir(parents=True, exist_ok=True)
    stage = temp_dir(cache.layers.layer_root.parent, "base")
    try:
        # A hardlinked copy (instant, no extra space) so /dev can be emptied without
        # touching the cached rootfs.
        subprocess.run(["cp", "-al", f"{rootfs}/.", str(stage)], check=True, capture_output=True)
        layer = _pack_rootfs(cache, stage)
    except subprocess.CalledProcessError as e:
        raise BuildError(f"base debian:{suite}: copying {rootfs} failed: {e.stderr.decode(errors='replace')}") from e
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    _remember(cache, key, layer)
    return layer


def docker_base_layer(image: str, cache: LocalCache) -> LayerRef:
    """The filesystem of a local Docker image (``docker create`` + ``docker export``)."""
    if shutil.which("docker") is None:
        raise BuildError(f"base docker:{image}: the docker CLI is not installed")
    inspect = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True)
    if inspect.returncode:
        raise BuildError(f"base docker:{image}: not available to the local docker engine "
                         f"({inspect.stderr.strip()}); docker pull it first")
    key = "docker-" + re.sub(r"[^A-Za-z0-9]", "", inspect.stdout.strip())[-64:]
    if (layer := _remembered(cache, key)) is not None:
        return layer
    created = subprocess.run(["docker", "create", image, "/bin/sh"], capture_output=True, text=True)
    if created.returncode:
        raise BuildError(f"base docker:{image}: docker create failed: {created.stderr.strip()}")
    cid = created.stdout.strip()
    cache.layers.layer_root.mkdir(parents=True, exist_ok=True)
    stage = temp_dir(cache.layers.layer_root.parent, "base")
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The image is the publisher's own choice on their own engine; system tar (as root,
        # numeric owners) restores it faithfully, devices excluded.
        untar = subprocess.run(["tar", "-x", "-C", str(stage), "--numeric-owner", "--exclude=dev/*"],
                               stdin=export.stdout, capture_output=True)
        export.stdout.close()
        err = export.stderr.read().decode(errors="replace")
        if export.wait() or untar.returncode:
            raise BuildError(f"base docker:{image}: export failed: {err}{untar.stderr.decode(errors='replace')}")
        layer = _pack_rootfs(cache, stage)
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
        shutil.rmtree(stage, ignore_errors=True)
    _remember(cache, key, layer)
    return layer
