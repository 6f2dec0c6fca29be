"""A hub is object storage its writers control (issue #23): layers crafted there and pulled
from moto's S3 server on 127.0.0.1 must neither plant a setuid file on the pulling host
nor fill its disk; and a built env package carries no setuid bits at all."""

from __future__ import annotations

import stat
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from rockroll.envhub import EnvManifest, HubStore, build, pull
from rockroll.envhub.manifest import LayerRef
from rockroll.sandbox import StorageLimitError
from rockroll.sandbox.storage.layers import digest_file
from rockroll.sandbox.storage.limits import StorageLimits

from _pkgs import make_pkg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
from _storage import crafted_layer, leftovers, thread_wchar  # noqa: E402

MiB = 1 << 20
BUCKET = "rockroll-hub"


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    return build(make_pkg(tmp_path_factory.mktemp("pkg") / "counter")).manifest


def plant(moto_s3, hub: str, counter: EnvManifest, name: str, layers: list[Path]) -> None:
    """What a hub writer can do: put blobs and a manifest naming them, no build involved."""
    store = HubStore(hub)
    refs = []
    for path in layers:
        digest = digest_file(path)
        moto_s3.client().put_object(Bucket=BUCKET, Key=store.blob_path(digest).split("/", 1)[1],
                                    Body=path.read_bytes())
        refs.append(LayerRef(digest, path.stat().st_size))
    manifest = EnvManifest(**{**counter.__dict__, "name": name, "version": "1.0.0", "layers": tuple(refs),
                              "snapshots": {}, "private": None})
    assert store.create(store.manifest_path(name, "1.0.0"), manifest.to_json())


def test_a_setuid_file_planted_in_a_hub_lands_without_the_bit(moto_s3, s3_hub, counter, cache, tmp_path):
    plant(moto_s3, s3_hub, counter, "planted",
          [crafted_layer(tmp_path / "suid.tar.zst", {"su": (0o4755, b"#!/bin/sh\n"), "sg": (0o2755, b"x")})])
    env = pull("planted@1.0.0", hub=s3_hub, cache=cache)
    modes = {n: stat.S_IMODE((env.layer_dirs[0] / n).stat().st_mode) for n in ("su", "sg")}
    assert modes == {"su": 0o755, "sg": 0o755}
    assert stat.S_IMODE(cache.home.stat().st_mode) == 0o700


def test_a_bomb_in_a_hub_stops_at_the_layer_limit(moto_s3, s3_hub, counter, cache, tmp_path):
    limit = 2 * MiB
    cache.layers.limits = StorageLimits(max_layer_bytes=limit, min_free_bytes=0)
    bomb = crafted_layer(tmp_path / "bomb.tar.zst", {"zeros": (0o644, 10 * limit)})
    plant(moto_s3, s3_hub, counter, "bomb", [bomb])
    before = thread_wchar()
    with pytest.raises(StorageLimitError) as info:
        pull("bomb@1.0.0", hub=s3_hub, cache=cache)
    assert info.value.limit == "max_layer_bytes" and "max_layer_bytes" in str(info.value)
    assert thread_wchar() - before <= limit + bomb.stat().st_size  # the unpacking, and the blob itself
    assert not cache.has_layer(digest_file(bomb))
    assert leftovers(cache.home) == []


def test_a_blob_larger_than_a_layer_may_be_is_not_downloaded(moto_s3, s3_hub, counter, cache, tmp_path):
    cache.layers.limits = StorageLimits(max_layer_bytes=MiB, min_free_bytes=0)
    big = tmp_path / "big.tar.zst"
    big.write_bytes(bytes(3 * MiB))  # what it holds does not matter: it is never fetched
    plant(moto_s3, s3_hub, counter, "huge", [big])
    with pytest.raises(StorageLimitError, match="max_layer_bytes"):
        pull("huge@1.0.0", hub=s3_hub, cache=cache)
    assert not cache.layers.tarball(digest_file(big)).exists()
    assert leftovers(cache.home) == []
    # a manifest that understates the size is caught by the size on the hub, also before fetching
    store = HubStore(s3_hub)
    lying = EnvManifest(**{**counter.__dict__, "name": "liar", "version": "1.0.0", "snapshots": {}, "private": None,
                           "layers": (LayerRef(digest_file(big), 10),)})
    store.create(store.manifest_path("liar", "1.0.0"), lying.to_json())
    before = thread_wchar()
    with pytest.raises(StorageLimitError, match="max_layer_bytes"):
        pull("liar@1.0.0", hub=s3_hub, cache=cache)
    assert thread_wchar() - before < MiB
    assert not cache.layers.tarball(digest_file(big)).exists() and leftovers(cache.home) == []


def test_an_env_s_layers_are_bounded_together(moto_s3, s3_hub, counter, cache, tmp_path):
    cache.layers.limits = StorageLimits(max_layer_bytes=2 * MiB, max_chain_bytes=3 * MiB, min_free_bytes=0)
    layers = [crafted_layer(tmp_path / f"l{i}.tar.zst", {f"f{i}": (0o644, int(1.8 * MiB))}) for i in range(2)]
    plant(moto_s3, s3_hub, counter, "tall", layers)
    with pytest.raises(StorageLimitError) as info:
        pull("tall@1.0.0", hub=s3_hub, cache=cache)
    assert info.value.limit == "max_chain_bytes"
    assert not cache.has_layer(digest_file(layers[1])) and leftovers(cache.home) == []


def test_a_built_package_carries_no_setuid_bits(tmp_path):
    folder = make_pkg(tmp_path / "suidpkg", name="suidpkg", snapshots=False)
    toml = (folder / "rockenv.toml").read_text()
    toml = toml.replace('setup = [', 'setup = ["cp /bin/true /opt/counter/su && chmod 6755 /opt/counter/su", ', 1)
    (folder / "rockenv.toml").write_text(toml)
    result = build(folder)
    from rockroll.envhub.cache import LocalCache

    store = LocalCache().layers
    found = {}
    for layer in result.manifest.layers:
        with open(store.tarball(layer.digest), "rb") as raw, \
                zstandard.ZstdDecompressor().stream_reader(raw) as zr, tarfile.open(fileobj=zr, mode="r|") as tar:
            for m in tar:
                found[m.name] = m.mode
    assert "rootfs/opt/counter/su" in found  # the setup step ran and its file is in the layer
    assert not [n for n, mode in found.items() if mode & (stat.S_ISUID | stat.S_ISGID)]
