"""The envhub's image and snapshot schemes for the local sandbox backend:

- ``image="hub:<name>@<ver>"``: pulled if needed, its layers mounted as lower dirs (top
  first) over the host image (``system="host"``) or alone (a debian/docker rootfs base);
- ``image="debian:<suite>"`` / ``image="docker:<image>"``: a packed base layer alone;
- ``snapshot="hub:<name>@<ver>#<snap>"``: that env's named snapshot, on ``image="hub:<name>@<ver>"``.

A bare ``hub:`` ref means the env last pulled under that ref in this process (so an env
made from a non-default hub keeps working), else the default hub.
"""

from __future__ import annotations

from pathlib import Path

from rockroll.sandbox.errors import SpecError
from rockroll.sandbox.deployment.rootfs import RootfsPlan, host_base_layer, host_binds, register_image_resolver
from rockroll.sandbox.storage.snapshots import SnapshotStore, register_snapshot_resolver
from rockroll.sandbox.spec import Snapshot

from .cache import LocalCache
from .errors import EnvNotFound
from .pull import PulledEnv, memoised, pull
from .version import EnvRef


def _env(ref: str, home: Path) -> PulledEnv:
    parsed = EnvRef.parse(ref)
    return memoised(parsed, home) or pull(parsed, cache=LocalCache(home))


def hub_image_plan(ref: str, home: Path) -> RootfsPlan:
    if "#" in ref:
        raise SpecError("image", f"hub:{ref}: an image names no snapshot; pass snapshot='hub:{ref}'")
    env = _env(ref, home)
    if env.manifest.system == "host":
        return RootfsPlan(lowers=(*map(str, env.layer_dirs), str(host_base_layer(home))), binds=host_binds())
    return RootfsPlan(lowers=tuple(map(str, env.layer_dirs)), binds=())


def hub_snapshot(ref: str, store: SnapshotStore) -> Snapshot:
    body, sep, name = ref.partition("#")
    if not sep or not name:
        raise EnvNotFound(f"hub:{ref}: a snapshot ref is hub:<name>@<version>#<snapshot>")
    env = _env(body, store.tar_root.parent)
    layers = env.manifest.snapshots.get(name)
    if layers is None:
        raise EnvNotFound(f"{env.manifest.ref} has no snapshot {name!r} "
                          f"(it has: {', '.join(sorted(env.manifest.snapshots)) or 'none'})")
    top = layers[-1]
    # image is the ref as written, so it matches SandboxSpec(image="hub:<body>").
    return Snapshot(id=top.digest[7:19], digest=top.digest, size=top.size,
                    layers=tuple(l.digest for l in layers), image=f"hub:{body}",
                    path=store.tarball(top.digest))


def _base_plan(kind: str):
    def plan(ref: str, home: Path) -> RootfsPlan:
        from .bases import debian_base_layer, docker_base_layer

        cache = LocalCache(home)
        layer = (debian_base_layer if kind == "debian" else docker_base_layer)(ref, cache)
        return RootfsPlan(lowers=(str(cache.layers.layer_dir(layer.digest)),), binds=())
    return plan


def install() -> None:
    """Register the schemes (idempotent: re-registering replaces)."""
    register_image_resolver("hub", hub_image_plan, form="hub:<name>@<version>")
    register_image_resolver("debian", _base_plan("debian"), form="debian:<suite>")
    register_image_resolver("docker", _base_plan("docker"), form="docker:<image>")
    register_snapshot_resolver("hub", hub_snapshot, form="hub:<name>@<version>#<snapshot>")
