"""Envs on a rootfs base instead of the host image: debian (debootstrap) and docker.

The debian rootfs is the one ``sandbox.deployment.images`` caches; when the host already has one
(``/var/lib/rockroll/images``), the test's state home gets a hardlinked copy of it instead
of running debootstrap again (minutes). The module builds it once."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rockroll.envhub import HubStore, build, publish, pull
from rockroll.sandbox import SandboxSpec, open_sandbox
from rockroll.sandbox.deployment import images
from rockroll.sandbox.deployment.rootfs import SANDBOX_ETC

SHARED_IMAGES = Path("/var/lib/rockroll/images")


def _seed_rootfs(suite: str = "bookworm") -> None:
    tag = images.docker_image_tag(suite, ())
    dest = images.rootfs_cache_dir(tag)
    shared = SHARED_IMAGES / dest.name
    if dest.is_dir() or not shared.is_dir() or shared == dest:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(shared), str(dest)], check=True)


def _package(tmp: Path, base: str, name: str) -> Path:
    (tmp / "data").mkdir(parents=True)
    (tmp / "data" / "hello.txt").write_text("hello from the env\n")
    (tmp / "rockenv.toml").write_text(f'''name = "{name}"
version = "0.1.0"
base = "{base}"
setup = ["cat /etc/debian_version > /opt/debver", "test ! -e /usr/bin/python3"]
[files]
"data" = "/opt/data"
[env]
entry_point = "rockroll.gem.swe:SWEEnv"  # importable: build checks it (never made here)
''')
    return tmp


@pytest.fixture(scope="module")
def debian_env(tmp_path_factory):
    if shutil.which("debootstrap") is None and not SHARED_IMAGES.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: debootstrap is missing (make test installs it)")
        pytest.skip("neither debootstrap nor a cached Debian rootfs on this host")
    _seed_rootfs()
    cached = images.rootfs_cache_dir(images.docker_image_tag("bookworm", ())) / "etc"
    before = {name: (cached / name).read_bytes() for name in SANDBOX_ETC if (cached / name).is_file()}
    folder = _package(tmp_path_factory.mktemp("deb"), "debian:bookworm", "deb")
    manifest = build(folder).manifest
    # the base layer's etc is rewritten on a hardlinked copy, never through it
    assert {name: (cached / name).read_bytes() for name in before} == before
    hub = f"file://{tmp_path_factory.mktemp('hub')}"
    publish(manifest, HubStore(hub))
    return manifest, hub


def test_debian_base_is_a_whole_rootfs(debian_env):
    manifest, hub = debian_env
    assert (manifest.system, manifest.base, len(manifest.layers)) == ("rootfs", "debian:bookworm", 2)
    env = pull("deb@0.1.0", hub=hub)
    with open_sandbox(SandboxSpec(image="hub:deb@0.1.0", memory_mb=256)) as sb:
        out = sb.run("cat /opt/data/hello.txt /opt/debver; test -e /usr/bin/python3 || echo no-host-python")
        assert out.stdout.startswith("hello from the env\n12.") and "no-host-python" in out.stdout, out
    assert env.layer_dirs[-1].joinpath("etc/debian_version").is_file()  # the base layer, bottom


def test_debian_base_holds_no_host_name_resolution(debian_env):
    """debootstrap copies the build host's resolv.conf and hostname into its tree: the base
    layer (published, under no-network sandboxes) holds the sandbox's own instead. (With
    ``network=True`` a sandbox's resolver is its gateway, on any image: ``tests/sandbox/test_network.py``.)"""
    manifest, hub = debian_env
    env = pull("deb@0.1.0", hub=hub)
    base_etc = env.layer_dirs[-1] / "etc"
    assert {name: (base_etc / name).is_file() and (base_etc / name).read_text() for name in SANDBOX_ETC} == SANDBOX_ETC
    with open_sandbox(SandboxSpec(image="hub:deb@0.1.0", memory_mb=256)) as sb:
        assert {name: sb.read_file(f"/etc/{name}").decode() for name in SANDBOX_ETC} == SANDBOX_ETC


def test_debian_base_layer_is_reproducible(debian_env, tmp_path):
    from rockroll.envhub.cache import LocalCache

    manifest, _ = debian_env
    (LocalCache().root / "bases" / "debian-bookworm.json").unlink()  # pack the rootfs again
    again = build(_package(tmp_path, "debian:bookworm", "deb"), rebuild=True).manifest
    assert again.layers == manifest.layers


def test_hub_base_stacks_on_the_parent(debian_env, tmp_path):
    manifest, hub = debian_env
    folder = _package(tmp_path, "hub:deb@0", "child")
    (folder / "rockenv.toml").write_text((folder / "rockenv.toml").read_text().replace(
        'setup = [', 'setup = ["cat /opt/debver > /opt/from-parent", '))
    child = build(folder, hub=hub).manifest
    assert child.base == "hub:deb@0.1.0" and child.layers[:2] == manifest.layers and len(child.layers) == 3
    publish(child, HubStore(hub))
    pull("child@0.1.0", hub=hub)
    with open_sandbox(SandboxSpec(image="hub:child@0.1.0", memory_mb=256)) as sb:
        assert sb.run("cat /opt/from-parent").stdout.startswith("12.")


def test_docker_base(tmp_path):
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: no docker engine (make test starts one)")
        pytest.skip("no docker engine")
    tag = images.ensure_docker_image()  # built once and cached
    manifest = build(_package(tmp_path, f"docker:{tag}", "dock")).manifest
    assert manifest.system == "rootfs" and len(manifest.layers) == 2
    hub = f"file://{tmp_path / 'hub'}"
    publish(manifest, HubStore(hub))
    pull("dock@0.1.0", hub=hub)
    with open_sandbox(SandboxSpec(image="hub:dock@0.1.0", memory_mb=256)) as sb:
        assert sb.run("cat /opt/data/hello.txt").stdout == "hello from the env\n"
