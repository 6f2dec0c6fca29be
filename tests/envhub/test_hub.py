"""Build, publish, pull and use envs against real stores: a folder, moto's S3 server on
127.0.0.1, and fsspec's memory store."""

from __future__ import annotations

import hashlib
import json
import importlib
import os
import subprocess
import sys
import warnings

import gymnasium
import pytest

from rockroll.envhub import (BlobCorrupted, BlobMissing, EnvManifest, EnvNotFound, HubStore,
                             StoreUnavailable, VersionConflict, YankedWarning, build, publish, pull, yank)
from rockroll.envhub import store as store_mod
from rockroll.envhub.cache import LocalCache, gc
from rockroll.envhub.manifest import LayerRef
from rockroll.envhub.pull import forget
from rockroll.sandbox import SandboxSpec, open_sandbox

from _pkgs import make_pkg


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    """The counter package, built once for the module."""
    folder = make_pkg(tmp_path_factory.mktemp("pkg") / "counter")
    return build(folder).manifest


def test_build_is_reproducible(pkg, counter):
    again = build(pkg(), rebuild=True).manifest
    assert again.layers == counter.layers
    assert again.snapshots == counter.snapshots  # session state sanitised: same digest too
    assert again.to_json() == counter.to_json()
    changed = build(pkg(data="one\n"), rebuild=True).manifest
    assert changed.layers != counter.layers


def test_publish_pull_round_trip(any_hub, counter, cache):
    store = HubStore(any_hub)
    result = publish(counter, store)
    assert result.created and len(result.uploaded) == len(counter.blobs())
    env = pull("counter@1", hub=any_hub, cache=cache)
    assert env.manifest == counter
    assert (env.layer_dirs[0] / "opt/counter/setup.txt").read_text() == "built-by-setup\n"
    assert env.tasks_file.read_text().startswith('{"task_id": "t1"')
    assert store.listing() == {"counter": {"1.0.0": False}}
    # layers land in the shared content-addressed store the sandboxes mount
    assert env.layer_dirs[0] == cache.layers.layer_root / counter.layers[-1].digest.split(":")[1]


def test_dedup_and_identical_republish(file_hub, pkg, counter):
    store = HubStore(file_hub)
    assert publish(counter, store).created
    again = publish(counter, store)
    assert (again.created, again.uploaded) == (False, [])
    # another version with the same files: its only layer is already there
    lean1 = build(pkg(version="1.0.1", snapshots=False)).manifest
    lean2 = build(pkg(version="1.0.2", snapshots=False)).manifest
    assert lean1.layers == lean2.layers
    publish(lean1, store)
    second = publish(lean2, store)
    assert second.created and second.uploaded == [] and second.skipped == [l.digest for l in lean2.layers]


def test_republish_with_different_content_is_refused(s3_hub, pkg, counter):
    store = HubStore(s3_hub)
    publish(counter, store)
    other = build(pkg(data="different\n")).manifest
    assert other.version == counter.version
    with pytest.raises(VersionConflict, match="counter@1.0.0 is already published.*layers"):
        publish(other, store)
    assert json.loads(store.read(store.manifest_path("counter", "1.0.0"))) == json.loads(counter.to_json())


def test_yank_hides_from_ranges_but_pins_still_pull(s3_hub, pkg, counter, cache):
    store = HubStore(s3_hub)
    publish(counter, store)
    newer = build(pkg(version="1.1.0")).manifest
    publish(newer, store)
    assert pull("counter@1", hub=s3_hub, cache=cache).manifest.version == "1.1.0"
    yank("counter@1.1.0", store, reason="broken tasks")
    assert store.listing()["counter"] == {"1.0.0": False, "1.1.0": True}
    assert pull("counter@1", hub=s3_hub, cache=cache).manifest.version == "1.0.0"
    assert pull("counter", hub=s3_hub, cache=cache).manifest.version == "1.0.0"
    with pytest.warns(YankedWarning, match="counter@1.1.0 was yanked"):
        env = pull("counter@1.1.0", hub=s3_hub, cache=cache)
    assert env.yanked and env.manifest.version == "1.1.0"
    with pytest.raises(EnvNotFound, match="exact version"):
        yank("counter@1", store)
    yank("counter@1.1.0", store, undo=True)
    assert pull("counter@1", hub=s3_hub, cache=cache).manifest.version == "1.1.0"


def test_offline_pull_from_cache(moto_s3, s3_hub, counter, cache):
    store = HubStore(s3_hub)
    publish(counter, store)
    pull("counter@1", hub=s3_hub, cache=cache)
    forget()  # a new process: nothing memoised
    moto_s3.stop()
    try:
        assert pull("counter@1.0.0", hub=s3_hub, cache=cache).manifest == counter  # no network at all
        forget()
        env = pull("counter@1", hub=s3_hub, cache=cache)  # range: falls back to the cached listing
        assert env.manifest.version == "1.0.0"
        with pytest.raises(StoreUnavailable):
            pull("never-pulled", hub=s3_hub, cache=cache)
    finally:
        moto_s3.start()


def test_sandbox_from_hub_image_and_snapshot(file_hub, counter):
    publish(counter, HubStore(file_hub))
    env = pull("counter@1.0.0", hub=file_hub)
    spec = SandboxSpec(image="hub:counter@1.0.0", memory_mb=256)
    with open_sandbox(spec) as sb:
        out = sb.run("cat /opt/counter/setup.txt /workspace/data.txt; ls /rockenv; test -e /workspace/state.txt")
        assert out.stdout.startswith("built-by-setup\nalpha\n") and "tasks.jsonl" in out.stdout
        assert out.exit_code == 1  # the snapshot's file is not in the image
        sb.run("rm /opt/counter/data.txt")
        assert not sb.exists("/opt/counter/data.txt")
    assert (env.layer_dirs[0] / "opt/counter/data.txt").exists()  # a sandbox never writes a layer
    with open_sandbox(spec, snapshot="hub:counter@1.0.0#warm") as sb:
        out = sb.run("pwd; echo $WARM; cat /workspace/state.txt")
        assert out.stdout == "/opt/counter\nyes\nwarmed\n"
    with pytest.raises(EnvNotFound, match="no snapshot 'cold'.*warm"):
        open_sandbox(spec, snapshot="hub:counter@1.0.0#cold")


def test_gymnasium_make_through_the_registry(s3_hub, counter):
    from rockroll.registry.hub import list_envs, register_hub

    publish(counter, HubStore(s3_hub))
    assert register_hub(s3_hub) == ["rock/counter-v1"]
    env = gymnasium.make("rock/counter-v1")
    try:
        obs, info = env.reset(seed=0)
        assert "alpha\nbeta\ngamma" in obs and info["tasks"] == 1
        assert env.step("3")[1] == 1.0
    finally:
        env.close()
    row = next(r for r in list_envs() if r.id == "rock/counter-v1")
    assert (row.source, row.version) == (s3_hub, "1.0.0") and "Count the lines" in row.description
    # a built-in's pointer to its docs names a module that help() can open
    swe = next(r for r in list_envs() if r.id == "rock/SWE-v0")
    module = swe.description.split("see help(", 1)[1].rstrip(").")
    assert "module docstring" not in swe.description and importlib.import_module(module).__doc__
    del gymnasium.registry["rock/counter-v1"]


def test_cli_envs_lists_the_default_hub(file_hub, counter):
    publish(counter, HubStore(file_hub))
    env = {**os.environ, "ROCKROLL_HUB": file_hub}
    cli = [sys.executable, "-m", "rockroll.cli"]
    out = subprocess.run([*cli, "envs"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("rock/counter-v1"))
    assert file_hub in line and "1.0.0" in line and "Count the lines" in line
    assert "rock/FrozenLake-v0" in out.stdout
    listed = subprocess.run([*cli, "hub", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.stdout.split() == ["counter", "1.0.0"]
    shown = subprocess.run([*cli, "hub", "show", "counter@1"], capture_output=True, text=True, env=env, timeout=60)
    assert json.loads(shown.stdout)["layers"][0]["digest"] == counter.layers[0].digest
    bad = subprocess.run([*cli, "hub", "pull", "counter@7"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "no release of counter matches '7'" in bad.stderr


# ----------------------------------------------------------------------------- faults


def test_server_dies_mid_upload_then_retry_completes(moto_s3, s3_hub, counter):
    store = HubStore(s3_hub)
    assert len(counter.blobs()) >= 2
    with pytest.raises(StoreUnavailable):
        publish(counter, store, on_blob=lambda layer: moto_s3.stop())
    moto_s3.start()
    assert store.listing() == {}  # no half-published version is visible
    assert store.has_blob(counter.blobs()[0]) and not store.has_blob(counter.blobs()[1])
    result = publish(counter, store)
    assert result.created and result.skipped == [counter.blobs()[0].digest]
    assert store.listing() == {"counter": {"1.0.0": False}}


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_damaged_blob_is_refused_then_refetched(moto_s3, s3_hub, counter, cache, damage):
    store = HubStore(s3_hub)
    publish(counter, store)
    layer = counter.layers[-1]
    key = store.blob_path(layer.digest).split("/", 1)[1]
    good = moto_s3.client().get_object(Bucket="rockroll-hub", Key=key)["Body"].read()
    bad = good[:-1] + bytes([good[-1] ^ 1]) if damage == "corrupt" else good[: len(good) // 2]
    moto_s3.client().put_object(Bucket="rockroll-hub", Key=key, Body=bad)
    with pytest.raises(BlobCorrupted, match="truncated" if damage == "truncate" else "corrupted") as info:
        pull("counter@1.0.0", hub=s3_hub, cache=cache)
    assert info.value.digest == layer.digest
    assert not cache.layers.tarball(layer.digest).exists() and not cache.has_layer(layer.digest)
    assert not list(cache.layers.tarball(layer.digest).parent.glob(".pull-*"))
    moto_s3.client().put_object(Bucket="rockroll-hub", Key=key, Body=good)  # repaired
    assert pull("counter@1.0.0", hub=s3_hub, cache=cache).manifest == counter


def test_manifest_pointing_at_a_missing_blob(s3_hub, counter, cache):
    store = HubStore(s3_hub)
    ghost = "sha256:" + "ab" * 32
    broken = EnvManifest(**{**counter.__dict__, "version": "9.0.0", "layers": (LayerRef(ghost, 10),)})
    store.create(store.manifest_path("counter", "9.0.0"), broken.to_json())  # hand-made, no blobs
    with pytest.raises(BlobMissing, match=ghost) as info:
        pull("counter@9.0.0", hub=s3_hub, cache=cache)
    assert info.value.digest == ghost


def test_concurrent_publishers_of_different_versions(s3_hub, pkg):
    manifests = [build(pkg(version=v, data=f"{v}\n")).manifest for v in ("2.0.0", "2.1.0", "2.2.0")]
    code = ("import sys; from rockroll.envhub import EnvManifest, HubStore, publish; "
            "m = EnvManifest.from_json(open(sys.argv[1], 'rb').read(), 'arg'); "
            "print(publish(m, HubStore(sys.argv[2])).created)")
    procs = []
    for m in manifests:
        path = LocalCache().build_file(m.name, m.version)
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(path), s3_hub], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=os.environ))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    store = HubStore(s3_hub)
    assert store.listing() == {"counter": {"2.0.0": False, "2.1.0": False, "2.2.0": False}}
    for m in manifests:
        assert EnvManifest.from_json(store.read(store.manifest_path("counter", m.version)), "x") == m
        assert all(store.has_blob(b) for b in m.blobs())


def test_gc_keeps_what_is_named_or_mounted(file_hub, pkg, counter):
    import rockroll.envhub.cache as cache_mod

    cache = LocalCache()
    store = HubStore(file_hub)
    publish(counter, store)
    orphan = build(pkg(version="3.0.0", data="orphan\n", snapshots=False)).manifest
    publish(orphan, store)
    pull("counter@3.0.0", hub=file_hub)
    layer = orphan.layers[-1].digest
    cache.build_file("counter", "3.0.0").unlink()
    user_snapshot = None
    old_grace, cache_mod.GC_GRACE_S = cache_mod.GC_GRACE_S, 0
    try:
        with open_sandbox(SandboxSpec(image="hub:counter@3.0.0", memory_mb=256)) as sb:
            user_snapshot = sb.snapshot()  # a user's snapshot: never the hub's to delete
            mounted = gc(cache, evict=("counter@3.0.0",))
        assert mounted.evicted == ["counter@3.0.0"]
        assert layer in mounted.in_use and cache.has_layer(layer)  # a live sandbox mounts it
        freed = gc(cache)
        assert layer in freed.removed and not cache.layers.tarball(layer).exists() and not cache.has_layer(layer)
        assert cache.layers.tarball(user_snapshot.digest).exists()
        assert not set(freed.removed) & {b.digest for b in counter.blobs()}  # named by cached manifests
    finally:
        cache_mod.GC_GRACE_S = old_grace


def test_another_user_makes_the_env_from_the_same_bucket(s3_hub, counter, tmp_path):
    """The issue's promise: one user publishes an env folder, another (a new process with an
    empty state home and cache) gymnasium.makes it from the same S3 bucket."""
    import subprocess
    import sys
    import textwrap

    publish(counter, HubStore(s3_hub))
    script = textwrap.dedent(f"""
        import gymnasium, rockroll
        from rockroll.registry.hub import register_hub
        assert register_hub({s3_hub!r}) == ["rock/counter-v1"]
        env = gymnasium.make("rock/counter-v1")
        obs, info = env.reset(seed=0)
        assert "alpha" in obs
        print("reward", env.step("3")[1])
        env.close()
    """)
    env = dict(os.environ, ROCKROLL_HOME=str(tmp_path / "another-user"))
    env.pop("ROCKROLL_HUB", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "reward 1.0"
    assert (tmp_path / "another-user" / "layers").is_dir()  # it pulled into its own store


def test_private_files_reach_the_host_side_but_never_a_sandbox(pkg, file_hub, cache):
    folder = pkg(name="secretive", snapshots=False)
    (folder / "answers").mkdir()
    (folder / "answers" / "key.txt").write_text("the-hidden-answer\n")
    toml = (folder / "rockenv.toml").read_text()
    (folder / "rockenv.toml").write_text('private = "answers"\n' + toml)
    manifest = build(folder).manifest
    assert manifest.private is not None and manifest.private in manifest.blobs()
    assert all(manifest.private.digest != layer.digest for layer in manifest.layers)
    publish(manifest, HubStore(file_hub))
    env = pull("secretive@1", hub=file_hub, cache=cache)
    assert (env.private_dir / "key.txt").read_text() == "the-hidden-answer\n"
    pull("secretive@1", hub=file_hub)  # into this process's home, where sandboxes find it
    with open_sandbox(SandboxSpec(image="hub:secretive@1.0.0")) as sb:
        found = sb.run("grep -rIl the-hidden-answer /rockenv /opt /workspace /tmp 2>/dev/null; echo end").stdout
    assert found == "end\n"
    # envs without private files keep manifests without the key (byte-identical to before)
    plain = build(pkg(name="plain", snapshots=False)).manifest
    assert plain.private is None and b'"private"' not in plain.to_json()
    assert EnvManifest.from_json(manifest.to_json(), "x") == manifest


def test_setup_steps_get_the_ca_bundle_the_host_names(pkg, file_hub, tmp_path, monkeypatch):
    """Behind a TLS-inspecting proxy only the host's own bundle makes `pip install` steps work:
    the steps see it under the same variables; the image keeps no copy."""
    from rockroll.envhub.build import CA_VARS

    ca = tmp_path / "host-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nrockroll-test-ca\n-----END CERTIFICATE-----\n")
    step = json.dumps('for v in PIP_CERT SSL_CERT_FILE REQUESTS_CA_BUNDLE; do echo "$v=${!v}"; done '
                      '> /opt/counter/vars.txt; cat "$PIP_CERT" > /opt/counter/seen.txt 2>/dev/null; true')

    def built(name: str) -> dict[str, str]:
        folder = pkg(name=name, snapshots=False)
        toml = (folder / "rockenv.toml").read_text().replace("setup = [", f"setup = [{step}, ", 1)
        (folder / "rockenv.toml").write_text(toml)
        publish(build(folder).manifest, HubStore(file_hub))
        pull(f"{name}@1", hub=file_hub)  # into this process's home, where sandboxes find it
        with open_sandbox(SandboxSpec(image=f"hub:{name}@1.0.0")) as sb:
            seen = sb.run("cat /opt/counter/vars.txt /opt/counter/seen.txt").stdout.splitlines()
            left = sb.run("grep -rIl rockroll-test-ca /opt /tmp /var/tmp /workspace /root 2>/dev/null | "
                          "grep -v /opt/counter/seen.txt; true").stdout
        assert left == ""  # no copy of the bundle left anywhere in the image
        return dict(line.split("=", 1) for line in seen if "=" in line) | {"ca": "\n".join(l for l in seen if "=" not in l)}

    for var in CA_VARS:
        monkeypatch.delenv(var, raising=False)
    assert built("untrusting") == {"PIP_CERT": "", "SSL_CERT_FILE": "", "REQUESTS_CA_BUNDLE": "", "ca": ""}
    monkeypatch.setenv("PIP_CERT", str(ca))
    got = built("trusting")
    assert got["ca"] == ca.read_text().strip()
    assert got["PIP_CERT"] == got["SSL_CERT_FILE"] == got["REQUESTS_CA_BUNDLE"] != str(ca)  # a copy inside


# --------------------------------------------------------------------------- large blobs on S3
def _blob(tmp_path, mib: float) -> tuple:
    data = os.urandom(int(mib * (1 << 20)))
    path = tmp_path / "blob.tar.zst"
    path.write_bytes(data)
    return path, data, LayerRef("sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def test_a_large_blob_moves_in_parallel_parts_hashed_on_the_way(moto_s3, s3_hub, tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "CHUNK", 5 << 20)  # S3's smallest part: 12 MiB is three parts
    store = HubStore(s3_hub)
    local, data, layer = _blob(tmp_path, 12)
    store.put_blob(local, layer)
    bucket, key = store._bucket_key(store.blob_path(layer.digest))
    head = moto_s3.client().head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] == layer.size and head["ETag"].strip('"').endswith("-3")  # multipart, 3 parts
    dest = tmp_path / "got"
    assert store.get_blob(layer, dest) == layer.digest and dest.read_bytes() == data  # ranged, in order
    # a truncated copy on the server comes back short, and its digest says so
    moto_s3.client().put_object(Bucket=bucket, Key=key, Body=data[: 7 << 20])
    assert store.get_blob(layer, dest) != layer.digest and dest.stat().st_size == 7 << 20


def test_a_large_blob_that_does_not_match_its_digest_is_never_published(moto_s3, s3_hub, tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "CHUNK", 5 << 20)
    store = HubStore(s3_hub)
    local, data, layer = _blob(tmp_path, 12)
    local.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # damaged in its last part
    with pytest.raises(BlobCorrupted, match="does not match"):
        store.put_blob(local, layer)
    bucket, key = store._bucket_key(store.blob_path(layer.digest))
    assert not store.has_blob(layer)
    assert moto_s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # aborted


@pytest.mark.parametrize("change, words", [
    (('python = "python"\n', ""), ['python = "<folder holding counter_env.py>"', "ModuleNotFoundError"]),
    (("counter_env:CounterEnv", "counter_env:CountrEnv"), ["'counter_env:CountrEnv'", "AttributeError"]),
    # issue #36: a class that does not take image= built and published, then failed at make time
    (("*, image: str, tasks_file", "*, tasks_file"), ["unexpected keyword argument 'image'", "must accept",
                                                       "image='hub:counter@8.0.0'", "docs/env-contract.md"]),
    (("kwargs = { max_turns = 3 }", "kwargs = { max_turns = 3, colour = 1 }"),
     ["unexpected keyword argument 'colour'", "[env] kwargs"]),
])
def test_build_refuses_an_entry_point_that_would_not_import(pkg, change, words):
    """A package whose entry point cannot be imported, or constructed with the arguments
    ``gymnasium.make`` will pass it, fails at build time saying what to set, not later with a
    bare ModuleNotFoundError or TypeError."""
    from rockroll.envhub.errors import BuildError

    folder = pkg(version="8.0.0")
    for path in (folder / "rockenv.toml", folder / "python" / "counter_env.py"):
        path.write_text(path.read_text().replace(*change))
    with pytest.raises(BuildError) as err:
        build(folder)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert not LocalCache().build_file("counter", "8.0.0").exists()  # nothing recorded as built


def test_a_package_without_env_is_a_base_image_not_an_env(tmp_path, pkg, file_hub):
    """No ``[env]``: an image only (#18). Other envs build on it; it is not listed as an env,
    and ``gymnasium.make`` of its id says what it is and which envs use it."""
    from rockroll.envhub.errors import ManifestError
    from rockroll.envhub.package import load_package
    from rockroll.registry.hub import list_envs, register_hub

    base = tmp_path / "plainbase"
    base.mkdir()
    (base / "rockenv.toml").write_text('name = "plainbase"\nversion = "1.0.0"\n'
                                       'setup = ["mkdir -p /opt/base && echo from-base > /opt/base/marker"]\n')
    publish(build(base).manifest, HubStore(file_hub))
    env_pkg = pkg(name="onbase")
    toml = env_pkg / "rockenv.toml"
    toml.write_text(toml.read_text().replace('base = "host"', 'base = "hub:plainbase@1"'))
    publish(build(env_pkg, hub=file_hub).manifest, HubStore(file_hub))

    assert register_hub(file_hub) == ["rock/onbase-v1"]
    listed = [r.id for r in list_envs()]
    assert "rock/onbase-v1" in listed and "rock/plainbase-v1" not in listed
    from rockroll.registry.gem_api import GemEnvs  # ROCK's GEM API lists (and makes) envs only

    assert "rock/onbase-v1" in GemEnvs().ids() and "rock/plainbase-v1" not in GemEnvs().ids()
    with pytest.raises(EnvNotFound) as err:
        gymnasium.make("rock/plainbase-v1")
    assert ("hub:plainbase@1.0.0 is a base image, not an env" in str(err.value)
            and "envs built on it: rock/onbase-v1" in str(err.value)), err.value
    env = gymnasium.make("rock/onbase-v1")  # the env on top works, on the base's files
    try:
        env.reset(seed=0)
        assert env.step("3")[1] == 1.0
        with open_sandbox(SandboxSpec(image=env.unwrapped.image)) as sb:
            assert sb.read_file("/opt/base/marker") == b"from-base\n"
    finally:
        env.close()
    out = subprocess.run([sys.executable, "-m", "rockroll.cli", "envs"], capture_output=True, text=True,
                         env={**os.environ, "ROCKROLL_HUB": file_hub}, timeout=120)
    assert "rock/onbase-v1" in out.stdout and "plainbase" not in out.stdout, out.stdout + out.stderr
    (base / "rockenv.toml").write_text('name = "plainbase"\nversion = "1.0.1"\n[env]\nkwargs = {}\n')
    with pytest.raises(ManifestError, match="leave \\[env\\] out for an image only"):
        load_package(base)  # an [env] table without its entry point is a mistake, not an image
    for env_id in ("rock/onbase-v1", "rock/plainbase-v1"):
        del gymnasium.registry[env_id]
